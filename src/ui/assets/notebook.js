// notebook.js - a session as a notebook: cells (cell.js) run through the streamed execute
// route, kept with the session (doc.js) so that a reload or another tab shows them again and
// follows a cell still running (GET .../executions/{id}/events?after=N); a keyboard model as
// Jupyter's (command mode and edit mode, below); queued runs, Run all, Stop on the running
// cell; export and import as .ipynb; the session's controls and its files.
//
// What it expects of the server, and how it does without (docs/API.md, "The web console"):
// an execute stream that begins {"type":"start","execution_id","seq":0} and numbers its
// events ("seq"), "on_disconnect":"continue" honoured, executions queued FIFO. Without the
// start line it sends one cell at a time; a 400 naming on_disconnect is sent again without
// it, and the page then warns before a reload would interrupt a running cell.
import {api, ApiError, broadcast, sessionPath, stream} from './api.js';
import {announce, append, clear, duration, h, saveBlob, toast} from './dom.js';
import {Cell} from './cell.js';
import {NotebookStore, emptyDoc, fromIpynb, toIpynb} from './doc.js';
import {filePanel} from './files.js';

const notebooks = new Map();
const peaks = new Map(); // session id -> memory peak of its last cell, in KiB
const HISTORY_MAX = 200;
const SAVE_DELAY_MS = 800;
const IMPORT_MAX = 32 << 20;
const DOUBLE_KEY_MS = 1000;
// What the server showed it does, learnt from the first run of this page: null not known
// yet, then true or false. Shared by the page's notebooks: one server answers them all.
const caps = {queue: null, onDisconnect: null};
// The page is going: each notebook is kept as it is (a running cell as running, to be
// followed again), and the streams the browser then cuts are not taken for failed runs.
let leaving = false;

export function lastPeakKb(id) { return peaks.get(id); }

function historyKey(id) { return 'runcell.history.' + id; }
function loadHistory(id) {
  try { return JSON.parse(sessionStorage.getItem(historyKey(id))) || []; } catch (e) { return []; }
}
function saveHistory(id, list) {
  try { sessionStorage.setItem(historyKey(id), JSON.stringify(list.slice(-HISTORY_MAX))); }
  catch (e) { /* storage full: the history is a convenience */ }
}

// Command mode: the keys of a selected cell (its element has the focus), as Jupyter's.
// "d d" and "i i" are the same key twice within DOUBLE_KEY_MS.
const COMMAND_KEYS = {
  ArrowUp: (nb) => nb.move(-1), k: (nb) => nb.move(-1),
  ArrowDown: (nb) => nb.move(1), j: (nb) => nb.move(1),
  Home: (nb) => nb.select(nb.cells[0]), End: (nb) => nb.select(nb.cells[nb.cells.length - 1]),
  Enter: (nb, c) => nb.edit(c),
  'Shift+Enter': (nb, c) => nb.runKey(c, 'next'),
  'Ctrl+Enter': (nb, c) => nb.runKey(c, 'stay'),
  'Alt+Enter': (nb, c) => nb.runKey(c, 'insert'),
  a: (nb, c) => nb.select(nb.insert('code', c, 'above')),
  b: (nb, c) => nb.select(nb.insert('code', c, 'below')),
  m: (nb, c) => nb.convert(c, 'markdown'),
  y: (nb, c) => nb.convert(c, 'code'),
  'd d': (nb, c) => nb.deleteCell(c),
  z: (nb) => nb.undoDelete(),
  'i i': (nb) => nb.interrupt(),
  h: (nb) => nb.toggleHelp(),
};
const HELP = [
  ['Enter', 'edit the selected cell'], ['Esc', 'leave the editor (then Tab moves on)'],
  ['Shift+Enter', 'run, then the next cell'], ['Ctrl+Enter', 'run in place'],
  ['Alt+Enter', 'run, then a new cell below'], ['\u2191 \u2193 or k j', 'select a cell'],
  ['a / b', 'new cell above / below'], ['m / y', 'markdown / code'],
  ['d d', 'delete the cell'], ['z', 'bring back the cell deleted last'],
  ['i i', 'interrupt the running cell'], ['h', 'show or hide these keys'],
];

