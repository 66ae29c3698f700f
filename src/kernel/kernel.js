/* kernel.js - runcell's in-sandbox JavaScript kernel: runs cells one at a time in Node's main
 * context, driven by the daemon over the framed protocol of kernel.py on fd 3.
 *
 * Frames are [u32 big-endian payload length][u8 kind][payload]:
 *   daemon -> kernel  "M"  JSON request: {"type": "execute", "code", "lang", "execution_count"}
 *                          {"type": "checkpoint" | "restore", "path"} (refused: see below)
 *                     "I"  interrupt (no payload), written just before SIGINT
 *   kernel -> daemon  "O" / "E"  stdout / stderr bytes of console.* (and of display's text)
 *                     "M"  JSON message: hello, display (MIME bundle), done, *_done
 * process.stdout/stderr.write are these frames too, so they keep their order with console.*;
 * child processes (and writes to fd 1 or 2 themselves) use fds 1 and 2, pipes the daemon reads.
 *
 * Cells run in the main context (vm.Script.runInThisContext), as `node`'s own REPL does:
 * every global of a Node script is there (Buffer, timers, fetch, process), values made by
 * built-in modules are of the cell's realm (instanceof and Buffer checks hold), and top-level
 * let/const/class/function declarations persist because scripts of one realm share its global
 * lexical scope. A cell that uses top-level await is rewritten by Node's REPL rewriter
 * (internal/repl/await, hence --expose-internals): its declarations are hoisted out of the
 * async wrapper, so they persist too. As in Node's REPL, a let/const declared twice is a
 * SyntaxError. The daemon treats everything sent from here as untrusted. */
'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { Console } = require('console');
const { EventEmitter } = require('events');
const { createRequire, builtinModules } = require('module');
const { pathToFileURL } = require('url');

const CHANNEL_FD = 3;
const MAX_REQUEST = 48 << 20; // KERNEL_MAX_FRAME in kernel.h: one cap for both directions
const STREAM_CHUNK = 32 << 10;
const KERNEL_FILE = __filename;

/* The kernel's own uses of Node's experimental and internal parts warn, on the cell's
 * stderr: warnings about the kernel, not the user's code. */
const emitWarning = process.emitWarning;
process.emitWarning = function (warning, ...rest) {
    const text = String(warning && warning.message || warning);
    if (text.includes('USE_MAIN_CONTEXT_DEFAULT_LOADER') || text.includes('internal testing only'))
        return;
    return emitWarning.call(process, warning, ...rest);
};

/* Node's SIGINT watchdog (what breakOnSigint and the REPL use), started once for the
 * kernel's life: SIGINT then always goes to its thread, which breaks a cell's synchronous
 * code and is otherwise only noted (a SIGINT between cells cannot kill the kernel). Started
 * and stopped per script instead, a signal that comes as it stops is left counted and
 * breaks the next cell as it starts. */
let contextify = null;
try {
    contextify = require('internal/test/binding').internalBinding('contextify');
    if (typeof contextify.startSigintWatchdog !== 'function' ||
        typeof contextify.watchdogHasPendingSigint !== 'function')
        contextify = null;
} catch (e) {
    contextify = null;
}

let rewriteAwait = null;
try {
    rewriteAwait = require('internal/repl/await').processTopLevelAwait;
} catch (e) {
    /* without --expose-internals: an await cell runs in a plain async wrapper below */
}

/* ---- the channel ---- */

const sleeper = new Int32Array(new SharedArrayBuffer(4));

/* Writes a whole buffer on the channel, waiting while the socket is full: libuv made the fd
 * non-blocking for the reader, and output must go out as the cell makes it (a busy cell never
 * yields to an asynchronous writer). */
function writeAll(buf) {
    let off = 0;
    while (off < buf.length) {
        try {
            off += fs.writeSync(CHANNEL_FD, buf, off, buf.length - off);
        } catch (e) {
            if (e.code !== 'EAGAIN')
                throw e;
            Atomics.wait(sleeper, 0, 0, 1);
        }
    }
}

