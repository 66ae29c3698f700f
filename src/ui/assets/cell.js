// cell.js - one cell of a notebook: its editor (code, or markdown shown rendered), its
// outputs as they stream (terminal text, results, the error) and its status line, and its
// form in the notebook document (doc.js). The notebook (notebook.js) decides when it runs.
import {bytes, clear, h, randomId} from './dom.js';
import {createEditor} from './editor.js';
import {keepOutput} from './doc.js';
import {renderMarkdown} from './markdown.js';
import {outputBox, renderBundle, renderError} from './render.js';
import {Terminal} from './terminal.js';

const OUTPUT_CAP = 2 << 20; // characters of stream output a cell shows; the rest is counted
const LANGUAGES = ['python', 'bash', 'javascript'];

function statusLine(rec) {
  const parts = [h('span', {class: 'badge ' + rec.status}, rec.status)];
  if (rec.state) parts.push(h('span', {class: 'badge state-' + rec.state}, 'state: ' + rec.state));
  if (rec.usage) {
    if (typeof rec.usage.wall_ms === 'number') parts.push(h('span', {}, rec.usage.wall_ms.toFixed(1) + ' ms'));
    if (rec.usage.memory_peak_kb)
      parts.push(h('span', {}, 'memory peak ' + bytes(rec.usage.memory_peak_kb * 1024)));
  }
  if (rec.truncated && (rec.truncated.stdout || rec.truncated.stderr))
    parts.push(h('span', {class: 'warn'}, 'output truncated'));
  if (rec.limits_degraded) parts.push(h('span', {class: 'warn'}, 'limits degraded'));
  if (rec.message) parts.push(h('span', {class: 'message'}, rec.message));
  return parts;
}

// What of a record the document keeps (the outputs are kept apart).
function recordSummary(rec) {
  const keep = ['status', 'state', 'execution_count', 'usage', 'truncated', 'limits_degraded',
                'message', 'exit_code', 'signal'];
  const out = {};
  for (const k of keep) if (rec[k] !== undefined) out[k] = rec[k];
  return out;
}

export class Cell {
  // nb: the notebook (for keys and runs); d: the cell in the document's form.
  constructor(nb, d) {
    this.nb = nb;
    this.id = d.id || randomId();
    this.type = d.cell_type === 'markdown' ? 'markdown' : 'code';
    this.language = LANGUAGES.includes(d.language) ? d.language : nb.language;
    this.record = d.record || null;
    this.countValue = Number.isInteger(d.execution_count) ? d.execution_count : null;
    this.exec = d.execution || null; // {id, seq, state, order}
    this.items = [];
    this.errorShown = false;
    this.build(d.source || '');
    this.showOutputs(d.outputs || []);
    if (this.record) this.showRecord(this.record);
    if (this.type === 'markdown') this.showRendered(true);
  }

  build(source) {
    const n = this.id;
    this.prompt = h('div', {class: 'prompt', 'aria-hidden': 'true'}, '[ ]');
    this.langSel = h('select', {class: 'cell-lang'},
      LANGUAGES.map((l) => h('option', {value: l}, l)), h('option', {value: 'markdown'}, 'markdown'));
    this.langSel.value = this.type === 'markdown' ? 'markdown' : this.language;
    this.langSel.addEventListener('change', () => {
      const v = this.langSel.value;
      if (v === 'markdown') this.setType('markdown');
      else { this.language = v; this.setType('code'); }
      this.nb.changed();
    });
    this.runButton = h('button', {type: 'button', class: 'run',
                                  onclick: () => this.nb.runButton(this)}, 'Run');
    this.removeButton = h('button', {type: 'button', class: 'remove',
                                     onclick: () => this.nb.deleteCell(this)}, '\u00d7');
    this.undoButton = h('button', {type: 'button', class: 'undo-run link', hidden: true,
                                   onclick: () => this.nb.undoRun(this)}, 'Undo this run');
    this.out = h('div', {class: 'outputs'});
    this.status = h('div', {class: 'cell-status'});
    this.mdView = h('div', {class: 'md-view', hidden: true,
                            ondblclick: () => this.nb.edit(this)});
    this.editorBox = h('div', {class: 'editor'});
    this.el = h('div', {class: 'cell', role: 'group', tabindex: '-1', 'data-id': n,
                        'data-type': this.type, 'data-status': 'new',
                        'aria-describedby': 'nb-keys-hint'},
      h('div', {class: 'cell-in'}, this.prompt, this.editorBox, this.mdView,
        h('div', {class: 'cell-tools'}, this.runButton, this.langSel, this.removeButton)),
      this.out, this.status);
    this.el._cell = this;
    this.editor = createEditor(this.editorBox, {
      value: source, language: this.type === 'markdown' ? 'markdown' : this.language,
      label: 'code', describedBy: 'nb-edit-hint',
      keys: {run: (how) => this.nb.runKey(this, how), escape: () => this.nb.command(this)},
      history: () => this.nb.history});
    this.editor.onChange(() => this.nb.changed());
    this.editor.cm.on('focus', () => this.nb.entered(this));
  }