function keyName(ev) {
  return (ev.ctrlKey || ev.metaKey ? 'Ctrl+' : '') + (ev.altKey ? 'Alt+' : '') +
         (ev.shiftKey && ev.key.length > 1 ? 'Shift+' : '') + ev.key;
}

// The hook for undoing a cell's run (the session rolled back to before it), where the
// server offers it: a session whose description has "undo": true gets an "Undo this run" on
// its cells, which asks POST /v1/sessions/{id}/undo {"before": N}.
const UNDO = {
  offered: (info) => !!(info && info.undo),
  request: (sid, count) => api('POST', sessionPath(sid, '/undo'), {before: count}),
};

class Notebook {
  constructor(id) {
    this.id = id;
    this.info = null;
    this.language = 'python';
    this.cells = [];
    this.selected = null;
    this.pending = [];   // cells queued or running, in the order they were asked to run
    this.caps = caps;
    this.order = 0;
    this.deleted = [];   // for z
    this.history = loadHistory(id);
    this.store = new NotebookStore(id);
    this.loaded = false;
    this.lastKey = null;
    this.cellsEl = h('div', {class: 'cells', id: 'cells'});
    this.cellsEl.addEventListener('keydown', (ev) => this.onKey(ev));
    this.cellsEl.addEventListener('focusin', (ev) => {
      const c = ev.target.closest && ev.target.closest('.cell');
      if (c && c._cell && c._cell !== this.selected) this.select(c._cell, false);
    });
    this.headEl = h('div', {class: 'nb-head'}, h('h1', {class: 'nb-title'}, 'Session ', h('code', {}, id)));
    this.statusEl = h('span', {class: 'badge', id: 'nb-status'}, '...');
    this.countEl = h('span', {id: 'nb-count'});
    this.savedEl = h('span', {id: 'nb-saved', class: 'muted'});
    this.banner = h('div', {class: 'banner', id: 'nb-banner', role: 'alert', hidden: true});
    this.help = h('div', {class: 'card keys-help', id: 'keys-help', hidden: true},
      h('h2', {}, 'Keyboard'),
      h('dl', {}, HELP.map(([k, v]) => [h('dt', {}, h('kbd', {}, k)), h('dd', {}, v)])));
    this.files = filePanel(id);
    this.importInput = h('input', {type: 'file', id: 'import-input', accept: '.ipynb,application/json',
                                   hidden: true, 'aria-label': 'Import a .ipynb notebook'});
    this.importInput.addEventListener('change', () => this.importFile());
    this.el = h('section', {id: 'notebook', 'data-session': id},
      h('div', {class: 'nb-main'},
        h('div', {class: 'card nb-bar'}, this.headEl,
          h('div', {class: 'meta', id: 'nb-meta'}, this.statusEl, this.countEl, this.savedEl),
          this.controls()),
        this.banner, this.help,
        h('p', {class: 'sr-only', id: 'nb-keys-hint'},
          'Command mode: Enter edits the cell, Shift+Enter runs it, arrows move between ' +
          'cells, h lists the keys.'),
        h('p', {class: 'sr-only', id: 'nb-edit-hint'},
          'Edit mode: Shift+Enter runs the cell, Esc leaves the editor (Tab then moves on).'),
        this.cellsEl,
        h('p', {class: 'add-cells'},
          h('button', {type: 'button', id: 'add-cell',
                       onclick: () => this.edit(this.insert('code', this.cells[this.cells.length - 1], 'below'))},
            '+ Code'), ' ',
          h('button', {type: 'button', id: 'add-markdown',
                       onclick: () => this.edit(this.insert('markdown', this.cells[this.cells.length - 1], 'below'))},
            '+ Markdown'))),
      h('aside', {class: 'nb-side', 'aria-label': 'Files of the session'}, this.files.el),
      this.importInput);
    this.refreshInfo().then(() => this.load());
  }