function sendFrame(kind, payload) {
    const hdr = Buffer.alloc(5);
    hdr.writeUInt32BE(payload.length, 0);
    hdr[4] = kind.charCodeAt(0);
    writeAll(Buffer.concat([hdr, payload]));
}

/* Text the daemon's JSON parser accepts: no lone surrogates, no NUL. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
function wireText(s) {
    s = typeof s.toWellFormed === 'function' ? s.toWellFormed() : s.replace(LONE_SURROGATE, '\ufffd');
    return s.includes('\0') ? s.replace(/\0/g, '\ufffd') : s;
}

/* obj with what the daemon would refuse made acceptable (user data reaches messages through
 * reprs, error text and rich reprs): strings cleaned, BigInts and other values as text,
 * non-finite numbers as null, depth capped. */
function wireSafe(obj, depth = 0) {
    if (obj === null || obj === undefined || typeof obj === 'boolean')
        return obj === undefined ? null : obj;
    if (typeof obj === 'string')
        return wireText(obj);
    if (typeof obj === 'number')
        return Number.isFinite(obj) ? obj : null;
    if (typeof obj !== 'object' || depth > 100)
        return wireText(safeInspect(obj));
    if (Array.isArray(obj))
        return obj.map((v) => wireSafe(v, depth + 1));
    const out = {};
    for (const k of Object.keys(obj))
        out[wireText(k)] = wireSafe(obj[k], depth + 1);
    return out;
}

function sendJson(obj) {
    sendFrame('M', Buffer.from(JSON.stringify(wireSafe(obj)), 'utf8'));
}

/* Frames from the daemon: requests are queued for the main loop; an interrupt frame marks
 * the running cell, or a request read with it and not yet run (the daemon sends a cell's
 * interrupt after its request), or, between cells, is dropped: it was meant for a cell
 * that ended. */
const channel = {
    buf: Buffer.alloc(0),
    pending: [],      /* chunks not yet joined to buf: a large request is joined once */
    pendingBytes: 0,
    requests: [],
    onRequest: null,
    onInterrupt: null,
    feed(chunk) {
        this.pending.push(chunk);
        this.pendingBytes += chunk.length;
        const want = this.buf.length >= 5 ? 5 + this.buf.readUInt32BE(0) : 5;
        if (this.buf.length + this.pendingBytes < want)
            return;
        this.buf = Buffer.concat([this.buf, ...this.pending]);
        this.pending = [];
        this.pendingBytes = 0;
        while (this.buf.length >= 5) {
            const len = this.buf.readUInt32BE(0);
            if (len > MAX_REQUEST) {
                fs.writeSync(2, 'runcell kernel: request too large\n');
                process.exit(70);
            }
            if (this.buf.length < 5 + len)
                break;
            const kind = String.fromCharCode(this.buf[4]);
            const payload = this.buf.subarray(5, 5 + len);
            this.buf = this.buf.subarray(5 + len);
            if (kind === 'I') {
                if (this.onInterrupt)
                    this.onInterrupt(this.requests[this.requests.length - 1]);
            } else if (kind === 'M') {
                this.requests.push(Buffer.from(payload));
            }
        }
        if (this.requests.length && this.onRequest)
            this.onRequest();
    },
    /* What the socket holds now, read without waiting: called as a cell starts, so that an
     * interrupt frame sent before its SIGINT is seen before the code runs. */
    drain() {
        const chunk = Buffer.alloc(65536);
        for (;;) {
            let n;
            try {
                n = fs.readSync(CHANNEL_FD, chunk, 0, chunk.length, null);
            } catch (e) {
                return; /* EAGAIN: nothing more for now */
            }
            if (n <= 0)
                return;
            this.feed(Buffer.from(chunk.subarray(0, n)));
        }
    },
};

