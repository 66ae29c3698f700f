// sessions.js - the sessions view: live sessions, the create form, and the stored sessions
// one can resume (only those: a session closed without a checkpoint kept nothing), a page at
// a time. The list is read again when this or another tab of the console changes it (a
// BroadcastChannel message), when the page comes back into view, and else by a poll that
// slows down while nothing changes (3 s doubling to 60 s) and stops while the page is hidden.
import {api, broadcast, onBroadcast} from './api.js';
import {append, bytes, clear, duration, h, toast} from './dom.js';
import {lastPeakKb, resume} from './notebook.js';

const POLL_MIN_MS = 3000;
const POLL_MAX_MS = 60000;
const PAGE = 20;

function numberField(label, name, attrs) {
  return h('label', {}, label, ' ',
           h('input', Object.assign({type: 'number', name, min: 0, step: 'any', size: 6}, attrs)));
}

// The create body from the form: empty fields are left to the server's defaults.
function createBody(form) {
  const f = new FormData(form);
  const body = {language: f.get('language')};
  for (const k of ['timeout_s', 'idle_timeout_s', 'cpus'])
    if (f.get(k)) body[k] = Number(f.get(k));
  for (const k of ['memory_mb', 'disk_mb', 'pids'])
    if (f.get(k)) body[k] = parseInt(f.get(k), 10);
  const allow = String(f.get('allow') || '').split(/[\s,]+/).filter(Boolean);
  if (allow.length) body.network = {mode: 'allowlist', allow};
  // A secret the egress proxy adds to its host's requests: its value goes to the server in
  // this request only, and is never shown again (the session lists its host and header).
  const secretHost = String(f.get('secret_host') || '').trim();
  if (secretHost || f.get('secret_value'))
    body.secrets = [{host: secretHost,
                     header: String(f.get('secret_header') || '').trim() || 'Authorization',
                     value: String(f.get('secret_value') || '')}];
  body.persist = f.get('persist') === 'on';
  return body;
}