  // Labels say which cell (its number in the notebook) for a screen reader and axe.
  label(i) {
    this.number = i;
    const what = this.type === 'markdown' ? 'markdown' : this.language;
    this.el.setAttribute('aria-label', 'Cell ' + i + ', ' + what +
                         (this.el.dataset.status !== 'new' ? ', ' + this.el.dataset.status : ''));
    this.editor.setLabel((this.type === 'markdown' ? 'Markdown' : 'Code') + ' of cell ' + i);
    this.langSel.setAttribute('aria-label', 'Kind of cell ' + i);
    this.runButton.setAttribute('aria-label', this.runButton.textContent + ' cell ' + i);
    this.removeButton.setAttribute('aria-label', 'Delete cell ' + i);
    this.removeButton.title = 'Delete cell ' + i + ' (d, d)';
  }

  source() { return this.editor.getValue(); }

  setType(type) {
    this.type = type;
    this.el.dataset.type = type;
    this.langSel.value = type === 'markdown' ? 'markdown' : this.language;
    this.editor.setLanguage(type === 'markdown' ? 'markdown' : this.language);
    if (type === 'markdown') { this.clearOutputs(); clear(this.status); this.prompt.textContent = ''; }
    else { this.showRendered(false); this.prompt.textContent = '[ ]'; }
    if (this.number) this.label(this.number);
  }

  // A markdown cell shows its text rendered (true) or its editor (false).
  showRendered(on) {
    const md = this.type === 'markdown' && on;
    if (md) {
      const src = this.source();
      clear(this.mdView).append(src.trim() ? renderMarkdown(src)
        : h('p', {class: 'muted'}, 'Empty markdown cell: press Enter or double-click to write.'));
    }
    this.mdView.hidden = !md;
    this.editorBox.hidden = md;
    this.el.classList.toggle('rendered', md);
    if (!md) requestAnimationFrame(() => this.editor.refresh());
  }

  // ---- outputs ----

  clearOutputs() {
    clear(this.out);
    this.items = [];
    this.errorShown = false;
  }

  streamItem() {
    const last = this.items[this.items.length - 1];
    if (last && last.kind === 'stream') return last;
    const term = new Terminal('stream', OUTPUT_CAP);
    const box = outputBox(term.el, 'output of the cell');
    const item = {kind: 'stream', term, box};
    this.items.push(item);
    this.out.append(box);
    return item;
  }

  addStream(name, text) {
    const it = this.streamItem();
    it.term.write(text, name === 'stderr' ? 'stderr' : 'stdout');
    it.term.el.dataset.lines = String(it.term.lineCount());
    it.box.update();
  }

  addResult(bundle) {
    this.items.push({kind: 'result', bundle});
    this.out.append(renderBundle(bundle || {}));
  }

  addError(err) {
    this.errorShown = true;
    this.items.push({kind: 'error', error: err});
    this.out.append(renderError(err));
  }