/* ---- output ---- */

/* buf as frames of kind, STREAM_CHUNK bytes at most each. */
function sendChunks(kind, buf) {
    for (let off = 0; off < buf.length; off += STREAM_CHUNK)
        sendFrame(kind, buf.subarray(off, off + STREAM_CHUNK));
}

/* What console.* writes to: an EventEmitter (Console adds and removes an error listener
 * around each write) whose write sends the frames at once. Not a Writable: an interrupt
 * stops a cell's code wherever it is, and a Writable stopped inside its own bookkeeping
 * (its write's callback not yet run) holds every later write in its buffer, so that no cell
 * after it printed anything with console.* (tests/integration/test_javascript.py). */
function frameSink(kind) {
    const sink = new EventEmitter();
    sink.write = framedWrite(kind);
    return sink;
}

const cellConsole = new Console({ stdout: frameSink('O'), stderr: frameSink('E'),
                                  colorMode: false });

/* process.stdout and process.stderr write the same frames as console.*, at once: a line
 * written by one and a line by the other reach the daemon in the order the cell wrote them
 * (through the pipe, a daemon that woke late read the pipe first). The streams stay what
 * they are otherwise (fd, isTTY, events); only write changes. */
function framedWrite(kind) {
    return function write(chunk, encoding, cb) {
        if (typeof encoding === 'function') {
            cb = encoding;
            encoding = undefined;
        }
        const buf = typeof chunk === 'string' ? Buffer.from(chunk, encoding || 'utf8')
                                              : Buffer.from(chunk.buffer, chunk.byteOffset,
                                                            chunk.byteLength);
        sendChunks(kind, buf);
        if (typeof cb === 'function')
            process.nextTick(cb, null); /* null: Console's callback reads an error otherwise */
        return true;
    };
}

function safeInspect(v) {
    try {
        return util.inspect(v, { depth: 4, maxArrayLength: 100, maxStringLength: 10000,
                                 breakLength: 100 });
    } catch (e) {
        return '<inspect failed: ' + (e && e.name) + '>';
    }
}

const IMAGE_SIGNATURES = [
    ['image/png', [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]],
    ['image/jpeg', [0xff, 0xd8, 0xff]],
    ['image/gif', [0x47, 0x49, 0x46, 0x38]],
];

function imageType(v) {
    if (!(v instanceof Uint8Array))
        return null;
    for (const [mime, sig] of IMAGE_SIGNATURES)
        if (v.length >= sig.length && sig.every((b, i) => v[i] === b))
            return mime;
    return null;
}

/* The MIME bundle of a value: an image for a Buffer/Uint8Array with a known signature, what
 * an object's _repr_mimebundle_() returns (IPython's name: {mime: string | JSON value}), and
 * always text/plain (util.inspect unless the object gave one). */
function mimeBundle(v) {
    const bundle = {};
    const img = imageType(v);
    if (img) {
        bundle[img] = Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64');
        bundle['text/plain'] = `<${img} image, ${v.length} bytes>`;
        return bundle;
    }
    if (v !== null && (typeof v === 'object' || typeof v === 'function') &&
        typeof v._repr_mimebundle_ === 'function') {
        try {
            const rich = v._repr_mimebundle_();
            if (rich && typeof rich === 'object')
                for (const k of Object.keys(rich))
                    bundle[k] = typeof rich[k] === 'string' || k.endsWith('json') ? rich[k]
                                                                               : String(rich[k]);
        } catch (e) {
            cellConsole.error('runcell: _repr_mimebundle_ failed: ' + safeInspect(e));
        }
    }
    if (typeof bundle['text/plain'] !== 'string')
        bundle['text/plain'] = safeInspect(v);
    return bundle;
}

function display(v, result = false) {
    sendJson({ type: 'display', result, data: mimeBundle(v) });
}

/* ---- errors ---- */

/* A stack cut to the user's code: from the first frame of the kernel or of the vm module
 * that ran the cell, down, nothing is the user's. */
