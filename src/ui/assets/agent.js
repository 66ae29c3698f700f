// agent.js - the agent view as a conversation (the task, then the answer once, rendered as
// markdown safely, with the files the run produced to download; below it how the run got
// there, each step collapsible: the code, its output live while it runs, what the model was
// shown) and the review queue (list, show an incident, resolve it). What the model wrote and
// what the sandbox said are text or safe markdown (markdown.js); charts are shown from the
// run's own file data.
import {api, stream} from './api.js';
import {b64ToBlob, clear, h, saveBlob, toast} from './dom.js';
import {renderMarkdown} from './markdown.js';
import {outputBox} from './render.js';
import {Terminal} from './terminal.js';

const RUNS_KEY = 'runcell.agent.runs';
const RUNS_MAX = 20;
const LIVE_CAP = 256 << 10; // characters of a step's live output shown
const runs = new Map(); // this page's runs, by number: {task, events}
const IMAGE = {png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif',
               webp: 'image/webp'};
const REASONS = {
  retries_exhausted: 'the code kept failing', no_progress: 'the model made no progress',
  known_unfixable: 'the error is one that cannot be fixed by retrying',
  max_steps: 'it used all its steps', max_time: 'it ran out of time',
  max_tokens: 'it used all its tokens', model_error: 'the model answered with an error',
  model_unreachable: 'the model could not be reached',
  model_misconfigured: 'the model is not set up on this server',
  sandbox_failed: 'the sandbox failed', doomed: 'the task cannot succeed as asked',
  cancelled: 'it was cancelled',
};

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

function textOut(text, cls, what) {
  const t = new Terminal(cls);
  t.write(text);
  t.el.dataset.lines = String(t.lineCount());
  return outputBox(t.el, what);
}

// The files of an outcome: each downloadable, images shown.
function producedFiles(o) {
  const names = o.files || [];
  if (!names.length) return null;
  return h('div', {class: 'agent-files'}, h('h3', {}, 'Files it made'),
    h('ul', {class: 'file-list'}, names.map((name) => {
      const data = o.file_data && o.file_data[name];
      const type = IMAGE[((/\.([^.]+)$/.exec(name) || [])[1] || '').toLowerCase()];
      const omitted = (o.files_omitted || []).find((f) => f.name === name);
      return h('li', {class: 'agent-file', 'data-name': name},
        h('span', {class: 'file-name'}, name), ' ',
        data ? h('button', {type: 'button', class: 'download-produced',
                            'aria-label': 'Download ' + name,
                            onclick: () => saveBlob(name.split('/').pop(), b64ToBlob(data))},
                 'Download')
             : h('span', {class: 'muted'}, omitted ? 'not sent inline: ' + omitted.reason +
                 (o.session_id ? '; it is in the kept session' : '; run with "keep the session" to fetch it')
                 : 'not sent inline'),
        data && type ? h('img', {class: 'agent-chart', alt: name,
                                 src: 'data:' + type + ';base64,' + data}) : null);
    })),
    o.session_id ? h('p', {}, 'The session is kept: ',
                     h('a', {href: '#/s/' + encodeURIComponent(o.session_id)}, 'open it')) : null);
}

// The answer card of an outcome: the answer once, how the run ended, its files.
function answerCard(o, codeSteps) {
  const answered = o.outcome === 'answered';
  const ran = (o.fallbacks || []).filter((f) => f.ran);
  const secs = typeof o.wall_ms === 'number' ? ', ' + (o.wall_ms / 1000).toFixed(1) + ' s' : '';
  return h('div', {class: 'msg answer ' + o.outcome, id: 'agent-answer', 'data-outcome': o.outcome},
    h('h3', {}, answered ? 'Answer' : o.outcome === 'cancelled' ? 'Cancelled' : 'Could not finish'),
    answered ? renderMarkdown(o.answer || '', 'answer-text')
             : h('p', {class: 'answer-text'}, 'It stopped because ' + (REASONS[o.reason] || o.reason) +
                 (o.reason_text ? ': ' + o.reason_text : '.')),
    !answered && o.answer ? renderMarkdown(o.answer, 'answer-text') : null,
    h('p', {class: 'muted run-facts'}, codeSteps + ' step' + (codeSteps === 1 ? '' : 's') + ' of code' + secs +
      (o.weak_mode ? ', in weak mode' : '')),
    o.review_id ? h('p', {}, 'Filed for review: ',
                    h('a', {href: '#/reviews', class: 'review-link'}, o.review_id)) : null,
    ran.length ? h('p', {class: 'muted'}, 'Fallbacks taken: ' + ran.map((f) => f.name).join(', ')) : null,
    producedFiles(o));
}