function createForm(onCreated) {
  const err = h('p', {class: 'error', id: 'create-error', role: 'alert', hidden: true});
  const form = h('form', {id: 'create-session', class: 'card'},
    h('h2', {}, 'New session'),
    h('div', {class: 'row'},
      h('label', {}, 'Language ',
        h('select', {name: 'language'},
          h('option', {value: 'python'}, 'Python (and bash cells)'),
          h('option', {value: 'javascript'}, 'JavaScript (Node)'))),
      numberField('Timeout per cell (s)', 'timeout_s', {placeholder: '60'}),
      numberField('Idle timeout (s)', 'idle_timeout_s', {placeholder: '600'}),
      numberField('Memory (MB)', 'memory_mb', {placeholder: '1024', step: 1}),
      numberField('Disk (MB)', 'disk_mb', {placeholder: '1024', step: 1}),
      numberField('CPUs', 'cpus', {placeholder: '1'})),
    h('div', {class: 'row'},
      h('label', {class: 'grow'}, 'Network allowlist ',
        h('input', {type: 'text', name: 'allow', placeholder: 'none (e.g. pypi.org, *.example.com:443)',
                    size: 40})),
      h('label', {}, h('input', {type: 'checkbox', name: 'persist', checked: true}),
        ' keep files (persist)'),
      h('button', {type: 'submit', id: 'create-button'}, 'Create session')),
    h('fieldset', {class: 'row', id: 'create-secret'},
      h('legend', {}, 'A secret for a host: the proxy adds it to that host\'s requests; ' +
                      'the code never sees it (the host must be on the allowlist)'),
      h('label', {}, 'Host ',
        h('input', {type: 'text', name: 'secret_host', placeholder: 'api.example.com', size: 20,
                    autocomplete: 'off'})),
      h('label', {}, 'Header ',
        h('input', {type: 'text', name: 'secret_header', placeholder: 'Authorization', size: 14,
                    autocomplete: 'off'})),
      h('label', {class: 'grow'}, 'Value ',
        h('input', {type: 'password', name: 'secret_value', placeholder: 'Bearer ...', size: 24,
                    autocomplete: 'new-password'}))),
    err);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    err.hidden = true;
    const button = form.querySelector('#create-button');
    button.disabled = true;
    try {
      const s = await api('POST', '/v1/sessions', createBody(form));
      form.querySelector('[name=secret_value]').value = ''; // write-only: not kept in the page
      onCreated(s);
    } catch (e) {
      err.textContent = 'Cannot create the session: ' + e.message;
      err.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

function liveRow(s, refresh) {
  const now = Date.now();
  const age = now - Date.parse(s.created_at);
  const idleLeft = Date.parse(s.expires_at) - now;
  const peak = lastPeakKb(s.id);
  const close = async (checkpoint) => {
    try {
      const r = await api('DELETE', '/v1/sessions/' + encodeURIComponent(s.id) +
                          (checkpoint ? '?checkpoint=true' : ''));
      toast(checkpoint ? 'Closed ' + s.id + ' with a checkpoint (' +
                         (r.checkpoint ? bytes(r.checkpoint.stored_bytes) : 'nothing') + ' stored)'
                       : 'Closed ' + s.id);
    } catch (e) {
      toast('Cannot close ' + s.id + ': ' + e.message, 'error');
    }
    broadcast({type: 'sessions'});
    refresh();
  };
  return h('tr', {'data-id': s.id, class: 'session-row'},
    h('td', {}, h('a', {href: '#/s/' + encodeURIComponent(s.id), class: 'sid'}, s.id)),
    h('td', {}, s.language),
    h('td', {}, h('span', {class: 'badge ' + s.status}, s.status)),
    h('td', {}, duration(age)),
    h('td', {}, duration(idleLeft)),
    h('td', {}, s.limits.memory_mb + ' MB' + (peak ? ' (peak ' + bytes(peak * 1024) + ')' : '')),
    h('td', {class: 'num'}, String(s.execution_count)),
    h('td', {class: 'actions'},
      h('a', {href: '#/s/' + encodeURIComponent(s.id), class: 'button'}, 'Open'),
      h('button', {type: 'button', class: 'close', onclick: () => close(false)}, 'Close'),
      h('button', {type: 'button', class: 'checkpoint', onclick: () => close(true)},
        'Close with checkpoint')));
}

// What a stored record kept, in words (docs/PERSISTENCE.md's table).
function keptOf(s) {
  const files = s.checkpoint && typeof s.checkpoint.files === 'number'
    ? s.checkpoint.files + ' file' + (s.checkpoint.files === 1 ? '' : 's') : 'files';
  if (s.variables_stored) return files + ' and variables';
  if (s.state === 'stopped') return files + ' (as of the last cell; no variables)';
  return files;
}

function storedRow(s, refresh) {
  const forget = async () => {
    try {
      await api('DELETE', '/v1/sessions/' + encodeURIComponent(s.id));
    } catch (e) {
      toast('Cannot delete ' + s.id + ': ' + e.message, 'error');
    }
    broadcast({type: 'sessions'});
    refresh();
  };
  return h('tr', {'data-id': s.id, class: 'stored-row'},
    h('td', {'data-label': 'id'}, h('code', {}, s.id)),
    h('td', {'data-label': 'language'}, (s.options && s.options.language) || 'python'),
    h('td', {'data-label': 'ended'}, s.state),
    h('td', {'data-label': 'last used'},
      s.last_used_at ? duration(Date.now() - Date.parse(s.last_used_at)) + ' ago' : '-'),
    h('td', {class: 'num', 'data-label': 'executions'}, String(s.execution_count ?? '-')),
    h('td', {'data-label': 'kept'}, keptOf(s)),
    h('td', {class: 'actions'},
      h('button', {type: 'button', class: 'resume', onclick: () => resume(s.id),
                   'aria-label': 'Resume ' + s.id}, 'Resume'),
      h('button', {type: 'button', class: 'forget', onclick: forget,
                   'aria-label': 'Delete what is kept of ' + s.id}, 'Delete')));
}

function table(cls, head, rows, empty) {
  if (!rows.length) return h('p', {class: 'muted ' + cls + '-empty'}, empty);
  // Each cell carries its column's name, shown beside it where the table is laid out as
  // cards (a narrow screen, console.css).
  for (const tr of rows)
    [...tr.children].forEach((td, i) => { if (head[i] && !td.dataset.label) td.dataset.label = head[i]; });
  return h('table', {class: 'list ' + cls},
    h('thead', {}, h('tr', {}, head.map((t) => h('th', {scope: 'col'}, t || h('span', {class: 'sr-only'}, 'actions'))))),
    h('tbody', {}, rows));
}

export function sessionsView() {
  const live = h('div', {id: 'live-sessions'});
  const stored = h('div', {id: 'stored-sessions'});
  const status = h('span', {class: 'muted', id: 'sessions-status'});
  let timer = null, stopped = false, delay = POLL_MIN_MS, seen = null, page = 0, records = [];

  function showStored() {
    const resumable = records.filter((s) => s.state !== 'live' && s.resumable);
    const hidden = records.filter((s) => s.state !== 'live' && !s.resumable).length;
    const pages = Math.max(1, Math.ceil(resumable.length / PAGE));
    page = Math.min(page, pages - 1);
    const shown = resumable.slice(page * PAGE, (page + 1) * PAGE);
    const pager = resumable.length > PAGE ? h('div', {class: 'pager', role: 'navigation',
                                                      'aria-label': 'Stored sessions pages'},
      h('button', {type: 'button', id: 'stored-prev', disabled: page === 0,
                   onclick: () => { page--; showStored(); }}, 'Newer'),
      h('span', {id: 'stored-page'}, 'page ' + (page + 1) + ' of ' + pages + ' (' +
                                     resumable.length + ' sessions)'),
      h('button', {type: 'button', id: 'stored-next', disabled: page >= pages - 1,
                   onclick: () => { page++; showStored(); }}, 'Older')) : null;
    append(clear(stored), [
      table('stored', ['id', 'language', 'ended', 'last used', 'executions', 'kept', ''],
            shown.map((s) => storedRow(s, () => refresh(true))), 'No stored sessions.'),
      pager,
      hidden ? h('p', {class: 'muted', id: 'stored-hidden'}, hidden + ' more ended without ' +
               'keeping anything (closed without a checkpoint, or created with persist off): ' +
               'nothing to resume.') : null]);
  }

  // fresh: asked for (back into view, told by a tab): the poll starts again from 3 s.
  async function refresh(fresh) {
    clearTimeout(timer);
    timer = null;
    if (stopped) return;
    el.dataset.polls = String(Number(el.dataset.polls || 0) + 1);
    try {
      const r = await api('GET', '/v1/sessions?all=true');
      if (stopped) return;
      // The same answer as last time: nothing to redraw, and the next look comes later.
      const key = JSON.stringify([r.sessions.map((s) => [s.id, s.status, s.execution_count]),
                                  (r.stored || []).map((s) => [s.id, s.state, s.resumable])]);
      if (key === seen && fresh !== true) {
        delay = Math.min(delay * 2, POLL_MAX_MS);
      } else {
        seen = key;
        delay = POLL_MIN_MS;
        clear(live).append(table('live', ['id', 'language', 'state', 'age', 'idle left', 'memory',
                                          'executions', ''],
                                 r.sessions.map((s) => liveRow(s, () => refresh(true))),
                                 'No live sessions. Create one below.'));
        records = r.stored || [];
        showStored();
      }
      status.textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) {
      status.textContent = 'cannot list the sessions: ' + e.message;
    }
    schedule();
  }

  function schedule() {
    clearTimeout(timer);
    timer = stopped || document.hidden ? null : setTimeout(refresh, delay);
    el.dataset.pollMs = timer ? String(delay) : '';
  }
  // Back into view, or told by another tab: at once.
  const onVisible = () => { if (!document.hidden) refresh(true); else schedule(); };
  const onFocus = () => refresh(true);
  document.addEventListener('visibilitychange', onVisible);
  window.addEventListener('focus', onFocus);
  const unlisten = onBroadcast((msg) => { if (msg.type === 'sessions') onFocus(); });

  const el = h('section', {id: 'sessions-view'},
    h('div', {class: 'card'}, h('h1', {}, 'Sessions ', status), live),
    createForm((s) => { broadcast({type: 'sessions'}); location.hash = '#/s/' + encodeURIComponent(s.id); }),
    h('div', {class: 'card'}, h('h2', {}, 'Stored sessions'),
      h('p', {class: 'muted'}, 'Closed with a checkpoint, ended for idleness, or left by a ' +
        'restart: resume one to get a new session with its files (and variables when kept).'),
      stored));
  refresh();
  return {el, stop() {
    stopped = true;
    clearTimeout(timer);
    document.removeEventListener('visibilitychange', onVisible);
    window.removeEventListener('focus', onFocus);
    unlisten();
  }};
}