function trimStack(stack) {
    const lines = String(stack).split('\n');
    const out = [];
    for (const line of lines) {
        const frame = /^\s+at /.test(line);
        if (frame && (line.includes(KERNEL_FILE) || /\(node:vm:|at node:vm:|new Script \(/.test(line)))
            break;
        out.push(line);
    }
    return out.join('\n') + '\n';
}

function errorRecord(e) {
    if (e instanceof Error || (e && typeof e === 'object' && typeof e.stack === 'string')) {
        let name = 'Error';
        let value = '';
        try {
            name = String(e.name || (e.constructor && e.constructor.name) || 'Error');
            value = String(e.message === undefined ? '' : e.message);
        } catch (x) { /* a hostile getter: keep the defaults */ }
        let tb;
        try {
            tb = trimStack(e.stack);
        } catch (x) {
            tb = name + ': ' + value + '\n';
        }
        return { name, value, traceback: tb };
    }
    const text = safeInspect(e);
    return { name: 'Uncaught', value: text, traceback: 'Uncaught ' + text + '\n' };
}

/* ---- running cells ---- */

const dynamicImport = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER
    ? vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER
    : (spec) => import(resolveImport(spec));

/* For Node versions without the main context's loader: import() from the workspace. */
function resolveImport(spec) {
    if (spec.startsWith('.') || spec.startsWith('/'))
        return pathToFileURL(path.resolve(process.cwd(), spec)).href;
    if (spec.startsWith('node:') || builtinModules.includes(spec) || /^[a-z]+:/.test(spec))
        return spec;
    try {
        return pathToFileURL(createRequire(path.join(process.cwd(), '<cell>')).resolve(spec)).href;
    } catch (e) {
        return spec;
    }
}


function compile(code, filename) {
    const opts = { filename, importModuleDynamically: dynamicImport };
    if (code.includes('await')) {
        let wrapped = null;
        try {
            wrapped = rewriteAwait ? rewriteAwait(code) : null;
        } catch (e) {
            /* code the rewriter cannot parse: compiled as it is, for V8's own SyntaxError */
        }
        if (wrapped !== null) {
            return { script: new vm.Script(wrapped, opts), wrapped: true };
        }
        if (!rewriteAwait) {
            try {
                return { script: new vm.Script(code, opts), wrapped: false };
            } catch (e) {
                const body = '(async () => {\n' + code + '\n})()';
                return { script: new vm.Script(body, { ...opts, lineOffset: -1 }),
                         wrapped: 'plain' };
            }
        }
    }
    try {
        return { script: new vm.Script(code, opts), wrapped: false };
    } catch (e) {
        /* Code with await that the rewriter could not parse: V8's complaint about the await
         * hides the real mistake, which the code in an async function shows. */
        if (e instanceof SyntaxError && /await is only valid/.test(e.message))
            new vm.Script('(async () => {\n' + code + '\n})()', { ...opts, lineOffset: -1 });
        throw e;
    }
}

class Interrupted extends Error {
    constructor() {
        super('the cell was interrupted');
        this.name = 'KeyboardInterrupt';
    }
}

const kernel = {
    count: 0,
    running: null, /* {started, interrupt(), reject(e)} while a cell runs */
    /* Each interrupt is one I frame, then one SIGINT, and stops at most one cell. frames
     * counts the frames seen; handled, the interrupts acted on or dropped. A SIGINT with no
     * frame left to match is one already counted: the signal of a frame that stopped a
     * cell before its code started, or the second delivery of one that breakOnSigint's
     * watchdog took (Node passes it on to the process's listeners after the script). */
    frames: 0,
    handled: 0,
    /* With the watchdog: a frame was read whose SIGINT has not been seen since. The daemon
     * sends the signal after the frame, through the sandbox's init, and a busy machine may
     * hold either back for long; a signal that came late would break the next cell. */
    signalOwed: false,
};

/* With the watchdog (the usual case): a frame read while the event loop runs stops the
 * cell, which waits for the frame's SIGINT to reach the watchdog first, so that the signal
 * cannot break the next cell. A frame read only after a synchronous loop was broken is the
 * signal's own and stops nothing more. Without the watchdog (a Node without the internal
 * binding), frames stop cells that have not started and a SIGINT listener stops waiting
 * cells. Between cells a frame is dropped, and the next cell waits for its signal first. */
channel.onInterrupt = (queued) => {
    kernel.frames++;
    if (contextify)
        kernel.signalOwed = true;
    if (!kernel.running) {
        kernel.handled = kernel.frames;
        if (queued)
            queued.interrupted = true; /* its cell stops before it starts */
    } else if (contextify || !kernel.running.started) {
        kernel.handled = kernel.frames;
        kernel.running.interruptAfterSignal();
    }
};

/* Calls done once the owed SIGINT has reached the watchdog, taking its note (a start and a
 * stop of the watchdog clear it), however long that takes: the daemon always sends one,
 * and ends a cell that outlasts its time anyway. A SIGINT listener of the cell's own takes
 * the signal from the watchdog (libuv installs its handler over it): then none comes here,
 * and none can break a later cell. */
function whenSignalSeen(done) {
    const poll = () => {
        if (!kernel.signalOwed || process.listenerCount('SIGINT') > 0 ||
            contextify.watchdogHasPendingSigint()) {
            contextify.startSigintWatchdog();
            contextify.stopSigintWatchdog();
            kernel.signalOwed = false;
            done();
        } else {
            setTimeout(poll, 1);
        }
    };
    poll();
}

/* Ends the cell as interrupted once the interrupt's SIGINT has come. */
function afterSignal(running, done) {
    running.stopping = true;
    if (!contextify)
        return done();
    whenSignalSeen(done);
}

if (!contextify) {
    /* SIGINT while the event loop runs stops a waiting cell; between cells it is dropped.
     * The frames in the socket are read first: every signal's frame was written before it. */
    process.on('SIGINT', () => {
        channel.drain();
        if (kernel.handled >= kernel.frames)
            return;
        kernel.handled = kernel.frames;
        if (kernel.running)
            kernel.running.interrupt();
    });
}

process.on('unhandledRejection', (reason) => {
    if (kernel.running)
        kernel.running.reject(reason);
    else
        cellConsole.error('Uncaught (in promise) ' + errorRecord(reason).traceback.trimEnd());
});

process.on('uncaughtException', (e) => {
    if (kernel.running)
        kernel.running.reject(e);
    else
        cellConsole.error('Uncaught ' + errorRecord(e).traceback.trimEnd());
});

/* Runs one cell; resolves to {err} or {value, has}. stopped: an interrupt frame came
 * after its request, before it ran. */
function runCell(code, filename, stopped) {
    return new Promise((resolve) => {
        let settled = false;
        const finish = (r) => {
            if (!settled) {
                settled = true;
                kernel.running = null;
                resolve(r);
            }
        };
        const running = {
            started: false,
            stopping: false,
            interrupt: () => finish({ err: new Interrupted() }),
            interruptAfterSignal: () => afterSignal(running, () => finish({ err: new Interrupted() })),
            reject: (e) => finish({ err: e }),
        };
        kernel.running = running;
        if (stopped)
            return running.interruptAfterSignal();
        let compiled;
        try {
            compiled = compile(code, filename);
        } catch (e) {
            return finish({ err: e });
        }
        channel.drain();
        if (settled || running.stopping)
            return; /* an interrupt frame came before the code started */
        if (contextify && kernel.signalOwed)
            return whenSignalSeen(() => run(running, compiled, finish)); /* one from between cells */
        run(running, compiled, finish);
    });
}

/* Runs a compiled cell's code, unless an interrupt stopped it first. */
function run(running, compiled, finish) {
    if (running.stopping)
        return; /* an interrupt frame came while it waited */
    running.started = true;
    let value;
    try {
        value = compiled.script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    } catch (e) {
        if (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
            channel.drain(); /* the frame of the signal the watchdog took */
            kernel.handled = kernel.frames;
            kernel.signalOwed = false;
            return finish({ err: new Interrupted() });
        }
        return finish({ err: e });
    }
    /* One turn of the event loop first: a promise the cell rejected and left unhandled is
     * reported (unhandledRejection) while the cell is still the one running. */
    if (!compiled.wrapped)
        return setImmediate(() => finish({ value, has: value !== undefined }));
    Promise.resolve(value).then(
        (r) => {
            if (compiled.wrapped === 'plain')
                finish({ value: undefined, has: false });
            else
                finish({ value: r && r.value, has: r !== undefined && r.value !== undefined });
        },
        (e) => finish({ err: e }));
}

async function execute(req, stopped) {
    const count = req.execution_count;
    kernel.count = Number.isInteger(count) && count > 0 ? count : kernel.count + 1;
    const reply = { type: 'done', execution_count: kernel.count, status: 'ok', error: null };
    const lang = req.lang || 'javascript';
    let r;
    if (!['javascript', 'js', 'node'].includes(lang))
        r = { err: { name: 'LanguageError', message: `this is a JavaScript kernel: it cannot run ` +
                     `${lang}; use a session whose language is ${lang}`, stack: '' } };
    else
        r = await runCell(typeof req.code === 'string' ? req.code : '', `<cell ${kernel.count}>`,
                          stopped);
    if (r.err !== undefined) {
        reply.status = 'error';
        reply.error = errorRecord(r.err);
        if (r.err instanceof Interrupted)
            reply.error.traceback = 'KeyboardInterrupt: the cell was interrupted\n';
    } else if (r.has) {
        globalThis._ = r.value;
        try {
            display(r.value, true);
        } catch (e) {
            reply.status = 'error';
            reply.error = errorRecord(e);
        }
    }
    sendJson(reply);
}

/* Variables of a JavaScript session are not saved: closures, promises and handles have no
 * faithful serialised form. The daemon is told so, and says so in what it reports. */
function variables(req) {
    sendJson({ type: req.type + '_done', ok: false,
               error: 'variables of a JavaScript session are not saved (files are)' });
}

let busy = false;
async function serve() {
    if (busy)
        return;
    busy = true;
    try {
        while (channel.requests.length) {
            const raw = channel.requests.shift();
            let req;
            try {
                req = JSON.parse(raw.toString('utf8'));
            } catch (e) {
                continue;
            }
            if (req && req.type === 'execute')
                await execute(req, raw.interrupted === true);
            else if (req && (req.type === 'checkpoint' || req.type === 'restore'))
                variables(req);
        }
    } finally {
        busy = false;
    }
}

function main() {
    globalThis.console = cellConsole;
    process.stdout.write = framedWrite('O');
    process.stderr.write = framedWrite('E');
    globalThis.display = (...objs) => {
        for (const o of objs)
            display(o, false);
    };
    globalThis.require = createRequire(path.join(process.cwd(), '<cell>'));
    globalThis.module = { exports: {}, require: globalThis.require };
    globalThis.exports = globalThis.module.exports;
    /* Never from inside a read: drain() reads in a SIGINT listener and as a cell starts. */
    channel.onRequest = () => { setImmediate(serve); };
    if (contextify)
        contextify.startSigintWatchdog();
    const sock = new net.Socket({ fd: CHANNEL_FD, readable: true, writable: false });
    sock.on('data', (chunk) => channel.feed(chunk));
    sock.on('end', () => process.exit(0));
    sock.on('error', () => process.exit(0));
    sendJson({ type: 'hello', node: process.version, language: 'javascript', pid: process.pid,
               cwd: process.cwd() });
}

main();