  controls() {
    const act = (label, id, fn, title) => h('button', {type: 'button', id, onclick: fn, title}, label);
    return h('div', {class: 'nb-controls', role: 'toolbar', 'aria-label': 'Notebook'},
      act('Run all', 'run-all', () => this.runAll(), 'Run every code cell, top to bottom'),
      act('Interrupt', 'interrupt', () => this.interrupt(), 'Interrupt the running cell (i, i)'),
      act('Restart', 'restart', () => this.restart(), 'A fresh interpreter on the same files'),
      act('Export .ipynb', 'export', () => this.exportIpynb()),
      act('Import .ipynb', 'import', () => this.importInput.click()),
      h('button', {type: 'button', id: 'keys', 'aria-expanded': 'false', 'aria-controls': 'keys-help',
                   title: 'The keyboard shortcuts (h)', onclick: () => this.toggleHelp()}, 'Keys'),
      act('Close', 'close-session', () => this.close(false), 'End the session; nothing is kept'),
      act('Close with checkpoint', 'checkpoint-session', () => this.close(true),
          'End the session, keeping its files and variables to resume later'),
      h('a', {href: '#/sessions', class: 'button'}, 'All sessions'));
  }

  // ---- the document ----

  async load() {
    let doc = null;
    try { doc = await this.store.load(); } catch (e) { doc = null; }
    let fromStored = null;
    if (!doc) {
      // A session resumed from a stored one opens with that one's notebook.
      fromStored = sessionStorage.getItem('runcell.resumed.' + this.id);
      if (fromStored) doc = await this.store.loadFrom(fromStored).catch(() => null);
    }
    if (doc) {
      this.order = doc.cells.reduce((m, c) => Math.max(m, (c.execution && c.execution.order) || 0), 0);
      for (const d of doc.cells) {
        if (fromStored && d.execution) d.execution = null;
        this.cellsEl.append(this.adopt(new Cell(this, d)).el);
      }
    }
    if (!this.cells.length) this.cellsEl.append(this.adopt(new Cell(this, {cell_type: 'code'})).el);
    this.relabel();
    this.loaded = true;
    this.el.dataset.loaded = 'true';
    // A new notebook opens in its first cell's editor, a kept one on its last cell (command
    // mode): where a keyboard user goes on.
    if (!doc) this.edit(this.cells[0]);
    else this.select(this.cells[this.cells.length - 1], document.activeElement === document.body);
    this.reattach();
    this.showSaved();
    if (fromStored) this.changed();
  }

  adopt(cell) { this.cells.push(cell); return cell; }

  toDoc() {
    const d = emptyDoc(this.id, this.language);
    d.cells = this.orderedCells().map((c) => c.toDoc());
    return d;
  }

  orderedCells() {
    return [...this.cellsEl.children].map((el) => el._cell).filter(Boolean);
  }

  // Something changed: the document is saved soon (one save at a time, the last state).
  changed() {
    if (!this.loaded) return;
    if (this.saveTimer) return;
    this.saveTimer = setTimeout(() => this.save(), SAVE_DELAY_MS);
  }

  async save() {
    this.saveTimer = null;
    if (this.saving) { this.changed(); return; }
    this.saving = true;
    try {
      const r = await this.store.save(this.toDoc());
      this.showSaved(r);
    } finally {
      this.saving = false;
    }
  }

  showSaved(r) {
    const where = this.store.server === true ? 'kept with the session'
                : this.store.server === false ? 'kept in this browser (the server keeps no notebooks)'
                : '';
    this.savedEl.textContent = r && r.error && this.store.server !== false
      ? 'not saved on the server (' + r.error.message + '); kept in this browser' : where;
  }

  saveNow() {
    clearTimeout(this.saveTimer);
    this.saveTimer = null;
    if (this.loaded) this.store.saveLocalNow(this.toDoc());
  }

  // ---- cells and selection ----

  relabel() {
    this.cells = this.orderedCells();
    this.cells.forEach((c, i) => c.label(i + 1));
  }

  insert(type, near, where) {
    const cell = new Cell(this, {cell_type: type, language: this.language});
    this.cells.push(cell);
    if (near && where === 'above') this.cellsEl.insertBefore(cell.el, near.el);
    else if (near) near.el.after(cell.el);
    else this.cellsEl.append(cell.el);
    this.relabel();
    this.changed();
    return cell;
  }

  select(cell, focus = true) {
    if (!cell) return;
    for (const c of this.cells) {
      c.el.classList.toggle('selected', c === cell);
      c.el.tabIndex = c === cell ? 0 : -1;
    }
    this.selected = cell;
    if (focus) {
      cell.el.focus();
      cell.el.scrollIntoView({block: 'nearest'});
    }
  }