// A run as it streams: the conversation's parts, updated by each event.
class RunView {
  constructor(task, fileNames) {
    this.stepsList = h('div', {class: 'steps-list', id: 'agent-steps'});
    this.live = h('p', {class: 'msg working', id: 'agent-working', role: 'status'}, 'Starting...');
    this.stepsBox = h('details', {class: 'steps', id: 'agent-steps-box', open: true},
      h('summary', {}, h('span', {class: 'steps-title'}, 'How it got there')), this.stepsList);
    this.el = h('div', {class: 'conversation', id: 'agent-conversation'},
      h('div', {class: 'msg user'}, h('h3', {}, 'Task'), h('p', {class: 'task-text'}, task),
        fileNames.length ? h('p', {class: 'muted'}, 'with ' + fileNames.join(', ')) : null),
      this.live, this.stepsBox);
    this.steps = new Map();
    this.pendingText = null;
    this.count = 0;
  }

  step(n) { return this.steps.get(n); }

  add(ev) {
    switch (ev.type) {
    case 'model':
      // A turn with tool calls may say why; the last turn's text is the answer, shown once.
      if (ev.tool_calls && ev.content) this.pendingText = ev.content;
      break;
    case 'tool_call': return this.toolCall(ev);
    case 'output': return this.output(ev);
    case 'observation': return this.observation(ev);
    case 'notice':
      this.stepsList.append(h('p', {class: 'step-note', 'data-type': 'notice'}, ev.text || ''));
      break;
    case 'fallback':
      this.stepsList.append(h('p', {class: 'step-note', 'data-type': 'fallback'},
        'Fallback ' + ev.name + (ev.ran ? '' : ' (not run)') + ': ' + (ev.detail || '')));
      break;
    case 'outcome': return this.outcome(ev);
    case 'error':
      this.finish();
      this.live.replaceWith(h('div', {class: 'msg answer failed', id: 'agent-answer'},
        h('h3', {}, 'Refused'), h('p', {class: 'error'}, (ev.error && ev.error.message) || '')));
      break;
    default:
      break;
    }
  }

  toolCall(ev) {
    const code = ev.code || '';
    const s = {started: Date.now(), status: h('span', {class: 'step-status badge busy'}, 'running'),
               liveTerm: null, body: null};
    s.body = h('div', {class: 'step-body'},
      this.pendingText ? renderMarkdown(this.pendingText, 'model-text') : null,
      h('details', {class: 'step-code', open: true},
        h('summary', {}, 'Code (' + code.split('\n').length + ' lines)'),
        h('pre', {class: 'code'}, code)));
    this.pendingText = null;
    s.el = h('details', {class: 'step', 'data-type': 'code', 'data-step': ev.step, open: true},
      h('summary', {}, h('span', {class: 'step-title'}, 'Step ' + ev.step + ': ' + ev.tool +
                        (ev.weak ? ' (weak mode)' : '')), ' ', s.status),
      s.body);
    this.steps.set(ev.step, s);
    this.stepsList.append(s.el);
    this.count = ev.step;
    this.running = s;
    this.tick();
  }

  output(ev) {
    const s = this.step(ev.step) || this.running;
    if (!s) return;
    if (!s.liveTerm) {
      s.liveTerm = new Terminal('live-output', LIVE_CAP);
      s.liveBox = outputBox(s.liveTerm.el, 'output of step ' + ev.step + ' so far');
      s.body.append(h('div', {class: 'step-live'}, h('p', {class: 'muted'}, 'Output so far'), s.liveBox));
    }
    s.liveTerm.write(ev.data || '', ev.stream === 'stderr' ? 'stderr' : 'stdout');
    s.el.dataset.live = String(Number(s.el.dataset.live || 0) + String(ev.data || '').length);
    s.liveBox.update();
  }

