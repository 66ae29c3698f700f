// scenarios.mjs - the web console in a real headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core), one scenario per run:  node scenarios.mjs NAME
// Environment: RUNCELL_URL (the server), RUNCELL_LOGIN_URL (the login URL it printed),
// RUNCELL_TOKEN, ARTIFACTS (where screenshots go), SHOTS (where docs/img's go, or empty),
// IPYNB_IN (a notebook made by nbformat, for the import).
// Prints one JSON line of what it saw; tests/integration/test_console.py asserts on it.
// Every wait is on an element or an event; the timeouts only stop hangs. axe-core (pinned
// in package.json) is run in the page by evaluate(), which the page's CSP does not govern.
import {chromium} from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';
import {createRequire} from 'node:module';

const AXE = fs.readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

const BASE = process.env.RUNCELL_URL;
const LOGIN = process.env.RUNCELL_LOGIN_URL;
const TOKEN = process.env.RUNCELL_TOKEN;
const ART = process.env.ARTIFACTS;
const SHOTS = process.env.SHOTS || '';
const HANG = Number(process.env.HANG_MS || 120000);
const name = process.argv[2];

const out = {dialogs: [], beforeunload: [], pageErrors: [], consoleErrors: []};
let shotNo = 0;

async function shot(page, label, readme) {
  const file = path.join(ART, name + '-' + String(++shotNo).padStart(2, '0') + '-' + label + '.png');
  await page.screenshot({path: file, fullPage: true});
  if (readme && SHOTS) fs.copyFileSync(file, path.join(SHOTS, readme));
  (out.shots = out.shots || []).push(file);
}

function watch(page) {
  // A "leave this page?" before a reload is recorded and accepted (the reload goes on);
  // any other dialog is a failure the test reports.
  page.on('dialog', async (d) => {
    if (d.type() === 'beforeunload') { out.beforeunload.push(d.message()); await d.accept(); return; }
    out.dialogs.push(d.message());
    await d.dismiss();
  });
  page.on('pageerror', (e) => out.pageErrors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') out.consoleErrors.push(m.text()); });
  page.setDefaultTimeout(HANG);
  // What the CSP refused, seen from the page (an init script runs before the page's own).
  page.addInitScript(() => {
    window.__cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) =>
      window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));
  });
}

async function login(context) {
  const page = await context.newPage();
  watch(page);
  await page.goto(LOGIN);
  await page.waitForSelector('#sessions-view');
  return page;
}

// axe-core's violations in the page as it is now, by impact; critical and serious in full.
async function axeScan(page, view) {
  if (!(await page.evaluate(() => !!window.axe))) await page.evaluate(AXE);
  const r = await page.evaluate(async () => {
    const res = await window.axe.run(document, {resultTypes: ['violations']});
    return res.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
      nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' ') + ': ' +
                                            (n.failureSummary || '').slice(0, 300))}));
  });
  const out = {view, critical: 0, serious: 0, moderate: 0, minor: 0, bad: []};
  for (const v of r) {
    out[v.impact] = (out[v.impact] || 0) + 1;
    if (v.impact === 'critical' || v.impact === 'serious') out.bad.push(v);
  }
  return out;
}

// The cell that ends at index n (1-based) has a record, or a reason it has none.
const SETTLED = ':not([data-status=running]):not([data-status=queued]):not([data-status=new])';

// Types code into the last cell's editor and runs it with Shift+Enter; waits for its record.
async function runCell(page, code, {wait = true} = {}) {
  const cells = page.locator('.cell');
  const n = await cells.count();
  const cell = cells.nth(n - 1);
  await cell.locator('.CodeMirror').click();
  await page.keyboard.insertText(code);
  await page.keyboard.press('Shift+Enter');
  if (wait) await page.waitForSelector(`.cell:nth-child(${n})${SETTLED}`);
  return cell;
}

async function cellInfo(cell) {
  return cell.evaluate((el) => ({
    status: el.dataset.status, state: el.dataset.state, count: el.dataset.count,
    prompt: el.querySelector('.prompt').textContent,
    stream: [...el.querySelectorAll('pre.stream')].map((p) => p.textContent).join(''),
    streamHtml: [...el.querySelectorAll('pre.stream')].map((p) => p.innerHTML).join(''),
    stderr: [...el.querySelectorAll('pre.stream .stderr')].map((p) => p.textContent).join(''),
    texts: [...el.querySelectorAll('pre.result.text')].map((p) => p.textContent),
    images: [...el.querySelectorAll('img.cell-image')].map((i) => ({w: i.naturalWidth,
                                                                    src: i.src.slice(0, 22)})),
    frames: [...el.querySelectorAll('iframe.cell-html')].map((f) => ({
      sandbox: f.getAttribute('sandbox'), hasSrcdoc: f.srcdoc.length > 0})),
    error: el.querySelector('.cell-error .error-head')?.textContent || null,
    traceback: el.querySelector('.cell-error .traceback')?.textContent || null,
    statusLine: el.querySelector('.cell-status').textContent,
    height: el.getBoundingClientRect().height,
    button: el.querySelector('button.run').textContent,
  }));
}

async function newSession(page, fields = {}) {
  await page.goto(BASE + '/ui/#/sessions');
  await page.waitForSelector('#create-session');
  for (const [k, v] of Object.entries(fields))
    await page.fill(`#create-session [name=${k}]`, String(v));
  await page.click('#create-button');
  await page.waitForSelector('#notebook[data-loaded] .cell .CodeMirror');
  await page.waitForSelector('#notebook .nb-head code');
  return page.evaluate(() => document.querySelector('#notebook').dataset.session);
}

// The page's text in the live region, once it says something matching re.
async function announced(page, re) {
  await page.waitForFunction((src) => new RegExp(src).test(
    document.getElementById('announcer').textContent), re.source);
  return page.textContent('#announcer');
}

// Every control of the page that is shown, each tried as a tap would be (Playwright's
// actionability checks: visible, stable, enabled, and the element itself receives the
// pointer there, nothing covering it), without doing it. Returns the ones that fail.
async function unreachable(page) {
  const sel = 'button:visible, a[href]:visible, select:visible, input:visible, ' +
              'textarea:not([tabindex="-1"]):visible, ' +
              'summary:visible, .CodeMirror:visible';
  const controls = page.locator(sel);
  const n = await controls.count();
  const bad = [];
  for (let i = 0; i < n; i++) {
    const c = controls.nth(i);
    try {
      await c.click({trial: true, timeout: 3000});
    } catch (e) {
      bad.push((await c.evaluate((el) => el.outerHTML.slice(0, 160))) + ': ' +
               String(e.message).split('\n')[0]);
    }
  }
  return {count: n, bad};
}

// Presses Tab until the focus is on selector (at most max times): how many it took, or -1.
async function tabTo(page, selector, max) {
  for (let i = 1; i <= max; i++) {
    await page.keyboard.press('Tab');
    if (await page.evaluate((s) => document.activeElement.matches(s), selector)) return i;
  }
  return -1;
}