  move(step) {
    const i = this.cells.indexOf(this.selected);
    const next = this.cells[Math.min(Math.max(i + step, 0), this.cells.length - 1)];
    this.select(next);
  }

  // Edit mode on cell: its editor has the focus (a markdown cell shows its source).
  edit(cell) {
    if (!cell) return;
    this.select(cell, false);
    if (cell.type === 'markdown') cell.showRendered(false);
    cell.editor.focus();
  }

  entered(cell) {
    if (this.selected !== cell) this.select(cell, false);
    this.el.dataset.mode = 'edit';
  }

  // Command mode on cell (Esc in its editor).
  command(cell) {
    if (cell.type === 'markdown') cell.showRendered(true);
    this.el.dataset.mode = 'command';
    this.select(cell);
  }

  onKey(ev) {
    const cell = ev.target && ev.target._cell;
    if (!cell) return; // keys in an editor, a button or a select are theirs
    const name = keyName(ev);
    const now = Date.now();
    const twice = this.lastKey && this.lastKey.name === name && now - this.lastKey.at < DOUBLE_KEY_MS;
    let fn = COMMAND_KEYS[name];
    if (!fn && COMMAND_KEYS[name + ' ' + name]) {
      if (twice) { fn = COMMAND_KEYS[name + ' ' + name]; this.lastKey = null; }
      else { this.lastKey = {name, at: now}; ev.preventDefault(); return; }
    } else {
      this.lastKey = null;
    }
    if (!fn) return;
    ev.preventDefault();
    this.el.dataset.mode = 'command';
    fn(this, cell);
  }

  convert(cell, type) {
    if (cell.type === type) return;
    if (this.pending.includes(cell)) { toast('The cell is queued or running.', 'error'); return; }
    cell.setType(type);
    if (type === 'markdown') cell.showRendered(true);
    this.select(cell);
    this.changed();
  }

  deleteCell(cell) {
    if (this.pending.includes(cell)) { toast('Stop the cell before deleting it.', 'error'); return; }
    const i = this.cells.indexOf(cell);
    this.deleted.push({doc: cell.toDoc(), after: this.cells[i - 1] || null});
    cell.el.remove();
    this.relabel();
    if (!this.cells.length) this.insert('code', null);
    this.select(this.cells[Math.min(i, this.cells.length - 1)]);
    announce('Cell ' + (i + 1) + ' deleted; z brings it back');
    this.changed();
  }

  undoDelete() {
    const last = this.deleted.pop();
    if (!last) return;
    const cell = new Cell(this, last.doc);
    this.cells.push(cell);
    if (last.after && last.after.el.isConnected) last.after.el.after(cell.el);
    else this.cellsEl.prepend(cell.el);
    this.relabel();
    this.select(cell);
    this.changed();
  }

  toggleHelp() {
    this.help.hidden = !this.help.hidden;
    document.getElementById('keys').setAttribute('aria-expanded', String(!this.help.hidden));
  }

  // ---- runs ----

  // Shift+Enter (how 'next'), Ctrl+Enter ('stay'), Alt+Enter ('insert'), from either mode.
  runKey(cell, how) {
    const editing = cell.editor.hasFocus();
    this.run(cell);
    let next = cell;
    if (how === 'insert' || (how === 'next' && cell === this.cells[this.cells.length - 1]))
      next = this.insert('code', cell, 'below');
    else if (how === 'next') next = this.cells[this.cells.indexOf(cell) + 1];
    if (editing && next !== cell) this.edit(next);
    else this.select(next);
  }

  runButton(cell) {
    if (this.pending.includes(cell)) this.stop(cell);
    else this.run(cell);
  }

  run(cell) {
    if (cell.type === 'markdown') { cell.showRendered(true); this.changed(); return; }
    if (this.pending.includes(cell)) {
      toast('Cell ' + cell.number + ' is already ' + cell.el.dataset.status + '.');
      return;
    }
    const code = cell.source();
    if (code.trim() && this.history[this.history.length - 1] !== code) {
      this.history.push(code);
      saveHistory(this.id, this.history);
    }
    cell.beginRun();
    cell.exec = {id: null, seq: 0, state: 'queued', order: ++this.order};
    cell.code = code;
    this.pending.push(cell);
    this.updateRunStates();
    if (this.pending.length > 1) announce('Cell ' + cell.number + ' queued');
    this.pump();
    this.changed();
  }

