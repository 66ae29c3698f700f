// scenarios.mjs - E2B's own SDK (@e2b/code-interpreter, e2b) against runcell serve --e2b.
// `node scenarios.mjs NAME` runs one scenario with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY pointing at runcell, and prints one JSON line: what the SDK returned (or the
// error it threw), for tests/integration/test_e2b.py to assert on.
import { Sandbox, CommandExitError, NotFoundError, SandboxNotFoundError, TimeoutError, Volume,
  Secret, Template } from '@e2b/code-interpreter'
import http from 'node:http'

// A request to the runcell server (E2B_SANDBOX_URL) for a URL whose host the SDK made: the
// test has no DNS for *.DOMAIN, so the host goes in the Host header.
function viaServer(url, { method = 'GET', body, headers = {} } = {}) {
  const server = new URL(process.env.E2B_SANDBOX_URL)
  const u = new URL(url)
  return new Promise((resolve, reject) => {
    const rq = http.request({ host: server.hostname, port: server.port, method,
      path: u.pathname + u.search, headers: { ...headers, Host: u.host } }, res => {
      const chunks = []
      res.on('data', c => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers,
                                     body: Buffer.concat(chunks).toString() }))
    })
    rq.on('error', reject)
    rq.end(body)
  })
}

function errorInfo(e) {
  return { name: e?.constructor?.name, message: String(e?.message ?? e),
           notFound: e instanceof NotFoundError || e instanceof SandboxNotFoundError,
           timeout: e instanceof TimeoutError }
}

function resultInfo(r) {
  return { text: r.text, html: r.html, png: r.png, isMainResult: r.isMainResult,
           formats: r.formats() }
}

function executionInfo(x) {
  return { text: x.text, results: x.results.map(resultInfo), stdout: x.logs.stdout,
           stderr: x.logs.stderr, error: x.error ? { name: x.error.name, value: x.error.value,
           traceback: x.error.traceback } : null, executionCount: x.executionCount }
}

