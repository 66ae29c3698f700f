// notebook.js - a session as a notebook: cells with an editor, run through the streamed
// execute route (stdout and stderr as they come, then results, the error, the record), the
// session's controls (interrupt, restart, close) and its files. A notebook stays in memory
// while the page lives, so going to another view and back keeps its cells.
import {api, ApiError, stream} from './api.js';
import {bytes, clear, h, stripAnsi, toast} from './dom.js';
import {createEditor} from './editor.js';
import {renderBundle, renderError} from './render.js';
import {filePanel} from './files.js';

const notebooks = new Map();
const peaks = new Map(); // session id -> memory peak of its last cell, in KiB
const OUTPUT_CAP = 2 << 20; // characters of stream output a cell shows; the rest is counted
const HISTORY_MAX = 200;

export function lastPeakKb(id) { return peaks.get(id); }

function historyKey(id) { return 'runcell.history.' + id; }
function loadHistory(id) {
  try { return JSON.parse(sessionStorage.getItem(historyKey(id))) || []; } catch (e) { return []; }
}
function saveHistory(id, list) {
  try { sessionStorage.setItem(historyKey(id), JSON.stringify(list.slice(-HISTORY_MAX))); }
  catch (e) { /* storage full: the history is a convenience */ }
}

function statusLine(rec) {
  const parts = [h('span', {class: 'badge ' + rec.status}, rec.status)];
  if (rec.state) parts.push(h('span', {class: 'badge state-' + rec.state}, 'state: ' + rec.state));
  if (rec.usage) {
    parts.push(h('span', {}, rec.usage.wall_ms.toFixed(1) + ' ms'));
    if (rec.usage.memory_peak_kb)
      parts.push(h('span', {}, 'memory peak ' + bytes(rec.usage.memory_peak_kb * 1024)));
  }
  if (rec.truncated && (rec.truncated.stdout || rec.truncated.stderr))
    parts.push(h('span', {class: 'warn'}, 'output truncated'));
  if (rec.limits_degraded) parts.push(h('span', {class: 'warn'}, 'limits degraded'));
  if (rec.message) parts.push(h('span', {class: 'message'}, rec.message));
  return parts;
}

class Notebook {
  constructor(id) {
    this.id = id;
    this.info = null;
    this.running = null; // the cell running now
    this.history = loadHistory(id);
    this.cells = [];
    this.cellsEl = h('div', {class: 'cells'});
    this.headEl = h('div', {class: 'nb-head'});
    this.banner = h('p', {class: 'error', id: 'nb-banner', role: 'alert', hidden: true});
    this.files = filePanel(id);
    this.el = h('section', {id: 'notebook', 'data-session': id},
      h('div', {class: 'nb-main'},
        h('div', {class: 'card nb-bar'}, this.headEl, this.controls()),
        this.banner, this.cellsEl,
        h('p', {}, h('button', {type: 'button', id: 'add-cell',
                                onclick: () => this.addCell('').editor.focus()}, '+ Cell'))),
      h('aside', {class: 'nb-side'}, this.files.el));
    this.addCell('');
    this.refreshInfo();
  }

  controls() {
    const act = (label, id, fn) => h('button', {type: 'button', id, onclick: fn}, label);
    return h('div', {class: 'nb-controls'},
      act('Interrupt', 'interrupt', () => this.interrupt()),
      act('Restart', 'restart', () => this.restart()),
      act('Close', 'close-session', () => this.close(false)),
      act('Close with checkpoint', 'checkpoint-session', () => this.close(true)),
      h('a', {href: '#/sessions', class: 'button'}, 'All sessions'));
  }