  runAll() {
    for (const c of this.cells) {
      if (c.type === 'markdown') c.showRendered(true);
      else if (!this.pending.includes(c) && c.source().trim()) this.run(c);
    }
  }

  // The first cell asked is running, the others queued behind it (FIFO, as the server).
  updateRunStates() {
    this.pending.forEach((c, i) => {
      const state = i === 0 ? 'running' : 'queued';
      if (c.exec) c.exec.state = state;
      if (c.el.dataset.status !== state) c.setRunState(state);
    });
    this.showStatus();
  }

  // Sends what may be sent: every queued cell when the server queues executions, else one
  // at a time. Each is sent once the one before it is in the server's queue (its "start"
  // came): the server runs them in the order they arrive, and requests sent at once on
  // several connections arrive in any order.
  pump() {
    for (const cell of this.pending) {
      if (cell.inflight) continue;
      if (this.pending.some((c) => c.inflight && (this.caps.queue !== true || !c.submitted))) return;
      this.send(cell);
    }
  }

  async send(cell) {
    cell.inflight = true;
    cell.submitted = false;
    cell.abort = new AbortController();
    const body = {code: cell.code, language: cell.language};
    // The run goes on if this page goes, and a failure drops what this session queued
    // behind it (Jupyter's stop_on_error), where the server takes these.
    if (this.caps.onDisconnect !== false) Object.assign(body, {on_disconnect: 'continue',
                                                               stop_on_error: true});
    let last;
    try {
      last = await stream(sessionPath(this.id, '/execute'), body, (ev) => this.onEvent(cell, ev),
                          cell.abort.signal);
    } catch (e) {
      cell.inflight = false;
      if (e.name === 'AbortError' || leaving) return;
      if (e instanceof ApiError && e.status === 400 && /on_disconnect|stop_on_error/.test(e.message) &&
          this.caps.onDisconnect !== false) {
        // A server without durable executions: this page stays to see the cell through.
        this.caps.onDisconnect = false;
        this.el.dataset.durable = 'false';
        return this.send(cell);
      }
      if (e instanceof ApiError && e.status === 409 && e.code === 'busy') {
        // Another client runs a cell here and the server does not queue: wait for it.
        cell.notice = 'waiting: the session runs a cell of another client';
        clear(cell.status).append(h('span', {class: 'badge busy'}, 'queued'), ' ',
                                  h('span', {class: 'message'}, cell.notice));
        setTimeout(() => this.pump(), 1000);
        return;
      }
      return this.done(cell, null, e);
    }
    cell.inflight = false;
    if (leaving) return;
    if (last && last.type === 'done') return this.done(cell, last);
    // The stream ended without its record (the connection broke): follow the execution
    // again where it was, if the server keeps it.
    if (cell.exec && cell.exec.id) return this.follow(cell);
    this.done(cell, null, new Error('the stream ended without its record'));
  }

  onEvent(cell, ev) {
    if (!ev || typeof ev !== 'object') return;
    if (ev.type === 'start') {
      cell.exec.id = String(ev.execution_id || '');
      cell.submitted = true;
      if (this.caps.queue !== true) {
        this.caps.queue = true;
        if (this.caps.onDisconnect === null) this.caps.onDisconnect = true;
      }
      queueMicrotask(() => this.pump());
    }
    if (ev.type === 'start') this.el.dataset.durable = String(this.caps.onDisconnect === true);
    if (typeof ev.seq === 'number' && cell.exec) cell.exec.seq = ev.seq;
    if (ev.type !== 'done') cell.onEvent(ev);
    this.changed();
  }

  // Re-attaches to a cell's execution from the event after the last one it has.
  async follow(cell) {
    cell.inflight = true;
    cell.abort = new AbortController();
    const path = sessionPath(this.id, '/executions/' + encodeURIComponent(cell.exec.id) +
                             '/events?after=' + (cell.exec.seq || 0));
    let last;
    try {
      last = await stream(path, undefined, (ev) => this.onEvent(cell, ev), cell.abort.signal);
    } catch (e) {
      cell.inflight = false;
      if (e.name === 'AbortError' || leaving) return;
      if (e instanceof ApiError && e.status === 404)
        return this.lost(cell, /no such route/.test(e.message)
          ? 'the page was left while it ran, and this server keeps no executions to follow again'
          : 'the server no longer has this execution (' + e.message + ')');
      return this.lost(cell, 'cannot follow it again: ' + e.message);
    }
    cell.inflight = false;
    if (last && last.type === 'done') return this.done(cell, last);
    this.lost(cell, 'its events ended without its record');
  }