  // Outputs of the document (nbformat's shapes) shown again.
  showOutputs(outputs) {
    for (const o of outputs) {
      if (!o || typeof o !== 'object') continue;
      if (o.output_type === 'stream') this.addStream(o.name, String(o.text ?? ''));
      else if (o.output_type === 'error')
        this.addError({name: o.ename, value: o.evalue,
                       traceback: Array.isArray(o.traceback) ? o.traceback.join('\n') : ''});
      else if (o.data && typeof o.data === 'object') this.addResult(o.data);
    }
  }

  outputs() {
    const out = [];
    for (const it of this.items) {
      if (it.kind === 'stream') {
        for (const o of it.term.toOutputs()) out.push(keepOutput(o));
        if (it.term.dropped)
          out.push({output_type: 'stream', name: 'stdout',
                    text: '\n[' + it.term.dropped + ' more characters of output not kept]\n'});
      } else if (it.kind === 'result') {
        out.push({output_type: 'display_data', data: it.bundle});
      } else {
        const e = it.error;
        out.push({output_type: 'error', ename: String(e.name || 'Error'),
                  evalue: String(e.value ?? ''),
                  traceback: String(e.traceback || '').split('\n')});
      }
    }
    return out;
  }

  // ---- a run ----

  // state: 'queued', 'running'; the Run button becomes Stop on a queued or running cell.
  setRunState(state) {
    this.el.dataset.status = state;
    delete this.el.dataset.state;
    this.prompt.textContent = state === 'queued' ? '[-]' : '[*]';
    this.runButton.textContent = 'Stop';
    this.runButton.classList.add('stop');
    this.runButton.title = state === 'queued' ? 'Take the cell out of the queue'
                                              : 'Interrupt the cell (i, i)';
    clear(this.status).append(h('span', {class: 'badge busy'}, state));
    if (this.number) this.label(this.number);
  }

  beginRun() {
    this.clearOutputs();
    this.record = null;
    this.undoButton.hidden = true;
  }

  onEvent(ev) {
    if (ev.type === 'stdout' || ev.type === 'stderr') this.addStream(ev.type, ev.data || '');
    else if (ev.type === 'result') this.addResult(ev.data || {});
    else if (ev.type === 'error') this.addError(ev.error || {});
  }

  ranOut() {
    this.runButton.textContent = 'Run';
    this.runButton.classList.remove('stop');
    this.runButton.title = 'Run (Shift+Enter)';
  }

  showRecord(rec) {
    if (rec.error && !this.errorShown) this.addError(rec.error);
    this.countValue = Number.isInteger(rec.execution_count) ? rec.execution_count : this.countValue;
    this.prompt.textContent = '[' + (this.countValue ?? ' ') + ']';
    this.el.dataset.status = rec.status;
    this.el.dataset.state = rec.state || '';
    this.el.dataset.count = this.countValue ?? '';
    clear(this.status).append(...statusLine(rec));
    this.ranOut();
    if (this.number) this.label(this.number);
  }

  finish(rec) {
    this.record = recordSummary(rec);
    for (const it of this.items)
      if (it.kind === 'stream' && it.term.dropped)
        it.box.after(h('p', {class: 'warn dropped'}, it.term.dropped + ' more characters of ' +
                                                      'output not shown (they are in the record)'));
    this.showRecord(rec);
  }

  // The cell did not run or its run cannot be followed: why, in the status line.
  notRun(status, message, prompt) {
    this.el.dataset.status = status;
    this.prompt.textContent = prompt || '[ ]';
    this.record = {status, message};
    clear(this.status).append(h('span', {class: 'badge error'}, status === 'failed' ? 'not run' : status),
                              h('span', {class: 'message'}, message));
    this.ranOut();
    if (this.number) this.label(this.number);
  }

  toDoc() {
    const d = {id: this.id, cell_type: this.type, source: this.source()};
    if (this.type === 'code') {
      Object.assign(d, {language: this.language, outputs: this.outputs(),
                        execution_count: this.countValue, record: this.record,
                        execution: this.exec});
    }
    return d;
  }
}
