// agent.js - the agent view (a task with files, its run streamed step by step, the runs of
// this tab) and the review queue (list, show an incident, resolve it). What the model wrote
// and what the sandbox said are text; charts are shown from the run's own file data.
import {api, stream} from './api.js';
import {clear, h, stripAnsi, toast} from './dom.js';

const RUNS_KEY = 'runcell.agent.runs';
const RUNS_MAX = 20;
const runs = new Map(); // this page's runs, by number: {task, events, outcome}
const IMAGE = {png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif'};

function loadRuns() {
  try { return JSON.parse(sessionStorage.getItem(RUNS_KEY)) || []; } catch (e) { return []; }
}
function saveRun(summary) {
  const list = loadRuns();
  list.unshift(summary);
  try { sessionStorage.setItem(RUNS_KEY, JSON.stringify(list.slice(0, RUNS_MAX))); }
  catch (e) { /* storage full */ }
}

function readBase64(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ''));
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

function step(kind, title, ...body) {
  return h('div', {class: 'step step-' + kind, 'data-type': kind},
    h('div', {class: 'step-title'}, title), ...body);
}

// One streamed event of a run as a card.
function eventCard(ev) {
  switch (ev.type) {
  case 'session':
    return step('session', 'Session', h('code', {}, ev.session_id || 'none'));
  case 'run':
    return step('run', 'Task', h('p', {}, ev.task || ''));
  case 'model':
    return step('model', 'Model, turn ' + ev.step,
      ev.content ? h('p', {class: 'model-text'}, ev.content) : null,
      h('p', {class: 'muted'}, ev.tool_calls + ' tool call(s)' +
                               (ev.finish_reason ? ', ' + ev.finish_reason : '')));
  case 'tool_call':
    return step('code', 'Step ' + ev.step + ': ' + ev.tool + (ev.weak ? ' (weak mode)' : ''),
      h('pre', {class: 'code'}, ev.code || ''));
  case 'observation':
    return step('observation ' + (ev.status === 'ok' ? 'ok' : 'failed'),
      'Observation, step ' + ev.step + ': ' + ev.status +
      (ev.status !== 'ok' ? ' (the model repairs it next)' : ''),
      h('pre', {class: 'observation-text'}, stripAnsi(ev.observation || '')));
  case 'notice':
    return step('notice', 'Notice: ' + (ev.stop || ''), h('p', {}, ev.text || ''));
  case 'fallback':
    return step('fallback', 'Fallback: ' + ev.name + (ev.ran ? '' : ' (not run)'),
      h('p', {}, ev.detail || ''));
  case 'outcome':
    return outcomeCard(ev);
  case 'error':
    return step('error', 'Refused', h('p', {class: 'error'}, (ev.error && ev.error.message) || ''));
  default:
    return step('other', ev.type, h('pre', {}, JSON.stringify(ev, null, 2).slice(0, 4000)));
  }
}

function outcomeCard(o) {
  const files = (o.files || []).map((name) => {
    const data = o.file_data && o.file_data[name];
    const type = IMAGE[(/\.([^.]+)$/.exec(name) || [])[1]];
    return h('div', {class: 'agent-file', 'data-name': name},
      h('div', {class: 'file-name'}, name),
      data && type ? h('img', {class: 'agent-chart', alt: name,
                               src: 'data:' + type + ';base64,' + data}) : null);
  });
  return step('outcome ' + o.outcome, 'Final answer (' + o.outcome + ', ' + o.reason + ')',
    h('pre', {class: 'answer'}, o.answer || o.reason_text || ''),
    o.review_id ? h('p', {}, 'Filed for review: ',
                    h('a', {href: '#/reviews', class: 'review-link'}, o.review_id)) : null,
    (o.fallbacks || []).filter((f) => f.ran).length
      ? h('p', {class: 'muted'}, 'Fallbacks taken: ' +
          o.fallbacks.filter((f) => f.ran).map((f) => f.name).join(', ')) : null,
    files.length ? h('div', {class: 'agent-files'}, files) : null,
    (o.files_omitted || []).length
      ? h('p', {class: 'muted'}, 'Not returned inline: ' +
          o.files_omitted.map((f) => f.name + ' (' + f.reason + ')').join('; ')) : null);
}