  // Cells the document says were queued or running when it was saved.
  reattach() {
    const waiting = this.cells.filter((c) => c.exec && (c.exec.state === 'running' ||
                                                        c.exec.state === 'queued'))
                              .sort((a, b) => a.exec.order - b.exec.order);
    for (const c of waiting) {
      if (!c.exec.id) {
        // Sent by a page that is gone to a server that keeps no executions (it interrupts a
        // cell whose page leaves), or never sent.
        const ran = c.exec.state === 'running';
        c.exec.state = 'lost';
        if (ran) c.notRun('lost', 'the page was left while it ran, and this server interrupts ' +
                                  'a cell whose page goes away (its output up to then is above)', '[?]');
        else c.notRun('not run', 'the page was left before its turn came');
        continue;
      }
      this.pending.push(c);
      c.code = c.source();
      this.follow(c);
    }
    if (waiting.length) { this.updateRunStates(); this.changed(); }
  }

  lost(cell, why) {
    this.pending = this.pending.filter((c) => c !== cell);
    cell.inflight = false;
    if (cell.exec) cell.exec.state = 'lost';
    cell.notRun('lost', why, '[?]');
    this.afterRun(cell, false);
  }

  done(cell, last, err) {
    this.pending = this.pending.filter((c) => c !== cell);
    cell.inflight = false;
    if (cell.exec) cell.exec.state = 'done';
    let ok = false;
    if (last && last.error && (last.error.code === 'aborted' || last.error.code === 'cancelled')) {
      // Dropped from the server's queue: behind a cell that failed, or taken out.
      cell.notRun('cancelled', last.error.code === 'aborted' ? 'not run: an earlier cell failed'
                                                             : 'taken out of the queue');
    } else if (err || (last && last.error)) {
      const msg = err ? err.message : last.error.message;
      cell.notRun('failed', msg, '[!]');
      announce('Cell ' + cell.number + ' was not run: ' + msg);
    } else {
      const rec = last.record || {};
      cell.finish(rec);
      ok = rec.status === 'ok';
      if (rec.usage && rec.usage.memory_peak_kb) peaks.set(this.id, rec.usage.memory_peak_kb);
      const f = rec.files || {};
      if ((f.created || []).length || (f.modified || []).length || (f.deleted || []).length)
        this.files.refresh();
      const err0 = cell.items.find((i) => i.kind === 'error');
      announce('Cell ' + cell.number + ' finished: ' + rec.status +
               (err0 ? ', ' + (err0.error.name || 'error') : '') +
               (rec.usage ? ' in ' + Math.round(rec.usage.wall_ms) + ' ms' : ''));
      if (UNDO.offered(this.info) && Number.isInteger(rec.execution_count)) {
        cell.undoButton.hidden = false;
        cell.status.append(cell.undoButton);
      }
    }
    this.afterRun(cell, ok);
  }

  afterRun(cell, ok) {
    // As Jupyter: a cell that fails takes the cells queued behind it out of the queue. Those
    // this page holds, it drops; those the server queued, the server drops (stop_on_error).
    if (!ok) for (const c of [...this.pending]) if (!c.inflight) this.unqueue(c, 'not run: an earlier cell failed');
    this.updateRunStates();
    this.pump();
    this.refreshInfo();
    // A finished cell is kept at once: another tab, or this one reloaded, shows it.
    clearTimeout(this.saveTimer);
    this.saveTimer = null;
    this.save();
  }

