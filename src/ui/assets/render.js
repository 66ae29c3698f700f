// render.js - what a cell produced, made safe to show. Sandbox output is hostile: text is
// set as text; images only as data: URLs of image types (an <img> runs no script, SVG
// included); HTML (a DataFrame's table, or anything a cell chose to return as text/html)
// only inside an <iframe sandbox> without allow-scripts and without allow-same-origin, so
// it can neither run script nor reach the console's origin, its storage or its token.
import {h, stripAnsi} from './dom.js';

const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];
const B64 = /^[A-Za-z0-9+/=\s]*$/;

// The only HTML sink of the console, and the only Trusted Types policy the page's CSP
// allows (src/ui/routes.c): it is used for nothing but the srcdoc of a sandboxed frame.
const policy = window.trustedTypes
  ? window.trustedTypes.createPolicy('runcell-cell-html', {createHTML: (s) => s})
  : {createHTML: (s) => s};

export function sandboxedHtml(html, textFallback) {
  const frame = document.createElement('iframe');
  // The sandbox comes first: it is applied when the frame's document is loaded.
  frame.setAttribute('sandbox', '');
  frame.setAttribute('referrerpolicy', 'no-referrer');
  frame.setAttribute('loading', 'lazy');
  frame.className = 'cell-html';
  frame.title = 'HTML output of the cell (sandboxed: no scripts, no access to the console)';
  const lines = String(textFallback || html).split('\n').length;
  frame.style.height = Math.min(Math.max(lines * 22 + 40, 60), 480) + 'px';
  const doc = '<!doctype html><html><head><meta charset="utf-8">' +
              '<link rel="stylesheet" href="' + location.origin + '/ui/frame.css">' +
              '</head><body>' + html + '</body></html>';
  frame.srcdoc = policy.createHTML(doc);
  return frame;
}

function b64utf8(s) {
  const bytes = new TextEncoder().encode(s);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000)
    bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

// One MIME bundle, the richest form that can be shown safely.
export function renderBundle(bundle) {
  for (const t of IMAGE_TYPES) {
    const data = bundle[t];
    if (typeof data === 'string' && B64.test(data))
      return h('img', {class: 'cell-image', src: 'data:' + t + ';base64,' + data.replace(/\s/g, ''),
                       alt: bundle['text/plain'] || t});
  }
  if (typeof bundle['image/svg+xml'] === 'string')
    return h('img', {class: 'cell-image',
                     src: 'data:image/svg+xml;base64,' + b64utf8(bundle['image/svg+xml']),
                     alt: 'SVG image'});
  if (typeof bundle['text/html'] === 'string')
    return h('div', {class: 'result html'}, sandboxedHtml(bundle['text/html'], bundle['text/plain']));
  if (typeof bundle['text/plain'] === 'string')
    return h('pre', {class: 'result text'}, stripAnsi(bundle['text/plain']));
  if (bundle['application/json'] !== undefined)
    return h('pre', {class: 'result text'}, JSON.stringify(bundle['application/json'], null, 2));
  const types = Object.keys(bundle);
  return h('pre', {class: 'result text muted'}, 'a result of type ' + types.join(', ') +
                                                 ', which the console does not show');
}

export function renderError(err) {
  return h('div', {class: 'cell-error'},
    h('div', {class: 'error-head'}, h('strong', {}, String(err.name || 'Error')), ': ',
      String(err.value ?? '')),
    err.traceback ? h('pre', {class: 'traceback'}, stripAnsi(err.traceback)) : null);
}
