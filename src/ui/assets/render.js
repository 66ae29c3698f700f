// render.js - what a cell produced, made safe to show. Sandbox output is hostile: text is
// set as text (colours through terminal.js, as classes); images only as data: URLs of image
// types (an <img> runs no script, SVG included); HTML (a DataFrame's table, anything a cell
// returns as text/html) only inside an <iframe sandbox> without allow-scripts and without
// allow-same-origin, so it can neither run script nor reach the console's origin, its
// storage or its token. Long output sits in a scroll box with "Show all".
import {h, saveBlob} from './dom.js';
import {Terminal} from './terminal.js';

const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];
const B64 = /^[A-Za-z0-9+/=\s]*$/;

// The only HTML sink of the console, and the only Trusted Types policy the page's CSP
// allows (src/ui/routes.c): it is used for nothing but the srcdoc of a sandboxed frame.
const policy = window.trustedTypes
  ? window.trustedTypes.createPolicy('runcell-cell-html', {createHTML: (s) => s})
  : {createHTML: (s) => s};

function b64utf8(s) {
  const bytes = new TextEncoder().encode(s);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000)
    bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

// The frame inherits the console's CSP, whose style-src is 'self' data:: a <style> element
// in the HTML would be refused, so each becomes a stylesheet <link> to a data: URL of the same
// CSS. That keeps pandas Styler's colours (and a DataFrame's own CSS) in the frame, where
// CSS can restyle nothing but the frame, and loads nothing but images of this origin or data:
// URLs (img-src); scripts stay refused (script-src 'self', and no allow-scripts).
export function framedHtml(html) {
  return String(html).replace(/<style\b[^>]*>([\s\S]*?)<\/style\s*>/gi, (all, css) =>
    '<link rel="stylesheet" href="data:text/css;base64,' + b64utf8(css) + '">');
}

// The libraries whose HTML output needs scripts, by a word their HTML carries.
const SCRIPTED = [[/plotly/i, 'Plotly'], [/vega|altair/i, 'Altair (Vega-Lite)'],
                  [/bokeh/i, 'Bokeh'], [/ipywidgets|jupyter-widgets/i, 'Jupyter widgets']];

export function needsScripts(html) {
  if (!/<script\b/i.test(html)) return null;
  for (const [re, name] of SCRIPTED) if (re.test(html)) return name;
  return 'scripts';
}

export function sandboxedHtml(html, textFallback) {
  const frame = document.createElement('iframe');
  // The sandbox comes first: it is applied when the frame's document is loaded.
  frame.setAttribute('sandbox', '');
  frame.setAttribute('referrerpolicy', 'no-referrer');
  frame.setAttribute('loading', 'lazy');
  frame.className = 'cell-html';
  frame.title = 'HTML output of the cell (sandboxed: no scripts, no access to the console)';
  // The frame cannot tell its height (it runs no script): guessed from the table rows and the
  // text lines; the user can resize it.
  const rows = (String(html).match(/<tr\b/gi) || []).length;
  const lines = Math.max(String(textFallback || html).split('\n').length, rows + 1);
  frame.style.height = Math.min(Math.max(lines * 22 + 40, 60), 480) + 'px';
  const doc = '<!doctype html><html><head><meta charset="utf-8">' +
              '<link rel="stylesheet" href="' + location.origin + '/ui/frame.css">' +
              '</head><body>' + framedHtml(html) + '</body></html>';
  frame.srcdoc = policy.createHTML(doc);
  return frame;
}

