// markdown.js - Markdown (a CommonMark subset: headings, paragraphs, emphasis, code spans
// and fenced blocks, lists, quotes, rules, GFM tables, links) to DOM nodes built with
// dom.js: raw HTML in the source stays text, links are http(s), mailto or relative only
// (never javascript:, data: or another scheme) and open with rel="noopener noreferrer",
// images become links to their address. For markdown cells and the agent's answers.
import {h} from './dom.js';

const SAFE_SCHEME = /^(https?:|mailto:)/i;

// The address as a browser would read it (tabs, newlines and controls inside it are
// ignored by URL parsing, so "java\tscript:" is still javascript:), or null when unsafe.
export function safeUrl(url) {
  const u = String(url || '').replace(/[\x00-\x20\x7f]/g, '');
  if (!u) return null;
  if (/^[a-z][a-z0-9+.-]*:/i.test(u) && !SAFE_SCHEME.test(u)) return null;
  return u;
}

function link(text, url) {
  const href = safeUrl(url);
  if (!href) return h('span', {class: 'md-unsafe-link', title: 'link not followed: ' + url}, text);
  return h('a', {href, target: '_blank', rel: 'noopener noreferrer'}, text);
}

// Inline rules, tried in order at each special character; each returns [node, length].
const INLINE = [
  [/^\\([!-\/:-@\[-`{-~])/, (m) => m[1]],
  [/^(`+)([\s\S]*?[^`])\1(?!`)/, (m) => h('code', {}, m[2].replace(/^ (.*) $/, '$1'))],
  [/^!\[([^\]]*)\]\(\s*<?((?:[^\s()<>]|\([^\s()<>]*\))*)>?(?:\s+"[^"]*")?\s*\)/,
    (m) => link(m[1] || m[2], m[2])],
  [/^\[((?:\\.|[^\]\\])*)\]\(\s*<?((?:[^\s()<>]|\([^\s()<>]*\))*)>?(?:\s+"[^"]*")?\s*\)/,
    (m) => link(inline(m[1]), m[2])],
  [/^<((?:https?|mailto):[^\s<>]+)>/i, (m) => link(m[1], m[1])],
  // Underscores close only at a word's end (snake_case and __dunder__ inside words stay text).
  [/^\*\*(?=\S)([\s\S]*?\S)\*\*/, (m) => h('strong', {}, inline(m[1]))],
  [/^__(?=\S)([\s\S]*?\S)__(?!\w)/, (m) => h('strong', {}, inline(m[1]))],
  [/^\*(?=[^\s*])([\s\S]*?[^\s\\])\*(?!\*)/, (m) => h('em', {}, inline(m[1]))],
  [/^_(?=[^\s_])([\s\S]*?[^\s\\])_(?!\w)/, (m) => h('em', {}, inline(m[1]))],
  [/^~~(?=\S)([\s\S]*?\S)~~/, (m) => h('del', {}, inline(m[1]))],
  [/^(?: {2,}|\\)\n/, () => h('br')],
];
const SPECIAL = /[\\`!\[<*_~ ]/;

export function inline(text) {
  const out = [];
  let plain = '';
  let i = 0;
  while (i < text.length) {
    const rest = text.slice(i);
    let matched = false;
    // _ inside a word (snake_case) is a letter, not emphasis.
    const wordUnderscore = text[i] === '_' && i > 0 && /\w/.test(text[i - 1]);
    if (SPECIAL.test(text[i]) && !wordUnderscore) {
      for (const [re, make] of INLINE) {
        const m = re.exec(rest);
        if (!m) continue;
        if (plain) { out.push(plain); plain = ''; }
        out.push(make(m));
        i += m[0].length;
        matched = true;
        break;
      }
    }
    if (!matched) { plain += text[i]; i++; }
  }
  if (plain) out.push(plain);
  return out;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)/;
const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(\s+|$)/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function cellsOf(line) {
  return line.trim().replace(/^\||\|$/g, '').split(/(?<!\\)\|/).map((c) => c.trim());
}

// Block structure of lines into nodes.
function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    let m;
    if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
      i++;
      out.push(h('pre', {class: 'md-code'}, h('code', {'data-lang': m[2] || null},
                                              body.join('\n'))));
    } else if ((m = HEADING.exec(line))) {
      out.push(h('h' + m[1].length, {}, inline(m[2] || '')));
      i++;
    } else if (RULE.test(line)) {
      out.push(h('hr'));
      i++;
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && lines[i].trim() && QUOTE.test(lines[i]))
        body.push(lines[i++].replace(QUOTE, ''));
      out.push(h('blockquote', {}, blocks(body)));
    } else if ((m = ITEM.exec(line))) {
      const ordered = /\d/.test(m[2]);
      const list = h(ordered ? 'ol' : 'ul', {});
      if (ordered && parseInt(m[2], 10) !== 1) list.setAttribute('start', parseInt(m[2], 10));
      while (i < lines.length && (m = ITEM.exec(lines[i])) && /\d/.test(m[2]) === ordered) {
        const indent = m[0].length;
        const body = [lines[i].slice(indent)];
        i++;
        while (i < lines.length && (lines[i].startsWith(' '.repeat(Math.min(indent, 4))) ||
                                    (!lines[i].trim() && i + 1 < lines.length &&
                                     lines[i + 1].startsWith(' '.repeat(Math.min(indent, 4))))))
          body.push(lines[i++].slice(Math.min(indent, 4)));
        const inner = blocks(body);
        // A tight item's one paragraph is its text.
        list.append(h('li', {}, inner.length === 1 && inner[0].tagName === 'P'
                                ? [...inner[0].childNodes] : inner));
      }
      out.push(list);
    } else if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) &&
               lines[i + 1].includes('-')) {
      const head = cellsOf(line);
      i += 2;
      const rows = [];
      while (i < lines.length && lines[i].trim() && lines[i].includes('|')) rows.push(cellsOf(lines[i++]));
      out.push(h('table', {class: 'md-table'},
        h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, inline(c))))),
        h('tbody', {}, rows.map((r) => h('tr', {}, head.map((_, k) => h('td', {}, inline(r[k] || ''))))))));
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) &&
             !HEADING.test(lines[i]) && !RULE.test(lines[i]) && !QUOTE.test(lines[i]) &&
             !(para.length && ITEM.test(lines[i])))
        para.push(lines[i++]);
      if (!para.length) para.push(lines[i++]);
      out.push(h('p', {}, inline(para.join('\n').trim())));
    }
  }
  return out;
}

// source -> a div.markdown of safe nodes.
export function renderMarkdown(source, cls) {
  const lines = String(source || '').replace(/\r\n?/g, '\n').replace(/\t/g, '    ').split('\n');
  return h('div', {class: 'markdown' + (cls ? ' ' + cls : '')}, blocks(lines));
}
