// terminal.js - a cell's stream output as a terminal shows it: SGR colours (30-37, 90-97,
// 40-47, 100-107, bold) become spans with classes (ansi-fg-N, ansi-bg-N, ansi-bold), never
// markup from the data; `\r` returns to the start of the line, so that what follows
// overwrites it (a progress bar stays one line); `\b` steps back; ESC[K erases to the end
// of the line. Other escape and control sequences are dropped. Text is kept up to a cap
// (characters); past it the rest is only counted.

const ESC_MAX = 64; // an escape sequence cut between two chunks waits at most this long

// One run of text in one style: {t: text, s: style key}. A style key is
// "STREAM|FG|BG|BOLD", FG and BG '' or 0-15, BOLD '' or 'b'.
function styleKey(stream, st) {
  return stream + '|' + (st.fg ?? '') + '|' + (st.bg ?? '') + '|' + (st.bold ? 'b' : '');
}

function classOf(key) {
  const [stream, fg, bg, bold] = key.split('|');
  const c = stream ? [stream] : [];
  if (fg !== '') c.push('ansi-fg-' + fg);
  if (bg !== '') c.push('ansi-bg-' + bg);
  if (bold) c.push('ansi-bold');
  return c.join(' ');
}

// The SGR codes that give a key's colours, for writing the text back out.
function sgrOf(key) {
  const [, fg, bg, bold] = key.split('|');
  const codes = [];
  if (bold) codes.push(1);
  if (fg !== '') codes.push(Number(fg) < 8 ? 30 + Number(fg) : 82 + Number(fg));
  if (bg !== '') codes.push(Number(bg) < 8 ? 40 + Number(bg) : 92 + Number(bg));
  return codes.length ? '\x1b[' + codes.join(';') + 'm' : '';
}

function applySgr(st, params) {
  const ps = params === '' ? [0] : params.split(/[;:]/).map((p) => (p === '' ? 0 : Number(p)));
  for (let i = 0; i < ps.length; i++) {
    const p = ps[i];
    if (p === 0) { st.fg = null; st.bg = null; st.bold = false; }
    else if (p === 1) st.bold = true;
    else if (p === 22) st.bold = false;
    else if (p >= 30 && p <= 37) st.fg = p - 30;
    else if (p >= 90 && p <= 97) st.fg = p - 90 + 8;
    else if (p === 39) st.fg = null;
    else if (p >= 40 && p <= 47) st.bg = p - 40;
    else if (p >= 100 && p <= 107) st.bg = p - 100 + 8;
    else if (p === 49) st.bg = null;
    else if (p === 38 || p === 48) i += ps[i + 1] === 5 ? 2 : ps[i + 1] === 2 ? 4 : 1; // 256 and RGB colours: not shown
  }
}

// Puts text in style s at column pos of the runs of a line; returns the new runs.
function overwrite(runs, pos, text, s) {
  const out = [];
  const push = (t, k) => {
    if (!t) return;
    const last = out[out.length - 1];
    if (last && last.s === k) last.t += t; else out.push({t, s: k});
  };
  let i = 0;
  for (const r of runs) {
    const end = i + r.t.length;
    if (end <= pos) push(r.t, r.s);
    else if (i < pos) push(r.t.slice(0, pos - i), r.s);
    i = end;
  }
  if (i < pos) push(' '.repeat(pos - i), styleKey('', {}));
  push(text, s);
  const after = pos + text.length;
  i = 0;
  for (const r of runs) {
    const end = i + r.t.length;
    if (end > after) push(i >= after ? r.t : r.t.slice(after - i), r.s);
    i = end;
  }
  return out;
}

function lineLength(runs) { return runs.reduce((n, r) => n + r.t.length, 0); }

export class Terminal {
  // cls: the pre's class ("stream", "traceback" ...); cap: characters kept.
  constructor(cls, cap) {
    this.el = document.createElement('pre');
    this.el.className = cls;
    this.cap = cap || (2 << 20);
    this.kept = 0;       // characters of finished lines shown
    this.finished = 0;   // finished lines (shown or not)
    this.dropped = 0;    // characters past the cap
    this.lines = [];     // finished lines' runs, merged: [{t, s}] (t may span lines)
    this.cur = [];       // the line being written
    this.col = 0;        // the cursor's column in it
    this.states = {};    // stream -> {fg, bg, bold, pending}
    this.curEl = document.createElement('span');
    this.curEl.className = 'term-line';
    this.el.append(this.curEl);
    this.lastSpan = null;
  }

  state(stream) {
    return this.states[stream] || (this.states[stream] = {fg: null, bg: null, bold: false,
                                                          pending: ''});
  }

