// api.js - the console's only way to the server: the routes of docs/API.md, with the token
// in an Authorization header. The token is never put in a URL, a cookie or the page.
//
// The token lives in sessionStorage (this tab, gone when the tab closes; never written to
// localStorage, so it is not kept on disk after the browser ends). A new tab of the console
// asks the tabs already open for it over a BroadcastChannel (same origin only: no other site
// and no sandboxed output frame, whose origin is opaque, can listen), so one login serves
// every tab while one is open; logging out in one tab logs out all (docs/SECURITY.md).

const KEY = 'runcell.token';
const channel = 'BroadcastChannel' in window ? new BroadcastChannel('runcell.console') : null;
const listeners = new Set();

export function getToken() { return sessionStorage.getItem(KEY); }
export function setToken(t) { sessionStorage.setItem(KEY, t); }
export function dropToken() { sessionStorage.removeItem(KEY); }

// Tells the other tabs; each message is {type, ...}.
export function broadcast(msg) { if (channel) channel.postMessage(msg); }
export function onBroadcast(fn) { listeners.add(fn); return () => listeners.delete(fn); }

if (channel) {
  channel.onmessage = (ev) => {
    const msg = ev.data || {};
    if (msg.type === 'token?' && getToken()) channel.postMessage({type: 'token', token: getToken()});
    for (const fn of listeners) fn(msg);
  };
}

// The token from another open tab of the console, or null after waitMs.
export function askOtherTabs(waitMs = 300) {
  if (!channel) return Promise.resolve(null);
  return new Promise((resolve) => {
    const stop = onBroadcast((msg) => {
      if (msg.type === 'token' && typeof msg.token === 'string') {
        clearTimeout(timer);
        stop();
        resolve(msg.token);
      }
    });
    const timer = setTimeout(() => { stop(); resolve(null); }, waitMs);
    channel.postMessage({type: 'token?'});
  });
}

export class ApiError extends Error {
  constructor(status, code, message, body) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

function headers(extra) {
  const h = new Headers(extra || {});
  const t = getToken();
  if (t) h.set('Authorization', 'Bearer ' + t);
  return h;
}

// Turns an error reply into an ApiError with the server's own words; a 401 also tells the
// app, which asks for the token again.
async function failure(res) {
  let body = null;
  try { body = await res.json(); } catch (e) { /* not JSON */ }
  const err = body && body.error ? body.error : {};
  const e = new ApiError(res.status, err.code || 'http_' + res.status,
                         err.message || res.status + ' ' + res.statusText, body);
  if (res.status === 401) window.dispatchEvent(new CustomEvent('runcell:unauthorized',
                                                               {detail: e}));
  return e;
}

async function send(method, path, body, extraHeaders, signal) {
  let res;
  try {
    res = await fetch(path, {
      method, signal, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
      headers: headers(Object.assign(body !== undefined && !(body instanceof Blob)
                                     ? {'Content-Type': 'application/json'} : {},
                                     extraHeaders)),
      body: body === undefined ? undefined
            : body instanceof Blob ? body : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'unreachable', 'cannot reach runcell serve: ' + e.message);
  }
  if (!res.ok) throw await failure(res);
  return res;
}

// JSON in, JSON out.
export async function api(method, path, body, signal) {
  const res = await send(method, path, body, {}, signal);
  const type = res.headers.get('Content-Type') || '';
  return type.startsWith('application/json') ? res.json() : res.text();
}

// A streamed route (execute, agent runs, an execution's events): calls onEvent with each
// NDJSON line as it comes. Returns the last event. method is POST with a body, GET without.
export async function stream(path, body, onEvent, signal, method) {
  const res = await send(method || (body === undefined ? 'GET' : 'POST'), path, body,
                         {Accept: 'application/x-ndjson'}, signal);
  const type = res.headers.get('Content-Type') || '';
  if (!type.startsWith('application/x-ndjson')) {
    // A server that answered the whole record at once: one event.
    const last = await res.json();
    onEvent(last);
    return last;
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', last = null;
  for (;;) {
    const {value, done} = await reader.read();
    buf += dec.decode(value || new Uint8Array(), {stream: !done});
    // Each line of the chunk in turn, the rest kept once (not copied once per line).
    let start = 0, nl;
    while ((nl = buf.indexOf('\n', start)) >= 0) {
      const line = buf.slice(start, nl).trim();
      start = nl + 1;
      if (!line) continue;
      last = JSON.parse(line);
      onEvent(last);
    }
    buf = buf.slice(start);
    if (done) break;
  }
  if (buf.trim()) { last = JSON.parse(buf); onEvent(last); }
  return last;
}

export function sessionPath(sid, rest) {
  return '/v1/sessions/' + encodeURIComponent(sid) + (rest || '');
}

export function filePath(sid, path) {
  return '/v1/sessions/' + encodeURIComponent(sid) + '/files/' +
         path.split('/').map(encodeURIComponent).join('/');
}

export async function download(sid, path) {
  const res = await send('GET', filePath(sid, path));
  return res.blob();
}

export async function upload(sid, path, blob) {
  const res = await send('PUT', filePath(sid, path), blob,
                         {'Content-Type': 'application/octet-stream'});
  return res.json();
}

// The Prometheus text of /metrics as {name or name{labels}: value}.
export async function metrics() {
  const text = await api('GET', '/metrics');
  const out = {};
  for (const line of String(text).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    out[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return out;
}
