// doc.js - where a notebook is kept, and its .ipynb form. The document (cells, their
// outputs and order, and the executions they wait on) is the console's own JSON, kept by the
// server with the session (GET/PUT /v1/sessions/{id}/notebook) so that a reload, another
// tab, a resume or another node shows it again. While a server does not offer that route
// (404 "no such route"), or cannot be reached, the copy in this browser's localStorage is the
// notebook; it is written on every save in any case, so that a reload never loses an edit
// the server had not yet taken.
import {api, ApiError, sessionPath} from './api.js';
import {randomId} from './dom.js';

export const FORMAT = 'runcell.notebook';
const LOCAL_PREFIX = 'runcell.notebook.';
const LOCAL_INDEX = 'runcell.notebooks';
const LOCAL_KEEP = 30;          // notebooks kept in this browser, the newest
const DOC_MAX = 8 << 20;        // characters of a document sent to the server; outputs go first
const LOCAL_MAX = 2 << 20;      // ... kept in this browser (whose quota is about 5M characters)
const OUTPUT_TEXT_MAX = 256 << 10; // characters of one output kept in the document

export function emptyDoc(sid, language) {
  return {format: FORMAT, version: 1, session: sid, updated_at: null,
          metadata: {language: language || 'python'}, cells: []};
}

function validDoc(d) {
  return d && typeof d === 'object' && d.format === FORMAT && Array.isArray(d.cells);
}

function readLocal(sid) {
  try {
    const d = JSON.parse(localStorage.getItem(LOCAL_PREFIX + sid));
    return validDoc(d) ? d : null;
  } catch (e) { return null; }
}

function localIndex() {
  try { return JSON.parse(localStorage.getItem(LOCAL_INDEX)) || []; } catch (e) { return []; }
}

// Writes the local copy; the oldest notebooks make room when the browser's quota is hit.
function writeLocal(sid, text) {
  let index = localIndex().filter((x) => x !== sid);
  index.unshift(sid);
  for (;;) {
    try {
      localStorage.setItem(LOCAL_PREFIX + sid, text);
      break;
    } catch (e) {
      const victim = index.length > 1 ? index.pop() : null;
      if (!victim) return false;
      localStorage.removeItem(LOCAL_PREFIX + victim);
    }
  }
  for (const old of index.splice(LOCAL_KEEP)) localStorage.removeItem(LOCAL_PREFIX + old);
  try { localStorage.setItem(LOCAL_INDEX, JSON.stringify(index)); } catch (e) { /* full */ }
  return true;
}

// Outputs too large for the document are replaced by a note, the largest first, until the
// whole fits in max characters.
export function fitDoc(doc, max) {
  let text = JSON.stringify(doc);
  if (text.length <= max) return text;
  const sized = [];
  doc.cells.forEach((c, i) => (c.outputs || []).forEach((o, j) =>
    sized.push({i, j, n: JSON.stringify(o).length})));
  sized.sort((a, b) => b.n - a.n);
  const copy = JSON.parse(text);
  let total = text.length;
  for (const s of sized) {
    if (total <= max) break;
    copy.cells[s.i].outputs[s.j] = {output_type: 'stream', name: 'stdout',
      text: '[an output of ' + s.n + ' characters was not kept: the notebook is kept up to ' +
            max + ']\n'};
    total -= s.n;
  }
  return JSON.stringify(copy);
}

export class NotebookStore {
  constructor(sid) {
    this.sid = sid;
    this.server = null; // null: not known yet; true: the server keeps notebooks; false: not
    this.lastError = null;
  }

  // The kept document, the newer of the server's and this browser's, or null.
  async load() {
    const local = readLocal(this.sid);
    let remote = null;
    try {
      const d = await api('GET', sessionPath(this.sid, '/notebook'));
      this.server = true;
      if (validDoc(d)) remote = d;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && /no such route/.test(e.message))
        this.server = false;
      else if (e instanceof ApiError && (e.status === 404 || e.status === 405))
        this.server = e.status === 404 ? true : false; // a route without a document yet
      else this.lastError = e;
    }
    if (remote && local) return (local.updated_at || '') > (remote.updated_at || '') ? local : remote;
    return remote || local;
  }

  // A stored session's document, for a session resumed from it.
  async loadFrom(oldSid) {
    const other = new NotebookStore(oldSid);
    const d = await other.load();
    return d;
  }

  // Keeps doc here and, when the server keeps notebooks, there. Returns where it went.
  async save(doc) {
    doc.updated_at = new Date().toISOString();
    const text = fitDoc(doc, DOC_MAX);
    const local = writeLocal(this.sid, text.length <= LOCAL_MAX ? text : fitDoc(doc, LOCAL_MAX));
    if (this.server === false) return {local, server: false};
    try {
      await api('PUT', sessionPath(this.sid, '/notebook'), JSON.parse(text));
      this.server = true;
      this.lastError = null;
      return {local, server: true};
    } catch (e) {
      if (e instanceof ApiError && (e.status === 405 ||
          (e.status === 404 && /no such route/.test(e.message)))) this.server = false;
      else this.lastError = e;
      return {local, server: false, error: e};
    }
  }

  // The local copy only: for the moment the page goes away, when no request may finish.
  saveLocalNow(doc) {
    doc.updated_at = new Date().toISOString();
    return writeLocal(this.sid, fitDoc(doc, LOCAL_MAX));
  }
}