export function agentView() {
  const steps = h('div', {class: 'steps', id: 'agent-steps'});
  const history = h('ol', {class: 'runs', id: 'agent-history'});
  const task = h('textarea', {id: 'agent-task', rows: 4, cols: 70,
                              placeholder: 'e.g. chart monthly revenue from sales.csv'});
  const picker = h('input', {type: 'file', multiple: true, id: 'agent-files'});
  const maxSteps = h('input', {type: 'number', id: 'agent-max-steps', min: 1, max: 100,
                               placeholder: '20', size: 4});
  const keep = h('input', {type: 'checkbox', id: 'agent-keep'});
  const runButton = h('button', {type: 'submit', id: 'agent-run'}, 'Run');
  const err = h('p', {class: 'error', id: 'agent-error', role: 'alert', hidden: true});
  let controller = null;

  function showHistory() {
    clear(history);
    for (const r of loadRuns()) {
      history.append(h('li', {'data-run': r.n},
        h('button', {type: 'button', class: 'link', onclick: () => replay(r.n)}, r.task),
        ' ', h('span', {class: 'badge ' + r.outcome}, r.outcome), ' ',
        h('span', {class: 'muted'}, r.reason + ', ' + r.steps + ' step(s), ' +
                                    new Date(r.at).toLocaleTimeString())));
    }
    if (!history.firstChild) history.append(h('li', {class: 'muted'}, 'No runs yet in this tab.'));
  }

  function replay(n) {
    const r = runs.get(n);
    if (!r) { toast('That run was in an earlier page; only its summary is kept.'); return; }
    clear(steps).append(...r.events.map(eventCard));
  }

  const form = h('form', {class: 'card', id: 'agent-form'},
    h('h2', {}, 'Agent'),
    h('p', {class: 'muted'}, 'The model writes code, runcell runs it in a sandboxed session, ' +
      'the model sees what happened and repairs it (docs/AGENT.md).'),
    h('p', {}, task),
    h('div', {class: 'row'}, h('label', {}, 'Files ', picker),
      h('label', {}, 'Max steps ', maxSteps),
      h('label', {}, keep, ' keep the session'), runButton,
      h('button', {type: 'button', id: 'agent-cancel',
                   onclick: () => controller && controller.abort()}, 'Cancel')),
    err);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (!task.value.trim()) return;
    err.hidden = true;
    runButton.disabled = true;
    clear(steps);
    const files = {};
    try {
      for (const f of picker.files) files[f.name] = await readBase64(f);
    } catch (e) {
      err.textContent = 'Cannot read the files: ' + e.message;
      err.hidden = false;
      runButton.disabled = false;
      return;
    }
    const options = {keep_session: keep.checked};
    if (maxSteps.value) options.max_steps = parseInt(maxSteps.value, 10);
    const events = [];
    controller = new AbortController();
    try {
      const last = await stream('/v1/agent/runs', {task: task.value, files, options}, (e) => {
        events.push(e);
        steps.append(eventCard(e));
      }, controller.signal);
      if (last && last.type === 'outcome') {
        const n = Date.now();
        runs.set(n, {events});
        saveRun({n, task: task.value, outcome: last.outcome, reason: last.reason,
                 steps: last.steps, at: n, review_id: last.review_id || null});
        showHistory();
      }
    } catch (e) {
      err.textContent = e.name === 'AbortError' ? 'Cancelled.' : 'The run failed: ' + e.message;
      err.hidden = false;
    } finally {
      runButton.disabled = false;
      controller = null;
    }
  });
  // Files dropped on the form join the task's files.
  form.addEventListener('dragover', (ev) => ev.preventDefault());
  form.addEventListener('drop', (ev) => {
    ev.preventDefault();
    if (ev.dataTransfer && ev.dataTransfer.files.length) picker.files = ev.dataTransfer.files;
  });
  showHistory();
  const el = h('section', {id: 'agent-view'}, form,
    h('div', {class: 'agent-cols'},
      h('div', {class: 'card grow'}, h('h3', {}, 'This run'), steps),
      h('div', {class: 'card side'}, h('h3', {}, 'Runs in this tab'), history)));
  return {el, stop() {}};
}