  // Appends a chunk of one stream ('stdout', 'stderr' or '' for neither).
  write(data, stream = '') {
    const st = this.state(stream);
    let s = st.pending + String(data);
    st.pending = '';
    const frag = document.createDocumentFragment();
    let text = '';
    const flush = () => {
      if (!text) return;
      const key = styleKey(stream, st);
      if (this.col === lineLength(this.cur)) {
        const last = this.cur[this.cur.length - 1];
        if (last && last.s === key) last.t += text; else this.cur.push({t: text, s: key});
      } else {
        this.cur = overwrite(this.cur, this.col, text, key);
      }
      this.col += text.length;
      text = '';
    };
    for (let i = 0; i < s.length; i++) {
      const c = s[i];
      if (c === '\x1b') {
        const rest = s.slice(i);
        const m = /^\x1b\[([0-9;:?]*)([ -\/]*)([@-~])/.exec(rest) ||
                  /^\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)/.exec(rest) ||
                  /^\x1b[ -\/]*[0-~]/.exec(rest);
        if (!m) {
          if (rest.length < ESC_MAX) { st.pending = rest; break; } // the rest comes next chunk
          continue; // a lone ESC: dropped
        }
        flush();
        if (m[3] === 'm' && !m[2]) applySgr(st, m[1]);
        else if (m[3] === 'K') this.eraseLine(m[1]);
        i += m[0].length - 1;
      } else if (c === '\n') {
        flush();
        this.finishLine(frag, styleKey(stream, st));
      } else if (c === '\r') {
        flush();
        this.col = 0;
      } else if (c === '\b') {
        flush();
        this.col = Math.max(0, this.col - 1);
      } else if (c < ' ' && c !== '\t' || c === '\x7f') {
        // other control characters are not shown
      } else {
        text += c;
      }
    }
    flush();
    if (frag.firstChild) this.el.insertBefore(frag, this.curEl);
    this.renderCurrent();
  }

  eraseLine(param) {
    if (param === '2') { this.cur = []; return; }
    if (param === '' || param === '0') {
      const kept = [];
      let i = 0;
      for (const r of this.cur) {
        if (i + r.t.length <= this.col) kept.push(r);
        else if (i < this.col) kept.push({t: r.t.slice(0, this.col - i), s: r.s});
        i += r.t.length;
      }
      this.cur = kept;
    }
  }

  // The current line is done: into the finished text (and the DOM fragment), if the cap
  // allows.
  finishLine(frag, key) {
    const runs = this.cur;
    this.cur = [];
    this.col = 0;
    runs.push({t: '\n', s: runs.length ? runs[runs.length - 1].s : key});
    this.finished++;
    const n = lineLength(runs);
    if (this.dropped || this.kept + n > this.cap) { this.dropped += n; return; }
    this.kept += n;
    for (const r of runs) {
      const last = this.lines[this.lines.length - 1];
      if (last && last.s === r.s) {
        last.t += r.t;
        // The run continues the last span shown (in this frag or already in the page).
        if (this.lastSpan && this.lastSpan.dataset.s === r.s) { this.lastSpan.append(r.t); continue; }
      } else {
        this.lines.push({t: r.t, s: r.s});
      }
      const span = document.createElement('span');
      const cls = classOf(r.s);
      if (cls) span.className = cls;
      span.dataset.s = r.s;
      span.textContent = r.t;
      frag.append(span);
      this.lastSpan = span;
    }
  }

  renderCurrent() {
    while (this.curEl.firstChild) this.curEl.firstChild.remove();
    if (this.dropped) return;
    for (const r of this.cur) {
      const span = document.createElement('span');
      const cls = classOf(r.s);
      if (cls) span.className = cls;
      span.textContent = r.t;
      this.curEl.append(span);
    }
  }

  lineCount() { return this.finished + (this.cur.length ? 1 : 0); }

  empty() { return !this.lines.length && !this.cur.length && !this.dropped; }

  // What is shown, as nbformat stream outputs ({output_type, name, text}), the colours
  // written back as SGR codes and an unfinished line's cursor kept (text, \r, the part
  // before the cursor again). Writing these to a new Terminal shows the same thing.
  toOutputs() {
    const out = [];
    const add = (stream, text) => {
      const name = stream === 'stderr' ? 'stderr' : 'stdout';
      const last = out[out.length - 1];
      if (last && last.name === name) last.text += text;
      else out.push({output_type: 'stream', name, text});
    };
    const emit = (runs) => {
      for (const r of runs) {
        const sgr = sgrOf(r.s);
        add(r.s.split('|')[0], sgr ? sgr + r.t + '\x1b[0m' : r.t);
      }
    };
    emit(this.lines);
    emit(this.cur);
    if (this.cur.length && this.col < lineLength(this.cur)) {
      add(this.cur[0].s.split('|')[0], '\r');
      emit(this.cur.reduce((acc, r) => {
        const room = this.col - lineLength(acc);
        if (room > 0) acc.push({t: r.t.slice(0, room), s: r.s});
        return acc;
      }, []));
    }
    for (const [stream, st] of Object.entries(this.states))
      if (st.pending) add(stream, st.pending);
    return out;
  }

  // The plain text shown, without styles.
  text() {
    return this.lines.map((r) => r.t).join('') + this.cur.map((r) => r.t).join('');
  }
}