const scenarios = {
  async state(sbx) {
    const a = await sbx.runCode('x = 41')
    const b = await sbx.runCode('x += 1\nx')
    const info = await Sandbox.getInfo(sbx.sandboxId)
    const running = await sbx.isRunning()
    return { a: executionInfo(a), b: executionInfo(b), info, running }
  },
  async dataframe(sbx) {
    const x = await sbx.runCode(
      "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    return executionInfo(x)
  },
  async chart(sbx) {
    const x = await sbx.runCode(
      "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()")
    return executionInfo(x)
  },
  async error(sbx) {
    const x = await sbx.runCode('def f():\n    return {}["fare"]\nf()')
    const after = await sbx.runCode('1 + 1')
    return { x: executionInfo(x), after: executionInfo(after) }
  },
  async timeout(sbx) {
    await sbx.runCode('n = 7')
    let thrown = null
    const t0 = Date.now()
    try {
      await sbx.runCode('import time\nwhile True:\n    time.sleep(0.05)', { timeoutMs: 1500 })
    } catch (e) {
      thrown = errorInfo(e)
    }
    // The client went away: runcell interrupts the cell as it notices the hang-up. The next
    // call, sent at once, waits its turn behind the interrupt and runs: one try, no retry.
    let after = null
    try {
      after = executionInfo(await sbx.runCode('n'))
    } catch (e) {
      after = errorInfo(e)
    }
    return { thrown, after, elapsedMs: Date.now() - t0 }
  },
  async streaming(sbx) {
    // The cell waits for a file that only the onStdout callback writes: it can end only if
    // its first line reached the callback while it ran.
    const seen = []
    const x = await sbx.runCode(
      "import os, sys, time\nprint('ready', flush=True)\n" +
      "while not os.path.exists('go'):\n    time.sleep(0.02)\nprint('oops', file=sys.stderr)\n'end'",
      { onStdout: async m => { seen.push(['out', m.line]); await sbx.files.write('/home/user/go', '') },
        onStderr: m => seen.push(['err', m.line]), onResult: r => seen.push(['result', r.text]) })
    return { seen, x: executionInfo(x) }
  },
  async files(sbx) {
    const w = await sbx.files.write('/home/user/data/hello.txt', 'hello from e2b\n')
    const read = await sbx.files.read('/home/user/data/hello.txt')
    const bytes = await sbx.files.write('bin.dat', new Uint8Array([0, 1, 2, 255]).buffer)
    const readBytes = Array.from(await sbx.files.read('/home/user/bin.dat', { format: 'bytes' }))
    const list = (await sbx.files.list('/home/user/data')).map(e => ({ name: e.name,
      type: e.type, path: e.path, size: e.size }))
    const made = await sbx.files.makeDir('/home/user/sub/dir')
    const madeAgain = await sbx.files.makeDir('/home/user/sub/dir')
    const madeRoot = await sbx.files.makeDir('/home/user')
    const exists = await sbx.files.exists('/home/user/data/hello.txt')
    const renamed = await sbx.files.rename('/home/user/data/hello.txt', '/home/user/sub/hi.txt')
    const fromCode = await sbx.runCode("open('sub/hi.txt').read()")
    await sbx.files.remove('/home/user/sub')
    const stillThere = await sbx.files.exists('/home/user/sub/hi.txt')
    let missing = null
    try { await sbx.files.read('/home/user/nope.txt') } catch (e) { missing = errorInfo(e) }
    let outside = null
    try { await sbx.files.read('/etc/passwd') } catch (e) { outside = errorInfo(e) }
    return { w, read, bytes, readBytes, list, made, madeAgain, madeRoot, exists, renamed: renamed.path,
             fromCode: fromCode.text, stillThere, missing, outside }
  },
  async commands(sbx) {
    const out = []
    const streamed = []
    const live = await sbx.commands.run('echo ready; while [ ! -e go ]; do sleep 0.02; done; echo done',
      { onStdout: async d => { streamed.push(d); await sbx.files.write('/home/user/go', '') } })
    const ok = await sbx.commands.run('echo one; echo two >&2; echo "$GREETING" ; pwd',
      { envs: { GREETING: 'hi there' }, onStdout: d => out.push(['out', d]),
        onStderr: d => out.push(['err', d]) })
    let failed = null
    try {
      await sbx.commands.run('echo before; exit 3')
    } catch (e) {
      failed = { isExit: e instanceof CommandExitError, exitCode: e.exitCode, stdout: e.stdout }
    }
    await sbx.files.makeDir('/home/user/sub')
    const cwd = await sbx.commands.run('pwd', { cwd: '/home/user/sub' })
    const cwdWs = await sbx.commands.run('pwd', { cwd: '/workspace/sub' })
    const cwdTmp = await sbx.commands.run('pwd', { cwd: '/tmp' })
    const env = await sbx.commands.run('echo "$SANDBOX_WIDE"')
    await sbx.files.write('/home/user/made-by-files.txt', 'x')
    const ls = await sbx.commands.run('ls')
    const procs = await sbx.commands.list()
    let started
    const startedP = new Promise(r => { started = r })
    const bg = await sbx.commands.run('echo started; sleep 600',
      { background: true, onStdout: d => started(d) })
    await startedP
    const running = (await sbx.commands.list()).map(p => ({ pid: p.pid, cmd: p.cmd, args: p.args }))
    const killed = await sbx.commands.kill(bg.pid)
    let bgEnd = null
    try { bgEnd = { ok: (await bg.wait()).exitCode } } catch (e) { bgEnd = { exitCode: e.exitCode, isExit: e instanceof CommandExitError } }
    const killedAgain = await sbx.commands.kill(bg.pid)
    const afterKill = await sbx.runCode('21 * 2')
    return { live: { stdout: live.stdout, streamed }, ok: { exitCode: ok.exitCode, stdout: ok.stdout, stderr: ok.stderr }, out, failed,
             cwd: cwd.stdout, cwdWs: cwdWs.stdout, cwdTmp: cwdTmp.stdout, env: env.stdout, ls: ls.stdout, procs,
             bg: { pid: bg.pid, running, killed, bgEnd, killedAgain }, afterKill: afterKill.text }
  },
  async processes(sbx) {
    // A dev server in the background, reached from a cell on the sandbox's loopback, while a
    // second background command and foreground ones run beside it.
    const server = await sbx.commands.run('exec python3 -m http.server 8000', { background: true, timeoutMs: 0 })
    const fromCell = await sbx.runCode(
      "import time, urllib.request\nfor _ in range(600):\n    try:\n" +
      "        print(urllib.request.urlopen('http://127.0.0.1:8000/').status); break\n" +
      "    except OSError:\n        time.sleep(0.05)")
    const sleeper = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    const beside = await sbx.commands.run('echo beside; echo $$')
    const listed = (await sbx.commands.list()).map(p => p.pid)
    // stdin: written twice, then closed
    const cat = await sbx.commands.run('cat', { background: true, stdin: true, timeoutMs: 0 })
    await sbx.commands.sendStdin(cat.pid, 'hello ')
    await cat.sendStdin('stdin\n')
    await sbx.commands.closeStdin(cat.pid)
    const catDone = await cat.wait()
    // disconnect from a running command, connect again by its pid
    let saidFirst
    const firstP = new Promise(r => { saidFirst = r })
    const waiter = await sbx.commands.run(
      'echo first; while [ ! -e /home/user/stop ]; do sleep 0.02; done; echo last',
      { background: true, timeoutMs: 0, onStdout: saidFirst })
    await firstP  // what it wrote before the connect is not what connect gives
    await waiter.disconnect()
    const again = await sbx.commands.connect(waiter.pid)
    await sbx.files.write('/home/user/stop', '')
    const waited = await again.wait()
    const killed = await sbx.commands.kill(sleeper.pid)
    const serverKilled = await server.kill()
    let serverEnd = null
    try { await server.wait() } catch (e) { serverEnd = { exitCode: e.exitCode, error: e.error } }
    await sleeper.wait().catch(() => {})
    const after = (await sbx.commands.list()).map(p => p.pid)
    let root = null
    try { await sbx.commands.run('id', { user: 'root' }) } catch (e) { root = errorInfo(e) }
    // a timeout, then a retry at once
    let timedOut = null
    try { await sbx.commands.run('sleep 30', { timeoutMs: 1000 }) } catch (e) { timedOut = errorInfo(e) }
    const retry = await sbx.commands.run('echo retried')
    const cellAfter = await sbx.runCode('6 * 7')
    return { fromCell: fromCell.logs.stdout, pids: [server.pid, sleeper.pid, cat.pid, waiter.pid],
             beside: beside.stdout, listed, cat: catDone.stdout, waited: waited.stdout,
             killed, serverKilled, serverEnd, after, root, timedOut, retry: retry.stdout,
             cellAfter: cellAfter.text }
  },
  async errors(sbx) {
    // What runcell refuses on /execute reaches execution.error (the SDK reads the body of a
    // failed /execute only on 404 and 502); a streaming RPC's error is in its end of stream.
    const info = x => x.error && { name: x.error.name, value: x.error.value }
    const lang = await sbx.runCode('1', { language: 'r' })
    const envs = await sbx.runCode('1', { envs: { ONE: '1' } })
    const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    const inCtx = await sbx.runCode('import os\nos.getcwd()', { context: ctx })
    await sbx.runCode("os.chdir('/var/tmp')", { context: ctx })
    const moved = await sbx.runCode('os.getcwd()', { context: ctx })
    const dflt = await sbx.runCode('import os\nos.getcwd()')
    const bashCtx = await sbx.createCodeContext({ language: 'bash', cwd: '/tmp' })
    const inBash = await sbx.runCode('pwd', { context: bashCtx })
    let noCwd = null
    try { await sbx.commands.run('pwd', { cwd: '/no/such/dir' }) } catch (e) { noCwd = errorInfo(e) }
    let noPid = null
    try { await sbx.commands.connect(99999) } catch (e) { noPid = errorInfo(e) }
    return { lang: info(lang), envs: info(envs), inCtx: inCtx.text, moved: moved.text,
             dflt: dflt.text, inBash: info(inBash), noCwd, noPid }
  },
  async extras(sbx) {
    // results[].chart: what the figure shows, as data
    const chart = await sbx.runCode(
      "import matplotlib.pyplot as plt\nplt.bar(['a', 'b', 'c'], [3, 5, 2], label='sales')\n" +
      "plt.title('Sales')\nplt.xlabel('Product')\nplt.ylabel('Units (k)')\nplt.show()")
    // IPython's display and syntax, as in Jupyter
    const ipy = await sbx.runCode(
      "from IPython.display import display, HTML, Markdown\ndisplay(HTML('<b>bold</b>'))\n" +
      "!echo from the shell\nfiles = !ls /\n%timeit -n 3 -r 2 sum(range(10))\nlen(files) > 3")
    // restartCodeContext('default') empties the default context only
    await sbx.runCode('kept_default = 1')
    const ctx = await sbx.createCodeContext({ language: 'python' })
    await sbx.runCode('kept_ctx = 2', { context: ctx })
    const bg = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await sbx.restartCodeContext('default')
    const gone = await sbx.runCode('kept_default')
    const stays = await sbx.runCode('kept_ctx', { context: ctx })
    const stillRunning = (await sbx.commands.list()).map(p => p.pid).includes(bg.pid)
    await bg.kill()
    // getMetrics
    const metrics = await sbx.getMetrics()
    // files.list of '.' and '' is the home
    await sbx.files.write('/home/user/listed.txt', 'x')
    const dot = (await sbx.files.list('.')).map(e => e.name)
    const empty = (await sbx.files.list('')).map(e => e.name)
    // watchDir: events of a directory, until stopped
    await sbx.files.makeDir('/home/user/watched')
    const events = []
    let seen
    const seenP = new Promise(r => { seen = r })
    const handle = await sbx.files.watchDir('/home/user/watched', e => {
      events.push({ name: e.name, type: e.type }); if (e.name === 'b.txt') seen()
    }, { recursive: true, timeoutMs: 0 })
    await sbx.files.write('/home/user/watched/a.txt', 'a')
    await sbx.commands.run('mkdir -p /home/user/watched/sub && echo b > /home/user/watched/sub/c.txt && echo b > /home/user/watched/b.txt')
    await seenP
    await handle.stop()
    // the git module (git run as commands): a repository in the home
    await sbx.git.init('/home/user/repo')
    await sbx.git.configureUser('Ada', 'ada@example.test', { scope: 'global' })
    await sbx.files.write('/home/user/repo/README', 'hello\n')
    const untracked = await sbx.git.status('/home/user/repo')
    await sbx.git.add('/home/user/repo', { all: true })
    await sbx.git.commit('/home/user/repo', 'first')
    const git = { untracked: untracked.fileStatus.map(f => [f.name, f.status]),
                  clean: (await sbx.git.status('/home/user/repo')).isClean,
                  branch: (await sbx.git.branches('/home/user/repo')).currentBranch }
    return { chart: chart.results.map(r => r.chart), ipy: executionInfo(ipy),
             gone: gone.error && gone.error.name, stays: stays.text, stillRunning,
             metrics, dot, empty, events, git }
  },
  async cookbook(sbx) {
    // Analyse an uploaded CSV at /home/user
    await sbx.files.write('/home/user/data.csv', 'city,temp\nOslo,4\nLima,19\nCairo,27\n')
    const csv = await sbx.runCode(
      "import pandas as pd\ndf = pd.read_csv('/home/user/data.csv')\ndf['temp'].mean()")
    const fromShell = await sbx.commands.run('wc -l < ~/data.csv')
    // A chart
    const chart = await sbx.runCode(
      "import matplotlib.pyplot as plt\nplt.plot(df['city'], df['temp'])\nplt.title('Temps')\nplt.show()")
    // A dev server in the background, reached through its preview URL from here
    const host = sbx.getHost(3000)
    await sbx.files.write('/home/user/site/index.html', '<h1>hello from the sandbox</h1>')
    let listening
    const listeningP = new Promise(r => { listening = r })
    const server = await sbx.commands.run('cd ~/site && exec python3 -m http.server 3000',
      { background: true, timeoutMs: 0, onStdout: d => { if (d.includes('Serving HTTP')) listening() } })
    await listeningP
    const page = await viaServer(`https://${host}/index.html`)
    const closed = await viaServer(`https://${sbx.getHost(3001)}/`)
    await server.kill()
    // A long command with streamed output
    const streamed = []
    const long = await sbx.commands.run(
      'for i in 1 2 3; do echo step $i; while [ ! -e /home/user/next-$i ]; do sleep 0.02; done; done',
      { onStdout: async d => { streamed.push(d); await sbx.files.write('/home/user/next-' + d.trim().split(' ')[1], '') } })
    // A timeout, then a retry at once: a cell, then a command
    let cellTimeout = null
    try { await sbx.runCode('import time\ntime.sleep(30)', { timeoutMs: 1000 }) } catch (e) { cellTimeout = errorInfo(e) }
    const cellRetry = await sbx.runCode('"again"')
    let cmdTimeout = null
    try { await sbx.commands.run('sleep 30', { timeoutMs: 1000 }) } catch (e) { cmdTimeout = errorInfo(e) }
    const cmdRetry = await sbx.commands.run('echo again')
    // Signed file URLs
    const down = await sbx.downloadUrl('/home/user/data.csv', { useSignatureExpiration: 60 })
    const downloaded = await viaServer(down)
    const badSig = await viaServer(down.replace(/signature=v1_[^&]+/, 'signature=v1_AAAA'))
    const up = await sbx.uploadUrl('/home/user/up.txt')
    const boundary = 'runcellboundary'
    const uploaded = await viaServer(up, { method: 'POST', headers: {
      'Content-Type': `multipart/form-data; boundary=${boundary}` },
      body: `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="up.txt"\r\n\r\nuploaded\r\n--${boundary}--\r\n` })
    const upRead = await sbx.files.read('/home/user/up.txt')
    return { csv: csv.text, lines: fromShell.stdout, chart: chart.results[0]?.chart,
             host, page: { status: page.status, body: page.body, type: page.headers['content-type'] },
             closed: { status: closed.status, body: closed.body },
             streamed, long: long.stdout, cellTimeout, cellRetry: cellRetry.text,
             cmdTimeout, cmdRetry: cmdRetry.stdout,
             down: { url: down, status: downloaded.status, body: downloaded.body },
             badSig: badSig.status, uploaded: uploaded.status, upRead }
  },
  async contexts(sbx) {
    await sbx.runCode('where = "default"')
    const ctx = await sbx.createCodeContext({ language: 'python' })
    const a = await sbx.runCode('where = "second"\nwhere', { context: ctx })
    const b = await sbx.runCode('where')
    const c = await sbx.runCode('where', { context: ctx })
    const bash = await sbx.runCode('echo from bash', { language: 'bash' })
    // A JavaScript context: the sandbox's Node kernel, beside the Python one.
    const js = await sbx.createCodeContext({ language: 'js' })
    await sbx.runCode('let total = 40', { context: js })
    const jsValue = await sbx.runCode('total + 2', { context: js })
    const jsByLanguage = await sbx.runCode('[1, 2].map(x => x * total)', { language: 'javascript' })
    const jsError = await sbx.runCode('null.f()', { context: js })
    const list = await sbx.listCodeContexts()
    let r = null
    try { await sbx.createCodeContext({ language: 'r' }) } catch (e) { r = errorInfo(e) }
    await sbx.removeCodeContext(ctx)
    await sbx.removeCodeContext(js)
    const after = await sbx.listCodeContexts()
    return { ctx, a: a.text, b: b.text, c: c.text, list, bash: executionInfo(bash),
             js: { context: js, value: jsValue.text, byLanguage: jsByLanguage.text,
                   error: jsError.error && jsError.error.name },
             r, after }
  },
  async pauseSnapshotFork(sbx) {
    // pause (keeping memory) and connect (which resumes), then a hibernating pause
    await sbx.runCode('kept = 41')
    const paused = await sbx.pause()
    const again = await sbx.pause()
    const listedPaused = (await Sandbox.list({ query: { state: ['paused'] } }).nextItems())
      .map(b => b.sandboxId)
    const infoPaused = await Sandbox.getInfo(sbx.sandboxId)
    const resumed = await Sandbox.connect(sbx.sandboxId)
    const afterResume = executionInfo(await resumed.runCode('kept + 1'))
    await sbx.pause({ keepMemory: false })
    const afterHibernate = executionInfo(await sbx.runCode('kept + 2'))
    // a snapshot, a sandbox from it, the list, and its deletion
    await sbx.files.write('/home/user/note.txt', 'from the snapshot')
    const snap = await sbx.createSnapshot({ name: 'kept-state' })
    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60000 })
    const restored = executionInfo(await fromSnap.runCode(
      "kept, open('/home/user/note.txt').read()"))
    await fromSnap.kill()
    const deleted = await Sandbox.deleteSnapshot(snap.snapshotId)
    const deletedAgain = await Sandbox.deleteSnapshot(snap.snapshotId)
    let gone = null
    try { await Sandbox.create(snap.snapshotId) } catch (e) { gone = errorInfo(e) }
    // forks: each a sandbox of its own, with the parent's state, changing nothing of it
    const forks = await sbx.fork({ count: 2, timeoutMs: 60000 })
    const forked = []
    for (const f of forks) {
      await f.runCode('kept = kept * 100')
      forked.push(executionInfo(await f.runCode('kept')))
    }
    const parent = executionInfo(await sbx.runCode('kept'))
    for (const f of forks) await f.kill()
    return { paused, again, listedPaused, infoPaused: infoPaused.state, afterResume,
             afterHibernate, snap, listed, restored, deleted, deletedAgain, gone,
             forkIds: forks.map(f => f.sandboxId), forked, parent }
  },
  async kill(sbx) {
    const id = sbx.sandboxId
    const listed = (await Sandbox.list().nextItems()).map(s => s.sandboxId)
    const other = await Sandbox.create({ metadata: { role: 'other one', n: '1+1' } })
    const byMeta = (await Sandbox.list({ query: { metadata: { role: 'other one', n: '1+1' } } })
      .nextItems()).map(s => s.sandboxId)
    const byWrongMeta = (await Sandbox.list({ query: { metadata: { role: 'nobody' } } })
      .nextItems()).length
    await other.kill()
    const killed = await sbx.kill()
    const again = await Sandbox.kill(id)
    let info = null
    try { await Sandbox.getInfo(id) } catch (e) { info = errorInfo(e) }
    let connect = null
    try { await Sandbox.connect(id) } catch (e) { connect = errorInfo(e) }
    const running = await sbx.isRunning()
    let code = null
    try { await sbx.runCode('1') } catch (e) { code = errorInfo(e) }
    return { listed: listed.includes(id), byMeta: byMeta.length === 1 && byMeta[0] === other.sandboxId,
             byWrongMeta, killed, again, info, connect, running, code }
  },
}