  // Takes a queued cell out of the queue (one this page holds, or one the server queued,
  // which it is asked to drop: DELETE /v1/sessions/{id}/executions/{eid}).
  async unqueue(cell, why) {
    if (!cell.inflight) {
      this.pending = this.pending.filter((c) => c !== cell);
      if (cell.exec) cell.exec.state = 'cancelled';
      cell.notRun('cancelled', why);
      this.updateRunStates();
      this.changed();
      return;
    }
    if (!cell.exec || !cell.exec.id) return;
    try {
      await api('DELETE', sessionPath(this.id, '/executions/' + encodeURIComponent(cell.exec.id)));
      cell.abort.abort();
      this.pending = this.pending.filter((c) => c !== cell);
      cell.inflight = false;
      cell.exec.state = 'cancelled';
      cell.notRun('cancelled', why);
      this.updateRunStates();
      this.changed();
    } catch (e) {
      toast('Cell ' + cell.number + ' stays queued: the server cannot take it back (' +
            e.message + ')', 'error');
    }
  }

  stop(cell) {
    if (this.pending[0] === cell) this.interrupt();
    else this.unqueue(cell, 'taken out of the queue');
  }

  showStatus() {
    const running = this.pending.length;
    let text, cls;
    if (running) {
      text = 'running' + (running > 1 ? ', ' + (running - 1) + ' queued' : '');
      cls = 'busy';
    } else if (this.info && this.info.status === 'busy') {
      text = 'running (another client)';
      cls = 'busy';
    } else {
      text = this.info ? 'idle' : '...';
      cls = 'idle';
    }
    this.statusEl.textContent = text;
    this.statusEl.className = 'badge ' + cls;
    this.el.dataset.running = String(running);
  }

  // ---- the session ----

  async refreshInfo() {
    try {
      this.info = await api('GET', sessionPath(this.id));
      this.banner.hidden = true;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) this.ended(e);
      return;
    }
    const s = this.info;
    this.language = s.language || 'python';
    clear(this.headEl).append(
      h('h1', {class: 'nb-title'}, 'Session ', h('code', {}, s.id)),
      h('div', {class: 'meta'},
        h('span', {}, s.language + (s.python_version ? ' ' + s.python_version : '')),
        h('span', {}, 'memory ' + s.limits.memory_mb + ' MB, ' + s.limits.cpus + ' CPU, ' +
                      'timeout ' + s.timeout_s + ' s'),
        h('span', {}, 'network: ' + (s.network && s.network.mode === 'allowlist'
                                     ? s.network.allow.join(', ') : 'none')),
        s.network && s.network.secrets && s.network.secrets.length
          ? h('span', {class: 'nb-secrets'}, 'secrets: ' + s.network.secrets.map(
              (x) => x.host + ' (' + (x.header || 'basic auth') + ')').join(', '))
          : null,
        s.limits_degraded ? h('span', {class: 'warn'}, 'limits degraded') : null));
    this.countEl.textContent = 'executions: ' + s.execution_count;
    this.showStatus();
  }

  // The session is gone: said in plain words, with what can be done.
  ended(e) {
    const stored = e.body && e.body.session;
    const resumable = e.body && e.body.resumable;
    const expired = e.code === 'expired';
    const why = expired ? 'It was idle longer than its idle timeout' +
                          (stored && stored.options && stored.options.idle_timeout_s
                            ? ' (' + duration(stored.options.idle_timeout_s * 1000) + ')' : '') +
                          ', so it was stopped.'
              : stored && stored.state === 'closed' ? 'It was closed.'
              : stored && stored.state === 'stopped' ? 'The server stopped while it ran.'
              : 'The server does not know it (it was closed, or the server was restarted).';
    const kept = resumable ? 'Its files' + (stored && stored.variables_stored ? ' and variables' : '') +
                             ' were kept: resume it to go on where it was (a new session with them).'
                           : 'Nothing of it was kept.';
    append(clear(this.banner), [h('strong', {}, 'This session has ended. '), why + ' ' + kept + ' ',
      resumable ? h('button', {type: 'button', id: 'banner-resume', onclick: () => resume(this.id)},
                    'Resume it') : null, ' ',
      h('a', {href: '#/sessions'}, 'All sessions')]);
    this.banner.hidden = false;
  }

  async interrupt() {
    try {
      const r = await api('POST', sessionPath(this.id, '/interrupt'));
      toast(r.interrupted ? 'Interrupted the running cell' : 'Nothing was running');
    } catch (e) {
      toast('Cannot interrupt: ' + e.message, 'error');
    }
  }

  async restart() {
    if (this.pending.length) {
      toast('A cell is running; interrupt it first.', 'error');
      return;
    }
    try {
      await api('POST', sessionPath(this.id, '/restart'));
      toast('Restarted: a fresh interpreter on the same files');
      this.el.dataset.restarts = String(Number(this.el.dataset.restarts || 0) + 1);
      for (const c of this.cells) if (c.type === 'code') c.prompt.textContent = '[ ]';
    } catch (e) {
      toast('Cannot restart: ' + e.message, 'error');
    }
    this.refreshInfo();
  }

  async undoRun(cell) {
    try {
      await UNDO.request(this.id, cell.countValue);
      toast('The session is back to before cell ' + cell.number + ' ran');
      cell.undoButton.hidden = true;
    } catch (e) {
      toast('Cannot undo: ' + e.message, 'error');
    }
    this.refreshInfo();
  }

  async close(checkpoint) {
    try {
      this.saveNow();
      await this.save();
      await api('DELETE', sessionPath(this.id) + (checkpoint ? '?checkpoint=true' : ''));
      toast(checkpoint ? 'Closed with a checkpoint: resume it from the stored sessions'
                       : 'Closed the session');
      notebooks.delete(this.id);
      broadcast({type: 'sessions'});
      location.hash = '#/sessions';
    } catch (e) {
      toast('Cannot close: ' + e.message, 'error');
    }
  }

  // ---- .ipynb ----

  exportIpynb() {
    const nb = toIpynb(this.toDoc());
    saveBlob('runcell-' + this.id + '.ipynb', new Blob([JSON.stringify(nb, null, 1) + '\n']));
    toast('Exported ' + nb.cells.length + ' cells as .ipynb');
  }

  async importFile() {
    const file = this.importInput.files[0];
    this.importInput.value = '';
    if (!file) return;
    try {
      if (file.size > IMPORT_MAX) throw new Error('it is larger than ' + (IMPORT_MAX >> 20) + ' MiB');
      const cells = fromIpynb(await file.text(), this.language);
      const blank = this.cells.length === 1 && !this.cells[0].source().trim() &&
                    !this.cells[0].items.length ? this.cells[0] : null;
      for (const d of cells) this.cellsEl.append(new Cell(this, d).el);
      if (blank) blank.el.remove();
      this.relabel();
      this.select(this.cells[this.cells.length - cells.length] || this.cells[0]);
      this.changed();
      toast('Imported ' + cells.length + ' cells from ' + file.name + ' (not run)');
    } catch (e) {
      toast('Cannot import ' + file.name + ': ' + e.message, 'error');
    }
  }

  // Whether leaving the page now would interrupt a cell (a server without durable
  // executions interrupts the cell of a stream that closes).
  wouldLoseRun() {
    return this.pending.length > 0 && this.caps.onDisconnect !== true;
  }
}

