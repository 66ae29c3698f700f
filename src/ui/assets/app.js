// app.js - the console's entry: login (the token moves from the URL's fragment to
// sessionStorage and out of the address bar; a new tab takes it from a tab already logged
// in, api.js), then one view at a time by the fragment's route: #/sessions, #/s/ID (a
// notebook), #/agent, #/reviews, #/health.
import {api, ApiError, askOtherTabs, broadcast, dropToken, getToken, onBroadcast,
        setToken} from './api.js';
import {clear, h} from './dom.js';
import {sessionsView} from './sessions.js';
import {notebookView} from './notebook.js';
import {agentView, reviewsView} from './agent.js';
import {healthView, healthBadge} from './health.js';

const main = document.getElementById('main');
let current = null; // the view shown: {el, stop()}

// "#token=..." from the login URL `runcell serve` prints: the fragment never reaches the
// server (nor its logs); it is taken and removed from the address bar and the history.
function takeTokenFromUrl() {
  const m = /^#token=([^&]*)/.exec(location.hash);
  if (!m) return;
  try { setToken(decodeURIComponent(m[1])); } catch (e) { setToken(m[1]); }
  history.replaceState(null, '', location.pathname + location.search + '#/sessions');
}

function showLogin(message) {
  if (current && current.stop) current.stop();
  current = null;
  document.getElementById('nav').hidden = true;
  document.getElementById('logout').hidden = true;
  const input = h('input', {type: 'password', id: 'token-input', autocomplete: 'off',
                            placeholder: 'API token', size: 40, 'aria-label': 'API token'});
  const form = h('form', {id: 'login', class: 'card narrow'},
    h('h1', {}, 'Log in to runcell'),
    h('p', {}, 'Open the login URL that ', h('code', {}, 'runcell serve'),
      ' printed when it started, or paste the API token (the file ', h('code', {}, 'token'),
      ' in the server\'s data directory).'),
    message ? h('p', {class: 'error', id: 'login-error', role: 'alert'}, message) : null,
    h('p', {}, input, ' ', h('button', {type: 'submit'}, 'Log in')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (!input.value.trim()) return;
    setToken(input.value.trim());
    start();
  });
  clear(main).append(form);
  input.focus();
}

// Checks the token with a request that needs it.
async function start() {
  if (!getToken()) {
    const t = await askOtherTabs();
    if (t) setToken(t);
  }
  if (!getToken()) return showLogin(null);
  try {
    await api('GET', '/v1/sessions');
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      dropToken();
      return showLogin('The server refused this token (' + e.message.split(';')[0] +
                       '). Check it against DATA/token, or use the login URL the server ' +
                       'printed.');
    }
    return showLogin('Cannot check the token: ' + e.message);
  }
  document.getElementById('nav').hidden = false;
  document.getElementById('logout').hidden = false;
  healthBadge(document.getElementById('health-badge'));
  route();
}

function route() {
  if (!getToken()) return;
  const hash = location.hash || '#/sessions';
  let m, view;
  if ((m = /^#\/s\/([^/]+)$/.exec(hash))) view = notebookView(decodeURIComponent(m[1]));
  else if (hash === '#/agent') view = agentView();
  else if (hash === '#/reviews') view = reviewsView();
  else if (hash === '#/health') view = healthView();
  else view = sessionsView();
  for (const a of document.querySelectorAll('#nav a'))
    a.classList.toggle('active', hash.startsWith('#/' + a.dataset.view) ||
                                 (a.dataset.view === 'sessions' && hash.startsWith('#/s/')));
  if (current && current.stop) current.stop();
  current = view;
  clear(main).append(view.el);
}

window.addEventListener('hashchange', () => {
  if (/^#token=/.test(location.hash)) { takeTokenFromUrl(); start(); return; }
  route();
});
window.addEventListener('runcell:unauthorized', () => {
  dropToken();
  showLogin('The server no longer accepts this token (it was changed or the server ' +
            'restarted with another one). Log in again.');
});
document.getElementById('logout').addEventListener('click', () => {
  dropToken();
  broadcast({type: 'logout'});
  showLogin(null);
});
// Logged out in another tab: here too.
onBroadcast((msg) => {
  if (msg.type === 'logout' && getToken()) {
    dropToken();
    showLogin('Logged out (in another tab).');
  }
});

takeTokenFromUrl();
start();