async function main() {
  const name = process.argv[2]
  if (name === 'network') {
    // updateNetwork replaces the egress configuration of a sandbox made with a network
    const withNet = await Sandbox.create({ network: { allowOut: ['pypi.org'] } })
    await withNet.updateNetwork({ allowOut: ['files.example.test', 'pypi.org:8443'] })
    const after = (await withNet.getInfo()).network
    await withNet.updateNetwork({ denyOut: ['0.0.0.0/0'] })
    const closed = (await withNet.getInfo()).network
    await withNet.kill()
    const without = await Sandbox.create()
    let refused = null
    try { await without.updateNetwork({ allowOut: ['pypi.org'] }) } catch (e) { refused = errorInfo(e) }
    await without.kill()
    console.log(JSON.stringify({ after, closed, refused }))
    return
  }
  if (name === 'refused') {
    const out = {}
    for (const [k, opts] of Object.entries({
      template: ['no-such-template', {}],
      internet: [undefined, { allowInternetAccess: true }],
      denyOut: [undefined, { network: { denyOut: ['10.0.0.0/8'] } }],
    })) {
      try { await Sandbox.create(...(opts[0] ? [opts[0], opts[1]] : [opts[1]])); out[k] = 'created' }
      catch (e) { out[k] = errorInfo(e) }
    }
    let badKey = null
    try { await Sandbox.create({ apiKey: 'e2b_0000' }) } catch (e) { badKey = errorInfo(e) }
    out.badKey = badKey
    // What has no runcell counterpart: each call's error, as the user sees it
    const sbx = await Sandbox.create()
    const calls = {
      pty: () => sbx.pty.create({ cols: 80, rows: 24, onData: () => {} }),
      volume: () => Volume.create('data'),
      volumes: () => Volume.list(),
      secrets: () => Secret.list().nextItems(),
      template: () => Template.exists('my-template'),
    }
    out.calls = {}
    for (const [k, f] of Object.entries(calls)) {
      try { await f(); out.calls[k] = 'worked' } catch (e) { out.calls[k] = errorInfo(e) }
    }
    await sbx.kill()
    console.log(JSON.stringify(out))
    return
  }
  const sbx = await Sandbox.create({ envs: { SANDBOX_WIDE: 'wide' }, timeoutMs: 120000 })
  let out
  try {
    out = await scenarios[name](sbx)
  } finally {
    if (name !== 'kill') await sbx.kill().catch(() => {})
  }
  console.log(JSON.stringify(out))
}

// Exit once said: after a failed call the SDK leaves its request timer running (60 s),
// which would keep Node alive that long. (Writes to a pipe are synchronous on Linux.)
main().then(() => process.exit(0)).catch(e => { console.log(JSON.stringify({ fatal: errorInfo(e), stack: e?.stack })); process.exit(1) })