// A scroll box around long output, with "Show all" once it overflows. update() measures
// again (after new output); a box scrolled to its end stays at the end as output comes.
export function outputBox(child, what) {
  const box = h('div', {class: 'out-box', role: 'region', 'aria-label': what || 'output'}, child);
  const button = h('button', {type: 'button', class: 'show-all link', hidden: true,
                              'aria-expanded': 'false'}, 'Show all');
  const wrap = h('div', {class: 'out-wrap'}, box, button);
  let expanded = false, pending = false, atEnd = true;
  // Whether the box is scrolled to its end, kept from its scroll events: measuring it at each
  // chunk of output would lay the page out once per chunk.
  box.addEventListener('scroll', () => {
    atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
  }, {passive: true});
  button.addEventListener('click', () => {
    expanded = !expanded;
    wrap.classList.toggle('expanded', expanded);
    button.setAttribute('aria-expanded', String(expanded));
    measure();
  });
  function measure() {
    pending = false;
    const over = box.scrollHeight > box.clientHeight + 2;
    // A box that scrolls is reached and scrolled by keyboard too (Tab, then the arrows).
    if (over) box.setAttribute('tabindex', '0'); else box.removeAttribute('tabindex');
    button.hidden = !over && !expanded;
    const lines = child.dataset && child.dataset.lines;
    button.textContent = expanded ? 'Collapse' : 'Show all' + (lines ? ' (' + lines + ' lines)' : '');
    if (atEnd && over && !expanded) box.scrollTop = box.scrollHeight;
  }
  // At most one measure a frame, however many chunks came.
  wrap.update = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(measure);
  };
  wrap.update();
  return wrap;
}

// Text (with terminal colours) in a scroll box.
export function textBlock(text, cls) {
  const t = new Terminal(cls);
  t.write(text);
  t.el.dataset.lines = String(t.lineCount());
  return outputBox(t.el, 'text output');
}

function htmlResult(bundle) {
  const html = bundle['text/html'];
  const lib = needsScripts(html);
  const frame = sandboxedHtml(html, bundle['text/plain']);
  if (!lib) return h('div', {class: 'result html'}, frame);
  const note = h('p', {class: 'script-note', role: 'note'},
    'This output needs ' + (lib === 'scripts' ? 'scripts' : lib + "'s scripts") +
    ', which the console does not run (output of a cell runs no script here). ' +
    'What it shows without them is below; save it as a file to open it in a browser tab ' +
    'of its own. ',
    h('button', {type: 'button', class: 'link save-html',
                 onclick: () => saveBlob('output.html', new Blob([html]))}, 'Save as HTML'));
  return h('div', {class: 'result html needs-scripts'}, note,
           bundle['text/plain'] ? textBlock(bundle['text/plain'], 'result text') : null, frame);
}

// One MIME bundle, the richest form that can be shown safely.
export function renderBundle(bundle) {
  for (const t of IMAGE_TYPES) {
    const data = bundle[t];
    if (typeof data === 'string' && B64.test(data))
      return h('img', {class: 'cell-image', src: 'data:' + t + ';base64,' + data.replace(/\s/g, ''),
                       alt: typeof bundle['text/plain'] === 'string' ? bundle['text/plain'] : t});
  }
  if (typeof bundle['image/svg+xml'] === 'string')
    return h('img', {class: 'cell-image',
                     src: 'data:image/svg+xml;base64,' + b64utf8(bundle['image/svg+xml']),
                     alt: 'SVG image'});
  if (typeof bundle['text/html'] === 'string') return htmlResult(bundle);
  if (typeof bundle['text/markdown'] === 'string' && typeof bundle['text/plain'] !== 'string')
    return textBlock(bundle['text/markdown'], 'result text');
  if (typeof bundle['text/plain'] === 'string') return textBlock(bundle['text/plain'], 'result text');
  if (bundle['application/json'] !== undefined)
    return textBlock(JSON.stringify(bundle['application/json'], null, 2), 'result text');
  const types = Object.keys(bundle);
  return h('pre', {class: 'result text muted'}, 'a result of type ' + types.join(', ') +
                                                 ', which the console does not show');
}

export function renderError(err) {
  let tb = null;
  if (err.traceback) {
    const t = new Terminal('traceback');
    t.write(Array.isArray(err.traceback) ? err.traceback.join('\n') : String(err.traceback));
    t.el.dataset.lines = String(t.lineCount());
    tb = outputBox(t.el, 'traceback');
  }
  return h('div', {class: 'cell-error'},
    h('div', {class: 'error-head'}, h('strong', {}, String(err.name || 'Error')), ': ',
      String(err.value ?? '')),
    tb);
}
