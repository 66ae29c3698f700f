// sessions.js - the sessions view: live sessions (refreshed every few seconds, so another
// tab's sessions show up too), the create form, and the stored sessions one can resume.
import {api} from './api.js';
import {bytes, clear, duration, h, toast} from './dom.js';
import {lastPeakKb} from './notebook.js';

const REFRESH_MS = 3000;

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
    err);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    err.hidden = true;
    const button = form.querySelector('#create-button');
    button.disabled = true;
    try {
      const s = await api('POST', '/v1/sessions', createBody(form));
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

function storedRow(s, refresh) {
  const resume = async () => {
    try {
      const n = await api('POST', '/v1/sessions', {resume_from: s.id});
      toast('Resumed ' + s.id + ' as ' + n.id);
      location.hash = '#/s/' + encodeURIComponent(n.id);
    } catch (e) {
      toast('Cannot resume ' + s.id + ': ' + e.message, 'error');
    }
  };
  const forget = async () => {
    try {
      await api('DELETE', '/v1/sessions/' + encodeURIComponent(s.id));
    } catch (e) {
      toast('Cannot delete ' + s.id + ': ' + e.message, 'error');
    }
    refresh();
  };
  return h('tr', {'data-id': s.id, class: 'stored-row'},
    h('td', {}, h('code', {}, s.id)),
    h('td', {}, (s.options && s.options.language) || 'python'),
    h('td', {}, s.state),
    h('td', {}, s.last_used_at ? duration(Date.now() - Date.parse(s.last_used_at)) + ' ago' : '-'),
    h('td', {class: 'num'}, String(s.execution_count ?? '-')),
    h('td', {}, s.variables_stored ? 'files and variables' : 'files'),
    h('td', {class: 'actions'},
      s.resumable ? h('button', {type: 'button', class: 'resume', onclick: resume}, 'Resume') : null,
      h('button', {type: 'button', class: 'forget', onclick: forget}, 'Delete')));
}

function table(cls, head, rows, empty) {
  if (!rows.length) return h('p', {class: 'muted ' + cls + '-empty'}, empty);
  return h('table', {class: 'list ' + cls},
    h('thead', {}, h('tr', {}, head.map((t) => h('th', {}, t)))),
    h('tbody', {}, rows));
}

export function sessionsView() {
  const live = h('div', {id: 'live-sessions'});
  const stored = h('div', {id: 'stored-sessions'});
  const status = h('span', {class: 'muted', id: 'sessions-status'});
  let timer = null, stopped = false;

  async function refresh() {
    clearTimeout(timer);
    try {
      const r = await api('GET', '/v1/sessions?all=true');
      if (stopped) return;
      clear(live).append(table('live', ['id', 'language', 'state', 'age', 'idle left', 'memory',
                                        'executions', ''],
                               r.sessions.map((s) => liveRow(s, refresh)),
                               'No live sessions. Create one below.'));
      const resumable = (r.stored || []).filter((s) => s.state !== 'live');
      clear(stored).append(table('stored', ['id', 'language', 'state', 'last used',
                                            'executions', 'kept', ''],
                                 resumable.map((s) => storedRow(s, refresh)),
                                 'No stored sessions.'));
      status.textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) {
      status.textContent = 'cannot list the sessions: ' + e.message;
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }

  const el = h('section', {id: 'sessions-view'},
    h('div', {class: 'card'}, h('h2', {}, 'Sessions ', status), live),
    createForm((s) => { location.hash = '#/s/' + encodeURIComponent(s.id); }),
    h('div', {class: 'card'}, h('h2', {}, 'Stored sessions'),
      h('p', {class: 'muted'}, 'Closed with a checkpoint, expired or left by a restart: ' +
        'resume one to get a new session with its files (and variables when stored).'),
      stored));
  refresh();
  return {el, stop() { stopped = true; clearTimeout(timer); }};
}