// An output with its text cut to OUTPUT_TEXT_MAX (head and tail kept), for the document.
export function keepOutput(o) {
  if (o.output_type !== 'stream' || o.text.length <= OUTPUT_TEXT_MAX) return o;
  const half = OUTPUT_TEXT_MAX / 2;
  return {output_type: 'stream', name: o.name,
          text: o.text.slice(0, half) + '\n[' + (o.text.length - 2 * half) +
                ' characters not kept]\n' + o.text.slice(-half)};
}

// ---- .ipynb (nbformat 4.5) ----

const KERNELS = {
  python: {kernelspec: {name: 'python3', display_name: 'Python 3', language: 'python'},
           language_info: {name: 'python'}},
  javascript: {kernelspec: {name: 'javascript', display_name: 'JavaScript (Node.js)',
                            language: 'javascript'},
               language_info: {name: 'javascript'}},
};

function mimeBundle(data) {
  const out = {};
  for (const [k, v] of Object.entries(data || {})) {
    if (/json$/.test(k)) out[k] = v;
    else if (typeof v === 'string') out[k] = v;
    else if (Array.isArray(v) && v.every((x) => typeof x === 'string')) out[k] = v.join('');
  }
  return out;
}

function ipynbOutput(o) {
  if (o.output_type === 'stream')
    return {output_type: 'stream', name: o.name === 'stderr' ? 'stderr' : 'stdout',
            text: String(o.text)};
  if (o.output_type === 'error')
    return {output_type: 'error', ename: String(o.ename || 'Error'), evalue: String(o.evalue ?? ''),
            traceback: (o.traceback || []).map(String)};
  return {output_type: 'display_data', data: mimeBundle(o.data), metadata: {}};
}

// The document as an nbformat 4.5 notebook (a bash cell of a Python session becomes a
// %%bash cell, as Jupyter writes one).
export function toIpynb(doc) {
  const lang = (doc.metadata && doc.metadata.language) || 'python';
  const ids = new Set();
  const cells = doc.cells.map((c) => {
    let id = /^[A-Za-z0-9_-]{1,64}$/.test(c.id || '') && !ids.has(c.id) ? c.id : randomId();
    ids.add(id);
    if (c.cell_type === 'markdown')
      return {cell_type: 'markdown', id, metadata: {}, source: c.source || ''};
    const bash = c.language === 'bash' && lang !== 'bash';
    return {cell_type: 'code', id,
            metadata: c.language && c.language !== lang ? {runcell: {language: c.language}} : {},
            source: (bash ? '%%bash\n' : '') + (c.source || ''),
            outputs: (c.outputs || []).map(ipynbOutput),
            execution_count: Number.isInteger(c.execution_count) ? c.execution_count : null};
  });
  return Object.assign({nbformat: 4, nbformat_minor: 5,
                        metadata: Object.assign({}, KERNELS[lang] || KERNELS.python,
                                                {runcell: {session: doc.session}})}, {cells});
}

const joinSource = (s) => (Array.isArray(s) ? s.join('') : String(s ?? ''));

// Cells of a .ipynb file's text, in the document's form; throws an Error that says what is
// wrong with it. Outputs come along (shown as the file had them).
export function fromIpynb(text, sessionLanguage) {
  let nb;
  try { nb = JSON.parse(text); } catch (e) {
    throw new Error('the file is not JSON (' + e.message + ')');
  }
  if (!nb || typeof nb !== 'object' || !Array.isArray(nb.cells))
    throw new Error('the file has no "cells" list: not a Jupyter notebook');
  if (nb.nbformat !== 4)
    throw new Error('the file is nbformat ' + nb.nbformat + '; the console reads nbformat 4 ' +
                    '(save it from Jupyter as a current notebook)');
  return nb.cells.map((c) => {
    const source = joinSource(c.source);
    if (c.cell_type === 'markdown' || c.cell_type === 'raw')
      return {id: randomId(), cell_type: 'markdown', source, outputs: [], execution_count: null};
    let language = (c.metadata && c.metadata.runcell && c.metadata.runcell.language) ||
                   sessionLanguage || 'python';
    let src = source;
    const magic = /^%%(bash|sh)[ \t]*\n/.exec(src);
    if (magic) { language = 'bash'; src = src.slice(magic[0].length); }
    const outputs = (Array.isArray(c.outputs) ? c.outputs : []).map((o) => {
      if (o.output_type === 'stream')
        return {output_type: 'stream', name: o.name === 'stderr' ? 'stderr' : 'stdout',
                text: joinSource(o.text)};
      if (o.output_type === 'error')
        return {output_type: 'error', ename: String(o.ename ?? ''), evalue: String(o.evalue ?? ''),
                traceback: Array.isArray(o.traceback) ? o.traceback.map(String) : []};
      return {output_type: 'display_data', data: mimeBundle(o.data)};
    });
    return {id: randomId(), cell_type: 'code', language, source: src, outputs,
            execution_count: Number.isInteger(c.execution_count) ? c.execution_count : null};
  });
}
