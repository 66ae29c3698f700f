// health.js - the server at a glance, from /healthz and the figures of /metrics (the same a
// Prometheus scrape gets), with the memory the live sessions may take (their limits).
import {api, metrics} from './api.js';
import {clear, h} from './dom.js';

function figure(label, value, id) {
  return h('div', {class: 'figure', id},
    h('div', {class: 'figure-value'}, String(value)), h('div', {class: 'figure-label'}, label));
}

export function healthView() {
  const grid = h('div', {class: 'figures', id: 'health-figures'});
  const statuses = h('table', {class: 'list', id: 'health-statuses'});
  const note = h('p', {class: 'muted'});
  let timer = null, stopped = false;
  async function refresh() {
    try {
      const [hz, m, list] = await Promise.all([api('GET', '/healthz'), metrics(),
                                               api('GET', '/v1/sessions')]);
      if (stopped) return;
      const reserved = list.sessions.reduce((a, s) => a + s.limits.memory_mb, 0);
      const busy = list.sessions.filter((s) => s.status === 'busy').length;
      clear(grid).append(
        figure('status', hz.status, 'fig-status'),
        figure('live sessions', m.runcell_sessions_live ?? hz.sessions, 'fig-sessions'),
        figure('busy sessions', busy, 'fig-busy'),
        figure('executions running', m.runcell_executions_running ?? 0, 'fig-running'),
        figure('pool ready', m.runcell_pool_ready ?? 0, 'fig-pool'),
        figure('template', m.runcell_template_ready_seconds
          ? 'ready in ' + m.runcell_template_ready_seconds.toFixed(2) + ' s' : 'none',
          'fig-template'),
        figure('memory the live sessions may take', reserved + ' MB', 'fig-memory'),
        figure('sandbox failures', m.runcell_sandbox_failures_total ?? 0, 'fig-failures'));
      clear(statuses).append(h('thead', {}, h('tr', {}, h('th', {}, 'executions by status'),
                                                   h('th', {}, 'count'))),
        h('tbody', {}, Object.entries(m)
          .filter(([k]) => k.startsWith('runcell_executions_total{'))
          .map(([k, v]) => h('tr', {}, h('td', {}, k.replace(/^.*status="([^"]*)".*$/, '$1')),
                             h('td', {class: 'num'}, String(v))))));
      note.textContent = 'from /healthz and /metrics at ' + new Date().toLocaleTimeString();
    } catch (e) {
      note.textContent = 'cannot read the figures: ' + e.message;
    }
    if (!stopped) timer = setTimeout(refresh, 5000);
  }
  refresh();
  const el = h('section', {id: 'health-view', class: 'card'}, h('h1', {}, 'Health'), grid,
               statuses, note);
  return {el, stop() { stopped = true; clearTimeout(timer); }};
}

// The header's one-line summary, kept fresh while the page is open.
export function healthBadge(el) {
  async function tick() {
    try {
      const hz = await api('GET', '/healthz');
      el.textContent = hz.status + ' · ' + hz.sessions + ' session(s)';
    } catch (e) {
      el.textContent = 'server unreachable';
    }
  }
  if (!healthBadge.timer) healthBadge.timer = setInterval(tick, 10000);
  tick();
}