function incidentView(rec, onResolved) {
  const note = h('input', {type: 'text', id: 'review-note', size: 50,
                           placeholder: 'what was done about it'});
  const form = h('form', {id: 'resolve-form'}, note, ' ',
                 h('button', {type: 'submit', id: 'resolve-button'}, 'Resolve'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (!note.value.trim()) { toast('Say in a note what was done about it.', 'error'); return; }
    try {
      await api('POST', '/v1/reviews/' + encodeURIComponent(rec.id) + '/resolve',
                {note: note.value.trim()});
      toast('Resolved ' + rec.id);
      onResolved();
    } catch (e) {
      toast('Cannot resolve: ' + e.message, 'error');
    }
  });
  return h('div', {class: 'incident', 'data-id': rec.id},
    h('h3', {}, 'Incident ', h('code', {}, rec.id), ' ',
      h('span', {class: 'badge ' + rec.status}, rec.status)),
    h('p', {}, h('strong', {}, 'Task: '), rec.task || ''),
    h('p', {}, h('strong', {}, 'Why: '), (rec.reason || '') +
                                          (rec.reason_text ? ' - ' + rec.reason_text : '')),
    rec.note ? h('p', {}, h('strong', {}, 'Note: '), rec.note) : null,
    (rec.attempts || []).map((a) => h('div', {class: 'attempt'},
      h('div', {class: 'step-title'}, 'Attempt, step ' + a.step + ': ' + a.tool + ', ' + a.status),
      h('pre', {class: 'code'}, a.code || ''),
      a.observation ? h('pre', {class: 'observation-text'}, stripAnsi(a.observation)) : null)),
    rec.status === 'open' ? form : null);
}

export function reviewsView() {
  const list = h('div', {id: 'review-list'});
  const detail = h('div', {class: 'card', id: 'review-detail', hidden: true});
  const filter = h('select', {id: 'review-filter'},
    h('option', {value: 'open'}, 'open'), h('option', {value: 'resolved'}, 'resolved'),
    h('option', {value: ''}, 'all'));
  async function refresh() {
    try {
      const r = await api('GET', '/v1/reviews?limit=100' +
                          (filter.value ? '&status=' + filter.value : ''));
      clear(list);
      if (!r.reviews.length) { list.append(h('p', {class: 'muted'}, 'No incidents.')); return; }
      list.append(h('table', {class: 'list reviews'},
        h('thead', {}, h('tr', {}, ['id', 'when', 'status', 'reason', 'task', '']
                                   .map((t) => h('th', {}, t)))),
        h('tbody', {}, r.reviews.map((v) => h('tr', {'data-id': v.id, class: 'review-row'},
          h('td', {}, h('code', {}, v.id)), h('td', {}, v.created_at),
          h('td', {}, h('span', {class: 'badge ' + v.status}, v.status)),
          h('td', {}, v.reason || ''), h('td', {class: 'task'}, v.task || ''),
          h('td', {}, h('button', {type: 'button', class: 'show-review',
                                   onclick: () => show(v.id)}, 'Show')))))));
    } catch (e) {
      clear(list).append(h('p', {class: 'error'}, 'Cannot read the review queue: ' + e.message));
    }
  }
  async function show(id) {
    try {
      const rec = await api('GET', '/v1/reviews/' + encodeURIComponent(id));
      clear(detail).append(incidentView(rec, () => { show(id); refresh(); }));
      detail.hidden = false;
    } catch (e) {
      toast('Cannot read ' + id + ': ' + e.message, 'error');
    }
  }
  filter.addEventListener('change', refresh);
  refresh();
  const el = h('section', {id: 'reviews-view'},
    h('div', {class: 'card'}, h('h2', {}, 'Review queue ', filter),
      h('p', {class: 'muted'}, 'Agent runs that could not finish are filed here with everything ' +
        'that happened; resolve one with a note once handled.'), list),
    detail);
  return {el, stop() {}};
}