  observation(ev) {
    const s = this.step(ev.step);
    if (!s) return;
    const ok = ev.status === 'ok';
    s.el.dataset.type = 'observation ' + (ok ? 'ok' : 'failed');
    s.status.textContent = ok ? 'ok' : ev.status;
    s.status.className = 'step-status badge ' + (ok ? 'ok' : 'error');
    if (s.liveBox) s.liveBox.parentElement.remove();
    s.body.append(h('div', {class: 'step-observation'}, h('p', {class: 'muted'}, 'What the model was shown'),
                        textOut(ev.observation || '', 'observation-text', 'observation of step ' + ev.step)));
    s.el.open = !ok;
    this.running = null;
    this.tick();
  }

  tick() {
    clearTimeout(this.timer);
    const s = this.running;
    this.live.textContent = s ? 'Working: step ' + this.count + ' is running (' +
                                Math.round((Date.now() - s.started) / 1000) + ' s)'
                              : 'Working: the model is thinking (step ' + (this.count + 1) + ')';
    this.timer = setTimeout(() => this.tick(), 1000);
  }

  finish() { clearTimeout(this.timer); this.running = null; }

  outcome(o) {
    this.finish();
    this.live.replaceWith(answerCard(o, this.count));
    const title = this.stepsBox.querySelector('.steps-title');
    title.textContent = 'How it got there: ' + this.count + ' step' + (this.count === 1 ? '' : 's');
    this.stepsBox.open = o.outcome !== 'answered';
  }
}

export function agentView() {
  const convo = h('div', {id: 'agent-output'}, h('p', {class: 'muted'}, 'No run yet: give it a task above.'));
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
        h('span', {class: 'muted'}, r.steps + ' step' + (r.steps === 1 ? '' : 's') + ' of code, ' +
                                    new Date(r.at).toLocaleTimeString())));
    }
    if (!history.firstChild) history.append(h('li', {class: 'muted'}, 'No runs yet in this tab.'));
  }

  function replay(n) {
    const r = runs.get(n);
    if (!r) { toast('That run was in an earlier page; only its summary is kept.'); return; }
    const view = new RunView(r.task, r.files);
    for (const e of r.events) view.add(e);
    view.finish();
    clear(convo).append(view.el);
  }

  const form = h('form', {class: 'card', id: 'agent-form'},
    h('h1', {}, 'Agent'),
    h('p', {class: 'muted'}, 'The model writes code, runcell runs it in a sandboxed session, ' +
      'the model sees what happened and repairs it (docs/AGENT.md).'),
    h('p', {}, h('label', {for: 'agent-task'}, 'Task'), h('br'), task),
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
    const view = new RunView(task.value, Object.keys(files));
    clear(convo).append(view.el);
    controller = new AbortController();
    try {
      const last = await stream('/v1/agent/runs', {task: task.value, files, options}, (e) => {
        events.push(e);
        view.add(e);
      }, controller.signal);
      if (last && last.type === 'outcome') {
        const n = Date.now();
        runs.set(n, {task: task.value, files: Object.keys(files), events});
        saveRun({n, task: task.value, outcome: last.outcome, reason: last.reason,
                 steps: view.count, at: n, review_id: last.review_id || null});
        showHistory();
      }
    } catch (e) {
      view.finish();
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
      h('div', {class: 'card grow'}, h('h2', {}, 'This run'), convo),
      h('div', {class: 'card side'}, h('h2', {}, 'Runs in this tab'), history)));
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
      a.observation ? textOut(a.observation, 'observation-text', 'observation') : null)),
    rec.status === 'open' ? form : null);
}

export function reviewsView() {
  const list = h('div', {id: 'review-list'});
  const detail = h('div', {class: 'card', id: 'review-detail', hidden: true});
  const filter = h('select', {id: 'review-filter', 'aria-label': 'Which incidents'},
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
    h('div', {class: 'card'}, h('h1', {}, 'Review queue ', filter),
      h('p', {class: 'muted'}, 'Agent runs that could not finish are filed here with everything ' +
        'that happened; resolve one with a note once handled.'), list),
    detail);
  return {el, stop() {}};
}