// Where the focus is, and whether it shows.
function focusInfo(page) {
  return page.evaluate(() => {
    const a = document.activeElement;
    const cell = a.closest('.cell');
    const cells = [...document.querySelectorAll('.cell')];
    const ring = (el) => { const s = getComputedStyle(el); return s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2; };
    const editor = a.closest('.editor');
    return {tag: a.tagName, cls: String(a.className), cell: cell ? cells.indexOf(cell) + 1 : 0,
            cells: cells.length, isCell: a.classList.contains('cell'), inEditor: !!a.closest('.CodeMirror'),
            ring: editor ? ring(editor) : ring(a), label: a.getAttribute('aria-label'),
            mode: document.getElementById('notebook')?.dataset.mode || null};
  });
}

// Waits for a condition of this process (not the page), checking at each event-loop turn.
async function waitUntil(fn) {
  const end = Date.now() + HANG;
  while (!fn()) {
    if (Date.now() > end) throw new Error('waitUntil: timed out');
    await new Promise((r) => setTimeout(r, 20));
  }
}

// Whether the page scrolls sideways (it must not: everything fits the width).
function overflowX(page) {
  return page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
}

const scenarios = {
  async login(browser) {
    const context = await browser.newContext();
    const page = await login(context);
    out.url = page.url();
    out.stored = await page.evaluate(() => sessionStorage.getItem('runcell.token'));
    out.cookies = await context.cookies();
    out.documentCookie = await page.evaluate(() => document.cookie);
    out.html = await page.content();
    out.historyLength = await page.evaluate(() => history.length);
    out.nav = await page.locator('#nav a').allTextContents();
    await shot(page, 'sessions');
    // A reload keeps the login (sessionStorage) and still puts no token in the URL.
    await page.reload();
    await page.waitForSelector('#sessions-view');
    out.urlAfterReload = page.url();
    // Log out forgets the token.
    await page.click('#logout');
    await page.waitForSelector('#login');
    out.storedAfterLogout = await page.evaluate(() => sessionStorage.getItem('runcell.token'));
    await shot(page, 'logged-out');
  },

  async wrong_token(browser) {
    const context = await browser.newContext();
    const page = await context.newPage();
    watch(page);
    await page.goto(BASE + '/ui/#token=not-the-token-0123456789');
    await page.waitForSelector('#login-error');
    out.message = await page.textContent('#login-error');
    out.url = page.url();
    out.stored = await page.evaluate(() => sessionStorage.getItem('runcell.token'));
    out.navHidden = await page.locator('#nav').isHidden();
    await shot(page, 'refused');
    // The form takes the right token.
    await page.fill('#token-input', TOKEN);
    await page.click('#login button[type=submit]');
    await page.waitForSelector('#sessions-view');
    out.loggedIn = true;
    await shot(page, 'form-login');
    // A create the server refuses: its own words, on the form.
    await page.fill('#create-session [name=memory_mb]', '99999999');
    await page.click('#create-button');
    await page.waitForSelector('#create-error:not([hidden])');
    out.createError = await page.textContent('#create-error');
    await shot(page, 'create-refused');
  },

  async notebook(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page, {memory_mb: 512, timeout_s: 30});
    out.meta = await page.textContent('#notebook .nb-head');
    const c1 = await runCell(page, 'x = 20\nprint("x is", x)\nimport sys\nprint("to stderr", file=sys.stderr)');
    out.c1 = await cellInfo(c1);
    const c2 = await runCell(page, 'x * 2 + 2');
    out.c2 = await cellInfo(c2);
    const c3 = await runCell(page, [
      'import pandas as pd',
      'import matplotlib.pyplot as plt',
      'df = pd.DataFrame({"month": ["Jan", "Feb", "Mar", "Apr", "May"],',
      '                   "revenue": [120, 135, 160, 152, 171]})',
      'ax = df.plot(x="month", y="revenue", marker="o", title="Monthly revenue", legend=False)',
      'ax.set_ylabel("revenue (k$)")',
      'plt.show()',
      'df'].join('\n'));
    out.c3 = await cellInfo(c3);
    await page.waitForFunction(() => [...document.querySelectorAll('img.cell-image')]
      .every((i) => i.complete && i.naturalWidth > 0));
    out.c3.images = (await cellInfo(c3)).images;
    // The DataFrame's table, inside its sandboxed frame.
    const frame = page.frames().find((f) => f !== page.mainFrame());
    out.frameCells = frame ? await frame.locator('td').allTextContents() : null;
    const c4 = await runCell(page, 'def f():\n    return {}["fare"]\nf()');
    out.c4 = await cellInfo(c4);
    out.countBadge = await page.textContent('#nb-count');
    await shot(page, 'notebook', 'notebook.png');
    // History: Ctrl+Up in the new cell brings back the code run last.
    await page.locator('.cell').last().locator('.CodeMirror').click();
    await page.keyboard.press('Control+ArrowUp');
    out.recalled = await page.evaluate(() => {
      const cms = document.querySelectorAll('.CodeMirror');
      return cms[cms.length - 1].CodeMirror.getValue();
    });
    // Syntax highlighting: CodeMirror's Python mode marks keywords.
    out.keywords = await page.locator('.cell .cm-keyword').count();
  },

  async files(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page);
    await page.setInputFiles('#file-input', {name: 'sales.csv', mimeType: 'text/csv',
      buffer: Buffer.from('month,revenue\nJan,120\nFeb,135\nMar,160\n')});
    await page.waitForSelector('.file[data-path="sales.csv"]');
    // Drag and drop: a drop on the panel with a file in its DataTransfer.
    await page.evaluate(() => {
      const dt = new DataTransfer();
      dt.items.add(new File(['a,b\n1,2\n'], 'dropped.csv', {type: 'text/csv'}));
      const panel = document.getElementById('files-panel');
      panel.dispatchEvent(new DragEvent('dragover', {dataTransfer: dt, bubbles: true, cancelable: true}));
      panel.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
    });
    await page.waitForSelector('.file[data-path="dropped.csv"]');
    const c1 = await runCell(page, 'import pandas as pd\nd = pd.read_csv("sales.csv")\n' +
                                   'print(len(d), "rows")\nint(d["revenue"].sum())');
    out.c1 = await cellInfo(c1);
    const c2 = await runCell(page, 'import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\n' +
                                   'plt.savefig("chart.png")\nopen("dropped.csv").read()');
    out.c2 = await cellInfo(c2);
    await page.waitForSelector('.file[data-path="chart.png"]');
    await page.click('.file[data-path="sales.csv"] .preview-file');
    await page.waitForSelector('#file-preview pre.preview-text');
    out.preview = await page.textContent('#file-preview pre.preview-text');
    await page.click('.file[data-path="chart.png"] .preview-file');
    await page.waitForFunction(() => {
      const i = document.querySelector('#file-preview img.preview-image');
      return i && i.complete && i.naturalWidth > 0;
    });
    out.previewImageWidth = await page.evaluate(
      () => document.querySelector('#file-preview img.preview-image').naturalWidth);
    await shot(page, 'files');
    const [dl] = await Promise.all([page.waitForEvent('download'),
                                    page.click('.file[data-path="sales.csv"] .download-file')]);
    out.downloadName = dl.suggestedFilename();
    out.downloaded = fs.readFileSync(await dl.path(), 'utf8');
    await page.click('.file[data-path="dropped.csv"] .delete-file');
    await page.waitForSelector('.file[data-path="dropped.csv"]', {state: 'detached'});
    out.left = await page.locator('.file').evaluateAll((els) => els.map((e) => e.dataset.path));
    // Close: back to the list, where it is gone (and not stored: closed without a checkpoint).
    await page.click('#close-session');
    await page.waitForSelector('#sessions-view #live-sessions :is(table, p)');
    out.stillListed = await page.locator(`#live-sessions tr[data-id="${out.sid}"]`).count();
  },

  async interrupt(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page, {timeout_s: 3});
    await runCell(page, 'n = 0');
    const long = await runCell(page, 'import time\nfor n in range(100000):\n' +
                                     '    print("tick", n, flush=True)\n    time.sleep(0.05)',
                               {wait: false});
    await page.waitForFunction(() => /tick 2\b/.test(
      document.querySelector('.cell[data-status=running] pre.stream')?.textContent || ''));
    await shot(page, 'running');
    await page.click('#interrupt');
    await page.waitForSelector('.cell:nth-child(2)[data-state]');
    out.long = await cellInfo(long);
    const after = await runCell(page, 'n > 2');
    out.after = await cellInfo(after);
    // Past the session's 3 s timeout: interrupted, state kept, and said so.
    const spin = await runCell(page, 'while True:\n    n += 1');
    out.timeout = await cellInfo(spin);
    await shot(page, 'interrupted-and-timeout');
    await page.click('#restart');
    await page.waitForSelector('#notebook[data-restarts="1"]');
    const fresh = await runCell(page, 'n');
    out.restarted = await cellInfo(fresh);
    await shot(page, 'restarted');
  },

  async xss(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page);
    const flag = () => page.evaluate(() => window.__pwned ?? null);
    const c1 = await runCell(page, [
      'print(\'<img src=x onerror="window.__pwned=1;alert(1)">\')',
      'print("<script>window.__pwned=2;alert(2)</script>")',
      'import sys; print(\'<svg onload="window.__pwned=3">\', file=sys.stderr)'].join('\n'));
    out.c1 = await cellInfo(c1);
    const c2 = await runCell(page, [
      'import pandas as pd',
      'pd.DataFrame({"a": [\'<img src=x onerror="top.__pwned=4;alert(4)">\',',
      '                   "<script>top.__pwned=5</script>"]})'].join('\n'));
    out.c2 = await cellInfo(c2);
    const c3 = await runCell(page, [
      'class Page:',
      '    def _repr_html_(self):',
      '        return (\'<b id="bold">bold</b><script>top.__pwned=6;parent.__pwned=6;alert(6)</script>\'',
      '                \'<img src=x onerror="top.__pwned=7;alert(7)">\'',
      '                \'<a id="out" href="javascript:top.__pwned=8" target="_top">x</a>\')',
      'Page()'].join('\n'));
    out.c3 = await cellInfo(c3);
    const c4 = await runCell(page, 'raise ValueError(\'<img src=x onerror="window.__pwned=9">\')');
    out.c4 = await cellInfo(c4);
    const evil = '<img src=x onerror=alert(10)>.csv';
    const c5 = await runCell(page, 'open(' + JSON.stringify(evil) + ', "w").write("a\\n1\\n")\n' +
                                   'print("made")');
    out.c5 = await cellInfo(c5);
    await page.waitForSelector('.file .file-name');
    out.fileNames = await page.locator('.file .file-name').allTextContents();
    out.fileNameHtml = await page.locator('.file .file-name').first().innerHTML();
    await page.locator('.file .preview-file').first().click();
    await page.waitForSelector('#file-preview pre.preview-text');
    // The frames: sandboxed, no scripts ran inside them either.
    const frames = page.frames().filter((f) => f !== page.mainFrame());
    out.frameCount = frames.length;
    out.boldInFrame = [];
    for (const f of frames) {
      const b = await f.locator('#bold').count();
      out.boldInFrame.push(b);
    }
    // A click on the frame's javascript: link must not run in the console either.
    for (const f of frames) {
      if (await f.locator('#out').count()) { await f.locator('#out').click(); break; }
    }
    out.flag = await flag();
    out.cspViolations = await page.evaluate(() => window.__cspViolations ?? null);
    out.frameSandboxes = await page.locator('iframe.cell-html').evaluateAll(
      (fs) => fs.map((f) => f.getAttribute('sandbox')));
    out.streamHtml = await page.locator('pre.stream').first().innerHTML();
    out.tokenInHtml = (await page.content()).includes(TOKEN);
    await shot(page, 'xss');
  },

  async tabs(browser) {
    const context = await browser.newContext();
    const a = await login(context);
    out.sid = await newSession(a);
    const c1 = await runCell(a, 'x = 41\nprint("x is", x)');
    out.c1 = await cellInfo(c1);
    // A second tab: logged in by the first (no form), it lists the same sessions and shows
    // the same notebook.
    const b = await context.newPage();
    watch(b);
    await b.goto(BASE + '/ui/');
    await b.waitForSelector(`#live-sessions tr[data-id="${out.sid}"]`);
    out.secondTabLoginForm = await b.locator('#login').count();
    out.secondTabToken = await b.evaluate(() => sessionStorage.getItem('runcell.token')) === TOKEN;
    await shot(b, 'second-tab');
    await b.goto(BASE + '/ui/#/s/' + encodeURIComponent(out.sid));
    await b.waitForSelector('#notebook[data-loaded] .cell .CodeMirror');
    out.secondTabCells = await b.locator('.cell').evaluateAll((cs) => cs.map((c) => ({
      source: c.querySelector('.CodeMirror').CodeMirror.getValue(),
      stream: [...c.querySelectorAll('pre.stream')].map((p) => p.textContent).join(''),
      prompt: c.querySelector('.prompt').textContent})));
    await b.goto(BASE + '/ui/#/sessions');
    await b.waitForSelector(`#live-sessions tr[data-id="${out.sid}"]`);
    // Closed in the first tab: the second is told at once (no poll waited for).
    await a.click('#checkpoint-session');
    await a.waitForSelector('#sessions-view');
    await b.waitForSelector(`#live-sessions tr[data-id="${out.sid}"]`, {state: 'detached'});
    await b.waitForSelector(`#stored-sessions tr[data-id="${out.sid}"]`);
    out.storedInSecond = true;
    out.kept = await b.textContent(`#stored-sessions tr[data-id="${out.sid}"]`);
    await shot(b, 'second-tab-stored');
    // Resume it from the second tab: a new live session with its variables and its notebook.
    await b.click(`#stored-sessions tr[data-id="${out.sid}"] .resume`);
    await b.waitForSelector('#notebook[data-loaded] .cell .CodeMirror');
    out.resumed = await b.evaluate(() => document.querySelector('#notebook').dataset.session);
    out.resumedSources = await b.locator('.cell .CodeMirror').evaluateAll(
      (es) => es.map((e) => e.CodeMirror.getValue()));
    const again = await runCell(b, 'x + 1');
    out.again = await cellInfo(again);
    // Logging out in one tab logs out the other.
    await b.click('#logout');
    await a.waitForSelector('#login');
    out.firstLoggedOut = await a.evaluate(() => sessionStorage.getItem('runcell.token'));
  },

  async agent(browser) {
    const context = await browser.newContext();
    const page = await login(context);
    await page.click('#nav a[data-view=agent]');
    await page.waitForSelector('#agent-form');
    await page.fill('#agent-task', 'Chart the monthly revenue in sales.csv');
    await page.setInputFiles('#agent-files', {name: 'sales.csv', mimeType: 'text/csv',
      buffer: Buffer.from('month,revenue\nJan,120\nFeb,135\nMar,160\nApr,152\nMay,171\n')});
    await page.click('#agent-run');
    // While it runs: the step that runs says so.
    await page.waitForSelector('#agent-working');
    await page.waitForSelector('#agent-answer');
    await page.waitForFunction(() => [...document.querySelectorAll('img.agent-chart')]
      .every((i) => i.complete && i.naturalWidth > 0));
    out.steps = await page.locator('#agent-steps .step').evaluateAll(
      (els) => els.map((e) => ({type: e.dataset.type, open: e.open, live: Number(e.dataset.live || 0),
                                title: e.querySelector('.step-title').textContent,
                                code: e.querySelector('pre.code').textContent,
                                observation: e.querySelector('.observation-text')?.textContent || ''})));
    out.stepsOpen = await page.evaluate(() => document.getElementById('agent-steps-box').open);
    out.answer = await page.textContent('#agent-answer .answer-text');
    out.answerStrong = await page.locator('#agent-answer .answer-text strong').allTextContents();
    out.answerCount = await page.evaluate((t) => {
      const walk = document.createTreeWalker(document.getElementById('agent-output'), NodeFilter.SHOW_TEXT);
      let n = 0;
      while (walk.nextNode()) if (walk.currentNode.data.includes(t)) n++;
      return n;
    }, 'Revenue rose');
    out.answerFirst = await page.evaluate(() => {
      const a = document.getElementById('agent-answer'), s = document.getElementById('agent-steps-box');
      return !!(a.compareDocumentPosition(s) & Node.DOCUMENT_POSITION_FOLLOWING);
    });
    out.charts = await page.locator('img.agent-chart').evaluateAll(
      (is) => is.map((i) => ({alt: i.alt, w: i.naturalWidth})));
    const [dl] = await Promise.all([page.waitForEvent('download'),
                                    page.click('.agent-file[data-name="chart.png"] .download-produced')]);
    out.downloadName = dl.suggestedFilename();
    out.downloadHead = [...fs.readFileSync(await dl.path()).subarray(0, 4)];
    out.history = await page.locator('#agent-history li').allTextContents();
    out.axe = [await axeScan(page, 'agent')];
    await shot(page, 'agent', 'agent.png');
    await page.emulateMedia({colorScheme: 'dark'});
    out.axe.push(Object.assign(await axeScan(page, 'agent'), {scheme: 'dark'}));
    await page.emulateMedia({colorScheme: 'light'});
    // A task the model cannot do: three failures, the fallbacks, a review incident.
    await page.fill('#agent-task', 'Find the average of the empty column');
    await page.setInputFiles('#agent-files', []);
    await page.click('#agent-run');
    await page.waitForSelector('#agent-answer');
    out.failed = {
      steps: await page.locator('#agent-steps .step').evaluateAll(
        (els) => els.map((e) => ({type: e.dataset.type,
                                  title: e.querySelector('.step-title').textContent}))),
      notes: await page.locator('#agent-steps .step-note').evaluateAll((ns) => ns.map((n) => n.dataset.type)),
      heading: await page.textContent('#agent-answer h3'),
      text: await page.textContent('#agent-answer'),
      stepsOpen: await page.evaluate(() => document.getElementById('agent-steps-box').open),
      reviewId: await page.textContent('#agent-answer .review-link'),
    };
    await page.waitForFunction(() => document.querySelectorAll('#agent-history li').length === 2);
    out.history = await page.locator('#agent-history li').allTextContents();
    await shot(page, 'agent-failed');
  },

  // Keyboard only, from the login to a chart, and the notebook's keys (Jupyter's).
  async keyboard(browser) {
    const page = await (await browser.newContext()).newPage();
    watch(page);
    await page.goto(BASE + '/ui/');
    await page.waitForSelector('#login');
    out.loginFocus = await page.evaluate(() => document.activeElement.id);
    await page.keyboard.type(TOKEN);
    await page.keyboard.press('Enter');
    await page.waitForSelector('#sessions-view #live-sessions :is(table, p)');
    out.tabsToCreate = await tabTo(page, '#create-button', 80);
    await page.keyboard.press('Enter');
    await page.waitForSelector('#notebook[data-loaded] .cell .CodeMirror');
    // A new notebook opens in its first cell's editor.
    await page.waitForFunction(() => !!document.activeElement.closest('.cell:nth-child(1) .CodeMirror'));
    out.startFocus = await focusInfo(page);
    await page.keyboard.type('import matplotlib.pyplot as plt');
    await page.keyboard.press('Enter');
    await page.keyboard.type('plt.plot([1, 4, 2, 5]); plt.title("typed"); plt.show()');
    await page.keyboard.press('Shift+Enter');
    await page.waitForSelector('.cell:nth-child(1)[data-status=ok] img.cell-image');
    out.chart = await page.locator('.cell:nth-child(1) img.cell-image').evaluate((i) => i.naturalWidth);
    out.announced = await announced(page, /Cell 1 finished/);
    // Shift+Enter went on to a new cell, in its editor.
    out.afterRun = await focusInfo(page);
    // Esc: command mode on that cell; Tab then leaves it (no trap), Shift+Tab comes back.
    await page.keyboard.press('Escape');
    out.afterEsc = await focusInfo(page);
    await page.keyboard.press('Tab');
    out.afterTab = await focusInfo(page);
    await page.keyboard.press('Shift+Tab');
    out.afterShiftTab = await focusInfo(page);
    // Up (and k): the cell above; Enter: into its editor; Esc: out again.
    await page.keyboard.press('ArrowUp');
    out.afterUp = await focusInfo(page);
    await page.keyboard.press('k');
    out.afterK = await focusInfo(page);
    await page.keyboard.press('Enter');
    out.afterEnter = await focusInfo(page);
    await page.keyboard.press('Escape');
    await page.keyboard.press('j');
    out.afterJ = await focusInfo(page);
    // b: a new cell below; m: markdown; Enter, type, Shift+Enter renders it.
    await page.keyboard.press('ArrowUp');
    await page.keyboard.press('b');
    out.afterB = await focusInfo(page);
    await page.keyboard.press('m');
    await page.keyboard.press('Enter');
    await page.keyboard.type('## Notes, *typed*');
    await page.keyboard.press('Shift+Enter');
    await page.waitForSelector('.cell:nth-child(2) .md-view h2');
    out.markdown = await page.locator('.cell:nth-child(2) .md-view').innerHTML();
    out.afterMarkdown = await focusInfo(page);
    // a: a new cell above; y: code again; d d: deleted; z: back; d d again.
    await page.keyboard.press('Escape');
    await page.keyboard.press('a');
    out.countAfterA = await page.locator('.cell').count();
    await page.keyboard.press('m');
    out.typeAfterM = await page.evaluate(() => document.activeElement.dataset.type);
    await page.keyboard.press('y');
    out.typeAfterY = await page.evaluate(() => document.activeElement.dataset.type);
    await page.keyboard.press('d');
    await page.keyboard.press('d');
    out.countAfterDD = await page.locator('.cell').count();
    await page.keyboard.press('z');
    out.countAfterZ = await page.locator('.cell').count();
    await page.keyboard.press('d');
    await page.keyboard.press('d');
    // i i interrupts a running cell (the last one, run with Ctrl+Enter).
    await page.keyboard.press('End');
    await page.keyboard.press('Enter');
    await page.keyboard.insertText('import time\nwhile True:\n    time.sleep(0.05)');
    await page.keyboard.press('Control+Enter');
    const last = page.locator('.cell').last();
    await page.waitForSelector('.cell[data-status=running]');
    out.runningButton = await last.locator('button.run').textContent();
    out.header = await page.textContent('#nb-status');
    await page.keyboard.press('Escape');
    await page.keyboard.press('i');
    await page.keyboard.press('i');
    await page.waitForSelector('.cell:last-child[data-state]');
    out.interrupted = await cellInfo(last);
    // h: the list of keys.
    await page.keyboard.press('h');
    out.help = await page.isVisible('#keys-help');
    await shot(page, 'keyboard', 'keyboard.png');
    await page.keyboard.press('h');
    // Focus rings: the focused cell and the focused editor both show one.
    await page.keyboard.press('Enter');
    out.editorFocus = await focusInfo(page);
  },

  // axe-core in every view, light and dark: 0 critical, 0 serious.
  async a11y(browser) {
    out.scans = [];
    for (const scheme of ['light', 'dark']) {
      const context = await browser.newContext({colorScheme: scheme});
      const page = await context.newPage();
      watch(page);
      const scan = async (view) => out.scans.push(Object.assign(await axeScan(page, view), {scheme}));
      await page.goto(BASE + '/ui/');
      await page.waitForSelector('#login');
      await scan('login');
      await page.fill('#token-input', TOKEN);
      await page.click('#login button[type=submit]');
      await page.waitForSelector('#sessions-view #live-sessions :is(table, p)');
      await scan('sessions');
      await newSession(page);
      await runCell(page, 'import sys\nprint("\\x1b[32mgreen\\x1b[0m and \\x1b[1;31mbold red\\x1b[0m")\n' +
                          'print("warning", file=sys.stderr)\n42');
      await runCell(page, 'import pandas as pd\nimport matplotlib.pyplot as plt\n' +
                          'plt.plot([1, 2, 3]); plt.show()\npd.DataFrame({"a": [1, 2]})');
      await runCell(page, '{}["missing"]');
      await page.locator('.cell').last().locator('.CodeMirror').click();
      await page.keyboard.press('Escape');
      await page.keyboard.press('m');
      await page.keyboard.press('Enter');
      await page.keyboard.insertText('# Notes\n\nA [link](https://example.com) and `code`.');
      await page.keyboard.press('Shift+Enter');
      await page.waitForSelector('.md-view h1');
      await page.keyboard.press('Escape');
      await scan('notebook');
      if (scheme === 'dark') {
        out.darkBackground = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
        await shot(page, 'notebook-dark', 'notebook-dark.png');
      }
      await page.setInputFiles('#file-input', {name: 'notes.txt', mimeType: 'text/plain',
                                               buffer: Buffer.from('some notes\n')});
      await page.click('.file[data-path="notes.txt"] .preview-file');
      await page.waitForSelector('#file-preview pre.preview-text');
      await scan('files');
      await page.click('#nav a[data-view=agent]');
      await page.waitForSelector('#agent-form');
      await scan('agent');
      await page.click('#nav a[data-view=health]');
      await page.waitForSelector('#health-figures #fig-status');
      await scan('health');
      await page.click('#nav a[data-view=reviews]');
      await page.waitForSelector('#review-list :is(table, p)');
      await scan('reviews');
      await context.close();
    }
  },

  // A phone's screen: 390 x 844 (and 360 wide): one column, every control reachable.
  async mobile(browser) {
    const context = await browser.newContext({viewport: {width: 390, height: 844}, isMobile: true,
                                              hasTouch: true});
    const page = await login(context);
    out.views = {};
    const check = async (view) => {
      out.views[view] = {overflow: await overflowX(page), reach: await unreachable(page)};
    };
    await check('sessions');
    out.sid = await newSession(page);
    await page.locator('.cell .CodeMirror').first().tap();
    await page.keyboard.insertText('import matplotlib.pyplot as plt\nplt.plot([3, 1, 2]); plt.show()\nprint("tapped")');
    await page.locator('.cell button.run').first().tap();
    await page.waitForSelector(`.cell:nth-child(1)${SETTLED}`);
    out.c1 = await cellInfo(page.locator('.cell').first());
    await page.setInputFiles('#file-input', {name: 'data.csv', mimeType: 'text/csv',
                                             buffer: Buffer.from('a,b\n1,2\n')});
    await page.waitForSelector('.file[data-path="data.csv"]');
    await page.waitForSelector('#toast', {state: 'hidden'});
    out.layout = await page.evaluate(() => {
      const r = (s) => document.querySelector(s).getBoundingClientRect();
      const cells = [...document.querySelectorAll('.cell')];
      return {viewport: innerWidth, cell: r('.cell').width, editor: r('.cell .editor').width,
              cellsBottom: cells[cells.length - 1].getBoundingClientRect().bottom,
              filesTop: r('#files-panel').top};
    });
    await check('notebook');
    await shot(page, 'mobile-notebook', 'mobile.png');
    await page.click('#nav a[data-view=agent]');
    await page.waitForSelector('#agent-form');
    await check('agent');
    await page.click('#nav a[data-view=health]');
    await page.waitForSelector('#health-figures #fig-status');
    await check('health');
    await page.click('#nav a[data-view=reviews]');
    await page.waitForSelector('#review-list :is(table, p)');
    await check('reviews');
    await page.setViewportSize({width: 360, height: 740});
    await page.goto(BASE + '/ui/#/s/' + encodeURIComponent(out.sid));
    await page.waitForSelector('#notebook[data-loaded] .cell .CodeMirror');
    await check('notebook360');
    await page.goto(BASE + '/ui/#/sessions');
    await page.waitForSelector('#live-sessions table');
    await check('sessions360');
    await shot(page, 'mobile-sessions');
  },

  // Queued runs, Stop on the running cell, the header while a cell runs, a failure that
  // empties the queue.
  async running(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page, {timeout_s: 30});
    const c1 = await runCell(page, 'import time\nfor i in range(8):\n    print("step", i, flush=True)\n' +
                                   '    time.sleep(0.25)', {wait: false});
    await page.waitForFunction(() => /step 0/.test(
      document.querySelector('.cell:nth-child(1) pre.stream')?.textContent || ''));
    out.header1 = await page.textContent('#nb-status');
    out.button1 = await c1.locator('button.run').textContent();
    out.button1Label = await c1.locator('button.run').getAttribute('aria-label');
    const c2 = await runCell(page, 'print("second, after", i)', {wait: false});
    await page.waitForSelector('.cell:nth-child(2)[data-status=queued]');
    out.header2 = await page.textContent('#nb-status');
    out.button2 = await c2.locator('button.run').textContent();
    out.queuedAnnounced = await announced(page, /Cell 2 queued/);
    await shot(page, 'queued');
    await page.waitForSelector(`.cell:nth-child(2)${SETTLED}`);
    out.c1 = await cellInfo(c1);
    out.c2 = await cellInfo(c2);
    await page.waitForFunction(() => document.getElementById('nb-status').textContent === 'idle');
    out.header3 = await page.textContent('#nb-status');
    // The running cell's own Stop.
    const c3 = await runCell(page, 'while True:\n    time.sleep(0.05)', {wait: false});
    await page.waitForSelector('.cell:nth-child(3)[data-status=running]');
    await c3.locator('button.run').click();
    await page.waitForSelector(`.cell:nth-child(3)${SETTLED}`);
    out.c3 = await cellInfo(c3);
    // A cell that fails takes the ones queued behind it out of the queue.
    const c4 = await runCell(page, 'time.sleep(0.5)\nraise ValueError("stop here")', {wait: false});
    const c5 = await runCell(page, 'print("never")', {wait: false});
    await page.waitForSelector('.cell:nth-child(5)[data-status=queued]');
    await page.waitForSelector(`.cell:nth-child(5)${SETTLED}`);
    out.c4 = await cellInfo(c4);
    out.c5 = await cellInfo(c5);
    // A queued cell's Stop takes it out of the queue.
    const c6 = await runCell(page, 'time.sleep(1)\nprint("six")', {wait: false});
    const c7 = await runCell(page, 'print("seven")', {wait: false});
    await page.waitForSelector('.cell:nth-child(7)[data-status=queued]');
    await c7.locator('button.run').click();
    await page.waitForSelector(`.cell:nth-child(7)${SETTLED}`);
    await page.waitForSelector(`.cell:nth-child(6)${SETTLED}`);
    out.c6 = await cellInfo(c6);
    out.c7 = await cellInfo(c7);
    out.count = await page.textContent('#nb-count');
    out.beforeUnloadAsked = out.beforeunload.length;
  },

  // A reload while a cell runs: the notebook comes back, and the cell goes on where the
  // server keeps executions (the contract of docs/API.md's console section).
  async reload(browser) {
    const context = await browser.newContext();
    const page = await login(context);
    out.sid = await newSession(page, {timeout_s: 60});
    await runCell(page, 'x = 1');
    await runCell(page, 'import time\nfor i in range(20):\n    print("tick", i, flush=True)\n' +
                        '    time.sleep(0.2)', {wait: false});
    await page.waitForFunction(() => /tick 3\b/.test(
      document.querySelector('.cell:nth-child(2) pre.stream')?.textContent || ''));
    out.durable = await page.evaluate(() => document.getElementById('notebook').dataset.durable || null);
    await page.reload();
    await page.waitForSelector('#notebook[data-loaded] .cell .CodeMirror');
    out.afterReload = await page.locator('.cell').evaluateAll((cs) => cs.map((c) => ({
      source: c.querySelector('.CodeMirror').CodeMirror.getValue(), status: c.dataset.status,
      stream: [...c.querySelectorAll('pre.stream')].map((p) => p.textContent).join('')})));
    await page.waitForSelector(`.cell:nth-child(2)${SETTLED}`);
    out.c2 = await cellInfo(page.locator('.cell:nth-child(2)'));
    out.saved = await page.textContent('#nb-saved');
    // Another tab shows the same notebook.
    const b = await context.newPage();
    watch(b);
    await b.goto(BASE + '/ui/#/s/' + encodeURIComponent(out.sid));
    await b.waitForSelector('#notebook[data-loaded] .cell .CodeMirror');
    await b.waitForSelector(`.cell:nth-child(2)${SETTLED}`);
    out.otherTab = await cellInfo(b.locator('.cell:nth-child(2)'));
  },

  // Long output, colours, \r, HTML that needs scripts, pandas Styler.
  async output(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page);
    const c1 = await runCell(page, 'for i in range(10000):\n    print("line", i)');
    await page.waitForSelector('.cell:nth-child(1) .show-all:not([hidden])');
    out.long = await cellInfo(c1);
    out.long.showAll = await c1.locator('.show-all').textContent();
    out.long.hasLast = out.long.stream.includes('line 9999\n');
    out.long.hasFirst = out.long.stream.startsWith('line 0\nline 1\n');
    delete out.long.stream;
    delete out.long.streamHtml;
    await c1.locator('.show-all').click();
    out.longExpanded = await c1.evaluate((el) => el.getBoundingClientRect().height);
    await c1.locator('.show-all').click();
    out.longCollapsed = await c1.evaluate((el) => el.getBoundingClientRect().height);
    const c2 = await runCell(page, [
      'print("\\x1b[31mred\\x1b[0m \\x1b[1;32mbold green\\x1b[0m \\x1b[44mon blue\\x1b[0m \\x1b[93mbright\\x1b[39m plain")',
      'for i in range(0, 101, 10):',
      '    print(f"\\rprogress {i:3d}%", end="", flush=True)',
      'print()',
      'print("done")'].join('\n'));
    out.c2 = await cellInfo(c2);
    out.spans = await c2.locator('pre.stream span[class]').evaluateAll(
      (ss) => ss.filter((s) => /ansi/.test(s.className)).map((s) => [s.className, s.textContent]));
    const c3 = await runCell(page, [
      'import sys, time',
      'for i in range(5):',
      '    sys.stderr.write(f"\\r{i + 1}/5 [" + "#" * (i + 1) + " " * (4 - i) + "]")',
      '    sys.stderr.flush()',
      '    time.sleep(0.05)',
      'sys.stderr.write("\\n")'].join('\n'));
    out.c3 = await cellInfo(c3);
    const c4 = await runCell(page, [
      'class Fig:',
      '    def _repr_html_(self):',
      '        return (\'<div id="plot" class="plotly-graph-div">Loading...</div>\'',
      '                \'<script src="https://cdn.plot.ly/plotly-2.min.js"></script>\'',
      '                \'<script>top.__pwned = 1; Plotly.newPlot("plot", [])</script>\')',
      'Fig()'].join('\n'));
    out.note = await c4.locator('.script-note').textContent();
    out.saveHtml = await c4.locator('.script-note button').count();
    const c5 = await runCell(page, [
      'import pandas as pd',
      'df = pd.DataFrame({"a": [1, 5, 9]})',
      'style = df.style',
      'paint = getattr(style, "map", None) or style.applymap',
      'styled = paint(lambda v: "background-color: rgb(200, 30, 30); color: white" if v > 4 else "")',
      'class Both:',
      '    def _repr_html_(self):',
      '        return styled.to_html() + "<script>top.__pwned = 2</script>" + \'<p style="color: red" id="attr">attr</p>\'',
      'Both()'].join('\n'));
    await page.waitForFunction(() => document.querySelectorAll('.cell:nth-child(5) iframe.cell-html').length === 1);
    const handle = await c5.locator('iframe.cell-html').elementHandle();
    const frame = await handle.contentFrame();
    await frame.waitForSelector('td');
    out.styler = await frame.locator('td').evaluateAll((tds) => tds.map((td) => [
      td.textContent.trim(), getComputedStyle(td).backgroundColor]));
    out.frameSandbox = await c5.locator('iframe.cell-html').getAttribute('sandbox');
    out.flag = await page.evaluate(() => window.__pwned ?? null);
    await shot(page, 'output', 'output.png');
    // The caps on what a page shows and keeps, at their edges.
    out.caps = await page.evaluate(async () => {
      const {fitDoc, keepOutput} = await import('/ui/doc.js');
      const {Terminal} = await import('/ui/terminal.js');
      const big = {format: 'runcell.notebook', cells: [{outputs: [
        {output_type: 'stream', name: 'stdout', text: 'x'.repeat(3 << 20)},
        {output_type: 'display_data', data: {'text/plain': 'small'}}]}]};
      const fitted = fitDoc(big, 2 << 20);
      const cut = keepOutput({output_type: 'stream', name: 'stdout',
                              text: 'a'.repeat(200000) + 'b'.repeat(200000)});
      const t = new Terminal('stream', 100);
      for (let i = 0; i < 25; i++) t.write('123456789\n', 'stdout');
      return {fittedLength: fitted.length, fittedNote: JSON.parse(fitted).cells[0].outputs[0].text,
              fittedSmall: JSON.parse(fitted).cells[0].outputs[1].data['text/plain'],
              cutLength: cut.text.length, cutHead: cut.text.startsWith('aaaa'),
              cutTail: cut.text.endsWith('bbbb'), cutNote: /\[137856 characters not kept\]/.test(cut.text),
              termShown: t.el.textContent.length, termDropped: t.dropped};
    });
  },

  // Markdown cells rendered safely, export to .ipynb, import one made by nbformat, Run all.
  async ipynb(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page);
    await page.locator('.cell .CodeMirror').first().click();
    await page.keyboard.press('Escape');
    await page.keyboard.press('m');
    await page.keyboard.press('Enter');
    await page.keyboard.insertText('# Sales\n\nSome **bold** and `code`, a [safe link](https://example.com/x), ' +
      '[a bad one](javascript:top.__pwned=1), [another]( JaVa\tScRiPt:top.__pwned=3) and ' +
      '<img src=x onerror="top.__pwned=2"><script>top.__pwned=4</script>\n\n- one\n- two\n\n' +
      '| a | b |\n|---|---|\n| 1 | 2 |\n');
    await page.keyboard.press('Shift+Enter');
    await page.waitForSelector('.cell:nth-child(1) .md-view h1');
    out.md = await page.locator('.cell:nth-child(1) .md-view').evaluate((v) => ({
      h1: v.querySelector('h1')?.textContent, strong: v.querySelector('strong')?.textContent,
      code: v.querySelector('code')?.textContent, items: [...v.querySelectorAll('li')].map((l) => l.textContent),
      cells: [...v.querySelectorAll('td')].map((t) => t.textContent),
      links: [...v.querySelectorAll('a')].map((a) => [a.textContent, a.getAttribute('href'), a.rel, a.target]),
      imgs: v.querySelectorAll('img').length, scripts: v.querySelectorAll('script').length,
      text: v.textContent}));
    for (const s of await page.locator('.cell:nth-child(1) .md-view .md-unsafe-link').all()) await s.click();
    out.flag = await page.evaluate(() => window.__pwned ?? null);
    // Code cells, one in bash.
    const c2 = await runCell(page, 'print("hi")\n21 * 2');
    out.c2 = await cellInfo(c2);
    await page.locator('.cell:nth-child(3) select.cell-lang').selectOption('bash');
    const c3 = await runCell(page, 'echo "from bash"');
    out.c3 = await cellInfo(c3);
    const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#export')]);
    out.exportName = dl.suggestedFilename();
    out.exportPath = path.join(ART, 'exported.ipynb');
    fs.copyFileSync(await dl.path(), out.exportPath);
    // Import a notebook made by nbformat: its cells come after these, not run.
    const before = await page.locator('.cell').count();
    await page.setInputFiles('#import-input', process.env.IPYNB_IN);
    await page.waitForFunction((n) => document.querySelectorAll('.cell').length > n, before);
    out.imported = await page.locator('.cell').evaluateAll((cs) => cs.map((c) => ({
      type: c.dataset.type, lang: c.querySelector('select.cell-lang').value,
      source: c.querySelector('.CodeMirror').CodeMirror.getValue(),
      stream: [...c.querySelectorAll('pre.stream')].map((p) => p.textContent).join('')})));
    // A file that is not a notebook: said, and nothing changes.
    await page.setInputFiles('#import-input', {name: 'bad.ipynb', mimeType: 'application/json',
                                               buffer: Buffer.from('{"nbformat": 3, "cells": []}')});
    await page.waitForSelector('#toast.error');
    out.importError = await page.textContent('#toast');
    // Run all: every code cell, top to bottom.
    await page.click('#run-all');
    await page.waitForFunction(() => [...document.querySelectorAll('.cell[data-type=code]')]
      .filter((c) => c.querySelector('.CodeMirror').CodeMirror.getValue().trim())
      .every((c) => !['running', 'queued', 'new'].includes(c.dataset.status)));
    out.afterRunAll = await page.locator('.cell[data-type=code]').evaluateAll((cs) => cs.map((c) => ({
      status: c.dataset.status, count: c.dataset.count,
      stream: [...c.querySelectorAll('pre.stream')].map((p) => p.textContent).join('')})));
    await shot(page, 'ipynb');
  },

  // The stored sessions: only what can be resumed, what was kept, a page at a time; the
  // list is read again only when something may have changed (the page's clock is Playwright's).
  // A secret given in the create form: sent once to the server, shown nowhere after (the
  // page, the notebook's header and the session's description name its host and header).
  async secret_form(browser) {
    const page = await login(await browser.newContext());
    const value = process.env.SECRET_VALUE;
    const posts = [];
    page.on('request', (r) => {
      if (r.method() === 'POST' && new URL(r.url()).pathname === '/v1/sessions')
        posts.push(r.postData());
    });
    out.sid = await newSession(page, {allow: 'api.example.com', secret_host: 'api.example.com',
                                      secret_header: 'X-Api-Key', secret_value: value});
    out.posted = posts.map((p) => JSON.parse(p));
    out.meta = await page.textContent('#notebook .nb-head');
    // The code's environment has no part of it.
    const c = await runCell(page, 'import os\nprint(any("rctest-console" in v for v in os.environ.values()))');
    out.cell = await cellInfo(c);
    out.valueInPage = (await page.content()).includes(value);
    out.valueInForm = await page.evaluate(() => [...document.querySelectorAll('input')]
      .some((i) => i.value && i.value.length > 0 && i.name === 'secret_value'));
    // Refused when its host is not on the allowlist: the server's words, in the form.
    await page.goto(BASE + '/ui/#/sessions');
    await page.waitForSelector('#create-session');
    await page.fill('#create-session [name=secret_host]', 'other.example.com');
    await page.fill('#create-session [name=secret_value]', value);
    await page.click('#create-button');
    await page.waitForSelector('#create-error:not([hidden])');
    out.refused = await page.textContent('#create-error');
  },

  async sessions_list(browser) {
    const context = await browser.newContext();
    const page = await context.newPage();
    watch(page);
    const lists = [];
    page.on('requestfinished', (r) => { if (r.url().includes('/v1/sessions?all=true')) lists.push(r.url()); });
    await page.clock.install();
    await page.goto(LOGIN);
    await page.waitForSelector('#stored-sessions table');
    const ids = JSON.parse(process.env.SESSIONS_MADE);
    out.rows = await page.locator('#stored-sessions tr.stored-row').evaluateAll(
      (rs) => rs.map((r) => [r.dataset.id, r.querySelector('td[data-label=kept]').textContent]));
    out.page = await page.textContent('#stored-page');
    out.hidden = await page.textContent('#stored-hidden');
    out.closedShown = out.rows.filter((r) => ids.closed.includes(r[0])).length;
    await page.click('#stored-next');
    out.rows2 = await page.locator('#stored-sessions tr.stored-row').evaluateAll((rs) => rs.map((r) => r.dataset.id));
    await shot(page, 'stored-page-2');
    // The poll: 3 s, then twice as long each time nothing changed, at most 60 s.
    out.delays = [];
    for (let i = 0; i < 7; i++) {
      const delay = Number(await page.getAttribute('#sessions-view', 'data-poll-ms'));
      out.delays.push(delay);
      const n = lists.length;
      await page.clock.runFor(delay);
      await waitUntil(() => lists.length > n);
    }
    // Hidden: no poll at all.
    await page.evaluate(() => {
      Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
      document.dispatchEvent(new Event('visibilitychange'));
    });
    const n = lists.length;
    await page.clock.runFor(10 * 60 * 1000);
    out.pollsWhileHidden = lists.length - n;
    // Seen again: read at once, and polled from 3 s again.
    await page.evaluate(() => {
      Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
      document.dispatchEvent(new Event('visibilitychange'));
    });
    await waitUntil(() => lists.length > n);
    out.pollsWhenShown = lists.length - n;
    out.delayWhenShown = Number(await page.getAttribute('#sessions-view', 'data-poll-ms'));
  },

  // A session that ends while its notebook is open: plain words, and a resume that brings
  // back its cells.
  async expiry(browser) {
    const page = await login(await browser.newContext());
    out.sid = await newSession(page, {idle_timeout_s: 2});
    const c1 = await runCell(page, 'kept = "still here"\nprint(kept)');
    out.c1 = await cellInfo(c1);
    await page.waitForSelector('#nb-banner:not([hidden])', {timeout: HANG});
    out.banner = await page.textContent('#nb-banner');
    await shot(page, 'ended');
    await page.click('#banner-resume');
    await page.waitForFunction((sid) => {
      const nb = document.querySelector('#notebook[data-loaded]');
      return nb && nb.dataset.session !== sid;
    }, out.sid);
    out.resumed = await page.evaluate(() => document.querySelector('#notebook').dataset.session);
    out.resumedCells = await page.locator('.cell').evaluateAll((cs) => cs.map((c) => ({
      source: c.querySelector('.CodeMirror').CodeMirror.getValue(),
      stream: [...c.querySelectorAll('pre.stream')].map((p) => p.textContent).join('')})));
    const again = await runCell(page, 'kept');
    out.again = await cellInfo(again);
  },

  async health(browser) {
    const page = await login(await browser.newContext());
    await page.click('#nav a[data-view=health]');
    await page.waitForSelector('#health-figures #fig-status');
    out.figures = await page.locator('#health-figures .figure').evaluateAll((fs) =>
      Object.fromEntries(fs.map((f) => [f.id, f.querySelector('.figure-value').textContent])));
    out.statuses = await page.textContent('#health-statuses');
    await shot(page, 'health');
  },

  async review(browser) {
    const page = await login(await browser.newContext());
    await page.click('#nav a[data-view=reviews]');
    await page.waitForSelector('#review-list .review-row');
    out.rows = await page.locator('#review-list .review-row').evaluateAll(
      (rs) => rs.map((r) => r.dataset.id));
    await page.locator('#review-list .review-row .show-review').first().click();
    await page.waitForSelector('#review-detail .incident');
    out.incident = await page.textContent('#review-detail .incident');
    await shot(page, 'incident');
    await page.fill('#review-note', 'the input was wrong; <b>fixed</b> by hand');
    await page.click('#resolve-button');
    await page.waitForSelector('#review-detail .incident .badge.resolved');
    await page.waitForSelector('#review-list .review-row', {state: 'detached'});
    out.afterText = await page.textContent('#review-detail .incident');
    await shot(page, 'resolved');
  },
};

const browser = await chromium.launch({executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
                                       args: ['--no-sandbox', '--disable-gpu']});
let code = 0;
try {
  await scenarios[name](browser);
} catch (e) {
  out.failure = String(e.stack || e);
  code = 1;
} finally {
  await browser.close();
}
// Written whole before the exit (a pipe takes a large line in several writes).
process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
