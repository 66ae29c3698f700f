// dom.js - builds elements from text only: strings become text nodes, never markup, so
// nothing a sandbox printed (stdout, file names, tracebacks) can turn into HTML here.

// h('div', {class: 'x', onclick: fn, 'data-id': id}, 'text', child, ...)
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = String(v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else if (k.startsWith('on')) throw new Error('event handlers are functions, not strings');
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function toast(msg, kind) {
  const t = document.getElementById('toast');
  t.textContent = msg;
  t.className = kind || '';
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

// Says msg to a screen reader (the page's polite live region, index.html), without showing
// it: a cell that finished, a queued run, a mode change.
export function announce(msg) {
  const r = document.getElementById('announcer');
  if (!r) return;
  // The same words twice in a row are still read: the region is emptied first.
  r.textContent = '';
  setTimeout(() => { r.textContent = msg; }, 30);
}

// Saves blob under name: an anchor with `download`, the blob re-typed as
// application/octet-stream so that no browser renders it in the console's origin.
export function saveBlob(name, blob) {
  const url = URL.createObjectURL(new Blob([blob], {type: 'application/octet-stream'}));
  const a = h('a', {href: url, download: name, hidden: true});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

export function b64ToBlob(b64) {
  const bin = atob(String(b64).replace(/\s/g, ''));
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new Blob([bytes]);
}

// "3 min", "2 h 5 min" ...
export function duration(ms) {
  if (!(ms >= 0)) return '-';
  const s = Math.round(ms / 1000);
  if (s < 60) return s + ' s';
  const m = Math.floor(s / 60);
  if (m < 60) return m + ' min';
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + ' h ' + (m % 60) + ' min';
  return Math.floor(hr / 24) + ' d';
}

export function bytes(n) {
  if (!(n >= 0)) return '-';
  if (n < 1024) return n + ' B';
  if (n < 1 << 20) return (n / 1024).toFixed(1) + ' KiB';
  if (n < 1 << 30) return (n / (1 << 20)).toFixed(1) + ' MiB';
  return (n / (1 << 30)).toFixed(2) + ' GiB';
}

// A random id of the letters nbformat 4.5 allows in a cell id.
export function randomId() {
  const b = crypto.getRandomValues(new Uint8Array(6));
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
}