  async refreshInfo() {
    try {
      this.info = await api('GET', '/v1/sessions/' + encodeURIComponent(this.id));
      this.banner.hidden = true;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        this.banner.textContent = 'This session is no longer live (' + e.code + '): ' + e.message +
          (e.body && e.body.resumable ? ' It is stored: resume it from the sessions list.' : '');
        this.banner.hidden = false;
      }
      return;
    }
    const s = this.info;
    clear(this.headEl).append(
      h('h2', {}, 'Session ', h('code', {}, s.id)),
      h('div', {class: 'meta'},
        h('span', {}, s.language + (s.python_version ? ' ' + s.python_version : '')),
        h('span', {class: 'badge ' + s.status, id: 'nb-status'}, s.status),
        h('span', {id: 'nb-count'}, 'executions: ' + s.execution_count),
        h('span', {}, 'memory ' + s.limits.memory_mb + ' MB, ' + s.limits.cpus + ' CPU, ' +
                      'timeout ' + s.timeout_s + ' s'),
        h('span', {}, 'network: ' + (s.network && s.network.mode === 'allowlist'
                                     ? s.network.allow.join(', ') : 'none')),
        s.limits_degraded ? h('span', {class: 'warn'}, 'limits degraded') : null));
  }

  addCell(code, after) {
    const cell = {};
    const lang = (this.info && this.info.language) || 'python';
    cell.prompt = h('div', {class: 'prompt'}, '[ ]');
    cell.langSel = h('select', {class: 'cell-lang', 'aria-label': 'language of the cell'},
      ['python', 'bash', 'javascript'].map((l) => h('option', {value: l}, l)));
    cell.langSel.value = lang;
    cell.out = h('div', {class: 'outputs'});
    cell.status = h('div', {class: 'cell-status'});
    const editorBox = h('div', {class: 'editor'});
    cell.el = h('div', {class: 'cell', 'data-status': 'new'},
      h('div', {class: 'cell-in'}, cell.prompt, editorBox,
        h('div', {class: 'cell-tools'},
          h('button', {type: 'button', class: 'run', title: 'Run (Shift+Enter)',
                       onclick: () => this.run(cell)}, 'Run'),
          cell.langSel,
          h('button', {type: 'button', class: 'remove', title: 'Remove the cell',
                       onclick: () => {
                         cell.el.remove();
                         this.cells = this.cells.filter((c) => c !== cell);
                       }}, 'x'))),
      cell.out, cell.status);
    if (after && after.el.nextSibling) this.cellsEl.insertBefore(cell.el, after.el.nextSibling);
    else this.cellsEl.append(cell.el);
    cell.editor = createEditor(editorBox, {value: code, language: lang,
                                           onRun: () => this.run(cell),
                                           history: () => this.history});
    cell.el._cellRef = cell;
    this.cells.push(cell);
    cell.langSel.addEventListener('change', () => cell.editor.setLanguage(cell.langSel.value));
    return cell;
  }

  async run(cell) {
    if (this.running) {
      toast('A cell is running in this session; interrupt it or wait.', 'error');
      return;
    }
    const code = cell.editor.getValue();
    if (this.history[this.history.length - 1] !== code) {
      this.history.push(code);
      saveHistory(this.id, this.history);
    }
    this.running = cell;
    clear(cell.out);
    clear(cell.status).append(h('span', {class: 'badge busy'}, 'running'));
    cell.el.dataset.status = 'running';
    delete cell.el.dataset.state;
    cell.prompt.textContent = '[*]';
    let streamPre = null, shown = 0, dropped = 0, errorShown = false;
    const onEvent = (ev) => {
      if (ev.type === 'stdout' || ev.type === 'stderr') {
        const text = stripAnsi(ev.data || '');
        if (shown + text.length > OUTPUT_CAP) { dropped += text.length; return; }
        shown += text.length;
        if (!streamPre) { streamPre = h('pre', {class: 'stream'}); cell.out.append(streamPre); }
        const last = streamPre.lastChild;
        if (last && last.className === ev.type) last.append(text);
        else streamPre.append(h('span', {class: ev.type}, text));
      } else if (ev.type === 'result') {
        streamPre = null;
        cell.out.append(renderBundle(ev.data || {}));
      } else if (ev.type === 'error') {
        streamPre = null;
        errorShown = true;
        cell.out.append(renderError(ev.error || {}));
      }
    };
    try {
      const last = await stream('/v1/sessions/' + encodeURIComponent(this.id) + '/execute',
                                {code, language: cell.langSel.value}, onEvent);
      if (!last || last.type !== 'done') throw new Error('the stream ended without its record');
      if (last.error) throw new ApiError(0, last.error.code, last.error.message);
      const rec = last.record;
      if (dropped) cell.out.append(h('p', {class: 'warn'}, dropped + ' more characters of output ' +
                                                           'not shown (they are in the record)'));
      if (rec.error && !errorShown) cell.out.append(renderError(rec.error));
      cell.prompt.textContent = '[' + (rec.execution_count ?? ' ') + ']';
      cell.el.dataset.status = rec.status;
      cell.el.dataset.state = rec.state || '';
      cell.el.dataset.count = rec.execution_count ?? '';
      clear(cell.status).append(...statusLine(rec));
      if (rec.usage && rec.usage.memory_peak_kb) peaks.set(this.id, rec.usage.memory_peak_kb);
      const f = rec.files || {};
      if ((f.created || []).length || (f.modified || []).length || (f.deleted || []).length)
        this.files.refresh();
    } catch (e) {
      cell.el.dataset.status = 'failed';
      cell.prompt.textContent = '[!]';
      clear(cell.status).append(h('span', {class: 'badge error'}, 'not run'),
                                h('span', {class: 'message'}, e.message));
    } finally {
      this.running = null;
      this.refreshInfo();
    }
    if (cell.el.dataset.status === 'failed') return;
    const next = cell.el.nextElementSibling;
    if (next) { const c = next._cellRef; if (c) c.editor.focus(); }
    else this.addCell('', cell).editor.focus();
  }

  async interrupt() {
    try {
      const r = await api('POST', '/v1/sessions/' + encodeURIComponent(this.id) + '/interrupt');
      toast(r.interrupted ? 'Interrupted the running cell' : 'Nothing was running');
    } catch (e) {
      toast('Cannot interrupt: ' + e.message, 'error');
    }
  }

  async restart() {
    if (this.running) {
      toast('A cell is running; interrupt it first.', 'error');
      return;
    }
    this.running = 'restart'; // no cell starts while the interpreter is replaced
    try {
      await api('POST', '/v1/sessions/' + encodeURIComponent(this.id) + '/restart');
      toast('Restarted: a fresh interpreter on the same files');
      this.el.dataset.restarts = String(Number(this.el.dataset.restarts || 0) + 1);
      for (const p of this.cellsEl.querySelectorAll('.prompt')) p.textContent = '[ ]';
    } catch (e) {
      toast('Cannot restart: ' + e.message, 'error');
    } finally {
      this.running = null;
    }
    this.refreshInfo();
  }

  async close(checkpoint) {
    try {
      await api('DELETE', '/v1/sessions/' + encodeURIComponent(this.id) +
                (checkpoint ? '?checkpoint=true' : ''));
      toast(checkpoint ? 'Closed with a checkpoint: resume it from the stored sessions'
                       : 'Closed the session');
      notebooks.delete(this.id);
      location.hash = '#/sessions';
    } catch (e) {
      toast('Cannot close: ' + e.message, 'error');
    }
  }
}

export function notebookView(id) {
  let nb = notebooks.get(id);
  if (!nb) { nb = new Notebook(id); notebooks.set(id, nb); }
  else {
    nb.refreshInfo();
    nb.files.refresh();
    // CodeMirror measures its lines when shown: after being away it has to again.
    requestAnimationFrame(() => nb.cells.forEach((c) => c.editor.cm.refresh()));
  }
  const timer = setInterval(() => { if (!nb.running) nb.refreshInfo(); }, 5000);
  return {el: nb.el, stop() { clearInterval(timer); }};
}
