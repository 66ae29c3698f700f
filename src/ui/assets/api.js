// api.js - the console's only way to the server: the routes of docs/API.md, with the token
// from sessionStorage in an Authorization header. The token is never put in a URL, a cookie
// or the page.

const KEY = 'runcell.token';

export function getToken() { return sessionStorage.getItem(KEY); }
export function setToken(t) { sessionStorage.setItem(KEY, t); }
export function dropToken() { sessionStorage.removeItem(KEY); }

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

// A streamed route (execute, agent runs): calls onEvent with each NDJSON line as it comes.
// Returns the last event.
export async function stream(path, body, onEvent, signal) {
  const res = await send('POST', path, body, {Accept: 'application/x-ndjson'}, signal);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', last = null;
  for (;;) {
    const {value, done} = await reader.read();
    buf += dec.decode(value || new Uint8Array(), {stream: !done});
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line) continue;
      last = JSON.parse(line);
      onEvent(last);
    }
    if (done) break;
  }
  if (buf.trim()) { last = JSON.parse(buf); onEvent(last); }
  return last;
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