// Resumes stored session sid: a new session with its files (and variables); the notebook
// of the stored one comes with it.
export async function resume(sid) {
  try {
    const n = await api('POST', '/v1/sessions', {resume_from: sid});
    sessionStorage.setItem('runcell.resumed.' + n.id, sid);
    toast('Resumed ' + sid + ' as ' + n.id);
    broadcast({type: 'sessions'});
    location.hash = '#/s/' + encodeURIComponent(n.id);
  } catch (e) {
    toast('Cannot resume ' + sid + ': ' + e.message, 'error');
  }
}

window.addEventListener('beforeunload', (ev) => {
  for (const nb of notebooks.values()) {
    if (nb.wouldLoseRun()) {
      ev.preventDefault();
      ev.returnValue = '';
      return;
    }
  }
});
window.addEventListener('pagehide', () => {
  leaving = true;
  for (const nb of notebooks.values()) nb.saveNow();
});
window.addEventListener('pageshow', () => { leaving = false; });

export function notebookView(id) {
  let nb = notebooks.get(id);
  if (!nb) { nb = new Notebook(id); notebooks.set(id, nb); }
  else {
    nb.refreshInfo();
    nb.files.refresh();
    // CodeMirror measures its lines when shown: after being away it has to again.
    requestAnimationFrame(() => nb.cells.forEach((c) => c.editor.refresh()));
  }
  // The session's figures while the page is seen; a cell's end refreshes them too.
  const timer = setInterval(() => {
    if (!document.hidden && !nb.pending.length) nb.refreshInfo();
  }, 5000);
  return {el: nb.el, stop() { clearInterval(timer); nb.saveNow(); }};
}
