// scenarios.mjs - the web console in a real headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core), one scenario per run:  node scenarios.mjs NAME
// Environment: RUNCELL_URL (the server), RUNCELL_LOGIN_URL (the login URL it printed),
// RUNCELL_TOKEN, ARTIFACTS (where screenshots go), SHOTS (where README's go, or empty).
// Prints one JSON line of what it saw; tests/integration/test_console.py asserts on it.
// Every wait is on an element or an event; the timeouts only stop hangs.
import {chromium} from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';

const BASE = process.env.RUNCELL_URL;
const LOGIN = process.env.RUNCELL_LOGIN_URL;
const TOKEN = process.env.RUNCELL_TOKEN;
const ART = process.env.ARTIFACTS;
const SHOTS = process.env.SHOTS || '';
const HANG = Number(process.env.HANG_MS || 120000);
const name = process.argv[2];

const out = {dialogs: [], pageErrors: [], consoleErrors: []};
let shotNo = 0;

async function shot(page, label, readme) {
  const file = path.join(ART, name + '-' + String(++shotNo).padStart(2, '0') + '-' + label + '.png');
  await page.screenshot({path: file, fullPage: true});
  if (readme && SHOTS) fs.copyFileSync(file, path.join(SHOTS, readme));
  (out.shots = out.shots || []).push(file);
}

function watch(page) {
  page.on('dialog', async (d) => { out.dialogs.push(d.message()); await d.dismiss(); });
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

// Types code into the last cell's editor and runs it with Shift+Enter; waits for its record.
async function runCell(page, code, {wait = true} = {}) {
  const cells = page.locator('.cell');
  const n = await cells.count();
  const cell = cells.nth(n - 1);
  await cell.locator('.CodeMirror').click();
  await page.keyboard.insertText(code);
  await page.keyboard.press('Shift+Enter');
  if (wait) await page.waitForSelector(`.cell:nth-child(${n}):not([data-status=running]):not([data-status=new])`);
  return cell;
}

async function cellInfo(cell) {
  return cell.evaluate((el) => ({
    status: el.dataset.status, state: el.dataset.state, count: el.dataset.count,
    prompt: el.querySelector('.prompt').textContent,
    stream: [...el.querySelectorAll('pre.stream')].map((p) => p.textContent).join(''),
    stderr: [...el.querySelectorAll('pre.stream .stderr')].map((p) => p.textContent).join(''),
    texts: [...el.querySelectorAll('pre.result.text')].map((p) => p.textContent),
    images: [...el.querySelectorAll('img.cell-image')].map((i) => ({w: i.naturalWidth,
                                                                    src: i.src.slice(0, 22)})),
    frames: [...el.querySelectorAll('iframe.cell-html')].map((f) => ({
      sandbox: f.getAttribute('sandbox'), hasSrcdoc: f.srcdoc.length > 0})),
    error: el.querySelector('.cell-error .error-head')?.textContent || null,
    traceback: el.querySelector('.cell-error .traceback')?.textContent || null,
    statusLine: el.querySelector('.cell-status').textContent,
  }));
}

async function newSession(page, fields = {}) {
  await page.goto(BASE + '/ui/#/sessions');
  await page.waitForSelector('#create-session');
  for (const [k, v] of Object.entries(fields))
    await page.fill(`#create-session [name=${k}]`, String(v));
  await page.click('#create-button');
  await page.waitForSelector('#notebook .cell .CodeMirror');
  await page.waitForSelector('#notebook .nb-head code');
  return page.evaluate(() => document.querySelector('#notebook').dataset.session);
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
    // A second tab: its own sessionStorage, so it logs in (with the form) and lists the
    // same sessions, kept fresh without a reload.
    const b = await context.newPage();
    watch(b);
    await b.goto(BASE + '/ui/');
    await b.waitForSelector('#login');
    await b.fill('#token-input', TOKEN);
    await b.click('#login button[type=submit]');
    await b.waitForSelector(`#live-sessions tr[data-id="${out.sid}"]`);
    out.secondTabSees = true;
    await shot(b, 'second-tab');
    // Closed in the first tab: it leaves the second's list by itself.
    await a.click('#checkpoint-session');
    await a.waitForSelector('#sessions-view');
    await b.waitForSelector(`#live-sessions tr[data-id="${out.sid}"]`, {state: 'detached'});
    await b.waitForSelector(`#stored-sessions tr[data-id="${out.sid}"]`);
    out.storedInSecond = true;
    await shot(b, 'second-tab-stored');
    // Resume it from the second tab: a new live session with its variables.
    await b.click(`#stored-sessions tr[data-id="${out.sid}"] .resume`);
    await b.waitForSelector('#notebook .cell .CodeMirror');
    out.resumed = await b.evaluate(() => document.querySelector('#notebook').dataset.session);
  },

  async agent(browser) {
    const page = await login(await browser.newContext());
    await page.click('#nav a[data-view=agent]');
    await page.waitForSelector('#agent-form');
    await page.fill('#agent-task', 'Chart the monthly revenue in sales.csv');
    await page.setInputFiles('#agent-files', {name: 'sales.csv', mimeType: 'text/csv',
      buffer: Buffer.from('month,revenue\nJan,120\nFeb,135\nMar,160\nApr,152\nMay,171\n')});
    await page.click('#agent-run');
    await page.waitForSelector('#agent-steps .step-outcome');
    await page.waitForFunction(() => [...document.querySelectorAll('img.agent-chart')]
      .every((i) => i.complete && i.naturalWidth > 0));
    out.steps = await page.locator('#agent-steps .step').evaluateAll(
      (els) => els.map((e) => ({type: e.dataset.type, title: e.querySelector('.step-title').textContent,
                                text: e.textContent.slice(0, 400)})));
    out.answer = await page.textContent('#agent-steps .step-outcome pre.answer');
    out.charts = await page.locator('img.agent-chart').evaluateAll(
      (is) => is.map((i) => ({alt: i.alt, w: i.naturalWidth})));
    out.history = await page.locator('#agent-history li').allTextContents();
    await shot(page, 'agent', 'agent.png');
    // A task the model cannot do: three failures, the fallbacks, a review incident.
    await page.fill('#agent-task', 'Find the average of the empty column');
    await page.setInputFiles('#agent-files', []);
    await page.click('#agent-run');
    await page.waitForSelector('#agent-steps .step-outcome');
    out.failed = {
      steps: await page.locator('#agent-steps .step').evaluateAll(
        (els) => els.map((e) => ({type: e.dataset.type,
                                  title: e.querySelector('.step-title').textContent}))),
      reviewId: await page.textContent('#agent-steps .review-link'),
    };
    await page.waitForFunction(() => document.querySelectorAll('#agent-history li').length === 2);
    out.history = await page.locator('#agent-history li').allTextContents();
    await shot(page, 'agent-failed');
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
console.log(JSON.stringify(out));
process.exit(code);
