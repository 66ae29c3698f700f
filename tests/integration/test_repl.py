"""test_repl - `runcell repl`: driven through a pipe (no terminal: no prompts, input read
line by line) and through a real pseudo-terminal (prompts, line editing, Ctrl-C, Ctrl-D).
"""
import errno
import os
import pty
import select
import signal
import subprocess
import termios
import time
import unittest

from rctest import RUNCELL, RuncellTestCase, TempDir, png_size, run_cells

_has_matplotlib = None


def sandbox_has_matplotlib():
    global _has_matplotlib
    if _has_matplotlib is None:
        recs, _ = run_cells("import importlib.util\n"
                            "importlib.util.find_spec('matplotlib') is not None")
        _has_matplotlib = bool(recs) and recs[0]["results"] == [{"text/plain": "True"}]
    return _has_matplotlib


def repl(text, *opts, timeout=180):
    """Feeds text to `runcell repl OPTS` on a pipe; returns the CompletedProcess (str)."""
    return subprocess.run([RUNCELL, "repl", *opts], input=text, capture_output=True,
                          text=True, timeout=timeout)


class PipeReplTest(RuncellTestCase):
    def check(self, p, stdout, exit=0):
        self.assertEqual(p.returncode, exit, "stderr: %s" % p.stderr)
        self.assertEqual(p.stdout, stdout, "stderr: %s" % p.stderr)

    def test_multi_line_input(self):
        p = repl("x = 5\n"
                 "for i in range(3):\n"
                 "    print(i * x)\n"
                 "\n"
                 "def sq(n):\n"
                 "    if n < 0:\n"
                 "        return None\n"
                 "    return n * n\n"
                 "\n"
                 "sq(x)\n"
                 "y = [1,\n"
                 "     2,\n"
                 "     3]\n"
                 "sum(y) + sq(2)\n"
                 "s = '''first\n"
                 "second'''\n"
                 "print(s.upper())\n"
                 "total = 1 + \\\n"
                 "    2\n"
                 "total\n")
        self.check(p, "0\n5\n10\n25\n10\nFIRST\nSECOND\n3\n")
        self.assertNotIn("runcell>", p.stdout + p.stderr, "no prompts without a terminal")
        self.assertNotIn("Traceback", p.stderr)

    def test_block_at_end_of_input_runs(self):
        p = repl("for i in range(2):\n    print('line', i)")
        self.check(p, "line 0\nline 1\n")

    def test_error_goes_to_stderr_and_the_session_lives_on(self):
        p = repl("z = 'kept'\n"
                 "def f():\n"
                 "    return {}['k']\n"
                 "\n"
                 "f()\n"
                 "print(z)\n")
        self.check(p, "kept\n")
        self.assertIn("Traceback (most recent call last):", p.stderr)
        self.assertIn('File "<cell 3>", line 1, in <module>', p.stderr)
        self.assertIn('File "<cell 2>", line 2, in f', p.stderr)
        self.assertIn("KeyError: 'k'", p.stderr)
        self.assertNotIn("kernel.py", p.stderr)

    def test_stderr_of_the_code(self):
        p = repl("import sys\nprint('to err', file=sys.stderr)\nprint('to out')\n")
        self.check(p, "to out\n")
        self.assertIn("to err\n", p.stderr)

    def test_large_output_is_printed_to_its_end(self):
        p = repl("print('x' * 700000)\nprint('after')\n")
        self.check(p, "x" * 700000 + "\nafter\n")

    def test_timeout_interrupts_one_input(self):
        p = repl("a = 1\n"
                 "import time\n"
                 "while True: time.sleep(0.05)\n"
                 "print('after', a)\n", "--timeout", "1")
        self.check(p, "after 1\n")
        self.assertIn("KeyboardInterrupt", p.stderr)
        self.assertIn("timed out", p.stderr)

    def test_images_saved_to_out(self):
        if not sandbox_has_matplotlib():
            self.skipTest("matplotlib is not installed for /usr/bin/python3")
        with TempDir() as d:
            out = os.path.join(d, "figs")
            p = repl("import matplotlib.pyplot as plt\n"
                     "fig = plt.figure(figsize=(4, 3), dpi=100); _ = plt.plot([1, 2, 3])\n"
                     "plt.show()\n"
                     "plt.figure(figsize=(2, 1), dpi=100)\n"
                     "print('next')\n", "--out", out)
            self.assertEqual(p.returncode, 0, p.stderr)
            first = os.path.join(out, "figure-2-1.png")
            second = os.path.join(out, "figure-4-1.png")
            self.assertEqual(p.stdout, "[image saved: %s]\n[image saved: %s]\nnext\n"
                             % (first, second))
            self.assertEqual(sorted(os.listdir(out)), ["figure-2-1.png", "figure-4-1.png"])
            with open(first, "rb") as f:
                self.assertEqual(png_size(f.read()), (400, 300))
            with open(second, "rb") as f:
                self.assertEqual(png_size(f.read()), (200, 100))

    def test_images_saved_in_the_workspace(self):
        if not sandbox_has_matplotlib():
            self.skipTest("matplotlib is not installed for /usr/bin/python3")
        p = repl("import matplotlib.pyplot as plt\n"
                 "fig, ax = plt.subplots(figsize=(2, 1), dpi=100)\n"
                 "data = open('/workspace/figure-2-1.png', 'rb').read()\n"
                 "data[:8], len(data) > 100\n")
        self.check(p, "[image saved: /workspace/figure-2-1.png]\n"
                      "(b'\\x89PNG\\r\\n\\x1a\\n', True)\n")

    def test_empty_input_ends_with_status_0(self):
        self.check(repl(""), "")
        self.check(repl("\n\n   \n"), "")


class Terminal:
    """runcell repl on a pseudo-terminal, read with an anti-hang timeout."""

    def __init__(self, *opts, env=None):
        env = dict(os.environ, TERM="dumb", **(env or {}))
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.execve(RUNCELL, [RUNCELL, "repl", *opts], env)
            finally:
                os._exit(127)
        self.transcript = b""
        self.pending = b""
        self.status = None

    def read_until(self, token, timeout=60):
        """Reads until token appears; returns what was read up to and including it."""
        token = token.encode() if isinstance(token, str) else token
        deadline = time.monotonic() + timeout
        while token not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError("timed out waiting for %r; read so far: %r"
                                     % (token, self.pending[-2000:]))
            data = self._read()
            if not data:
                raise AssertionError("the repl ended while waiting for %r; read: %r"
                                     % (token, self.pending[-2000:]))
        end = self.pending.index(token) + len(token)
        out, self.pending = self.pending[:end], self.pending[end:]
        return out.decode("utf-8", "replace")

    def _read(self):
        try:
            data = os.read(self.fd, 65536)
        except OSError as e:
            if e.errno != errno.EIO:  # EIO: the other side is closed
                raise
            data = b""
        self.transcript += data
        self.pending += data
        return data

    def prompt(self, token="runcell> "):
        """Waits for a prompt, then for line editing to take the terminal: libedit prints
        the prompt before it leaves canonical mode, and what is typed in between is echoed
        twice, and a Ctrl-D there is lost."""
        out = self.read_until(token)
        deadline = time.monotonic() + 60
        while termios.tcgetattr(self.fd)[3] & termios.ICANON:
            if time.monotonic() > deadline:
                raise AssertionError("the terminal stayed in canonical mode after %r" % out)
            time.sleep(0.01)
        return out

    def continuation(self):
        return self.prompt("...     ")

    def send(self, text):
        os.write(self.fd, text.encode())

    def wait(self, timeout=60):
        """Reads to the end and returns the exit status."""
        deadline = time.monotonic() + timeout
        eof = False
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            if eof or self.fd is None:
                time.sleep(0.05)
            elif select.select([self.fd], [], [], 0.2)[0]:
                eof = not self._read()
        raise AssertionError("the repl did not end; read: %r" % self.transcript[-2000:])

    def close(self):
        if self.status is None:
            # SIGTERM ends the session cleanly; SIGKILL only if that did not work.
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.wait()
            except AssertionError:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class PtyReplTest(RuncellTestCase):
    def setUp(self):
        self.term = Terminal()
        self.addCleanup(self.term.close)

    def run_input(self, line):
        """Types a line at the prompt; returns what it printed before the next prompt."""
        self.term.send(line + "\r")
        return self.term.prompt()

    def test_prompt_result_and_ctrl_d(self):
        banner = self.term.prompt()
        self.assertIn("runcell repl: Python 3", banner)
        self.assertIn("Ctrl-D ends", banner)
        out = self.run_input("6 * 7")
        self.assertIn("42\r\n", out)
        self.term.send("\x04")
        self.assertEqual(self.term.wait(), 0)

    def test_non_ascii_typed_at_the_prompt(self):
        # In the C locale (a fresh host without LANG, as here) libedit once dropped every
        # non-ASCII character of the line.
        for term in (self.term, Terminal(env={"LANG": "", "LC_ALL": "", "LC_CTYPE": ""})):
            if term is not self.term:
                self.addCleanup(term.close)
            term.prompt()
            term.send("print(len('h\u00e9llo \u2603'), 'h\u00e9llo \u2603')\r")
            self.assertIn("7 h\u00e9llo \u2603\r\n", term.prompt())

    def test_continuation_prompt(self):
        self.term.prompt()
        self.term.send("for i in range(2):\r")
        self.term.continuation()
        self.term.send("    print('row', i)\r")
        self.term.continuation()
        out = self.run_input("")
        self.assertIn("row 0\r\nrow 1\r\n", out)

    def test_ctrl_c_interrupts_the_running_input(self):
        self.term.prompt()
        self.run_input("v = 7")
        self.run_input("import time")
        self.term.send("def loop():\r")
        self.term.continuation()
        self.term.send("    print('looping')\r")
        self.term.continuation()
        self.term.send("    while True: time.sleep(0.1)\r")
        self.term.continuation()
        self.run_input("")
        self.term.send("loop()\r")
        self.term.read_until("looping\r\n")  # the cell runs: Ctrl-C now reaches it
        self.term.send("\x03")
        out = self.term.prompt()
        self.assertIn("KeyboardInterrupt", out)
        # In loop(): in its sleep, or still in the print whose output was seen.
        self.assertIn(", in loop\r\n", out)
        self.assertIn("interrupted", out)
        out = self.run_input("print(v * 6)")
        self.assertIn("42\r\n", out, "the session lives on with its variables")
        self.term.send("\x04")
        self.assertEqual(self.term.wait(), 0)

    def test_ctrl_c_on_code_that_ignores_it_restarts_the_interpreter(self):
        self.term.prompt()
        self.run_input("open('kept.txt', 'w').write('file kept')")
        self.run_input("w = 1")
        self.term.send("def stubborn():\r")
        self.term.continuation()
        # 'stubborn' is printed inside the try: the ctrl-C follows that line, and a ctrl-C
        # that came while print still ran, before the try, ended the function there.
        for line in ["    import time", "    said = False", "    while True:",
                     "        try:", "            if not said:",
                     "                said = True", "                print('stubborn')",
                     "            time.sleep(0.1)",
                     "        except KeyboardInterrupt:", "            pass"]:
            self.term.send(line + "\r")
            self.term.continuation()
        self.run_input("")
        self.term.send("stubborn()\r")
        self.term.read_until("stubborn\r\n")
        self.term.send("\x03")
        out = self.term.prompt()
        self.assertIn("variables are lost", out)
        out = self.run_input("print(open('kept.txt').read(), 'w' in globals())")
        self.assertIn("file kept False\r\n", out)

    def test_ctrl_c_at_the_prompt(self):
        self.term.prompt()
        self.term.send("undefined_name")
        self.term.read_until("undefined_name")
        self.term.send("\x03")
        self.term.prompt()
        out = self.run_input("print('still', 'here')")
        self.assertIn("still here\r\n", out)
        self.term.send("\x04")
        self.assertEqual(self.term.wait(), 0)
        self.assertNotIn(b"NameError", self.term.transcript,
                         "the line interrupted at the prompt must not run")

    def test_error_in_a_terminal(self):
        self.term.prompt()
        out = self.run_input("1 / 0")
        self.assertIn("ZeroDivisionError: division by zero", out)
        self.assertIn('File "<cell 1>", line 1', out)
        out = self.run_input("'alive'")
        self.assertIn("'alive'\r\n", out)


class ReplSignalsTest(RuncellTestCase):
    """SIGTERM, or the terminal going away (SIGHUP), ends the session cleanly: nothing of it
    is left in runcell's run directory."""

    def start(self, rundir):
        term = Terminal(env={"RUNCELL_RUNDIR": rundir})
        self.addCleanup(term.close)
        term.prompt()
        return term

    def leftovers(self, rundir):
        return [e for e in os.listdir(rundir) if e != "uids"]

    def test_sigterm_at_the_prompt(self):
        with TempDir() as rundir:
            term = self.start(rundir)
            os.kill(term.pid, signal.SIGTERM)
            self.assertEqual(term.wait(), 128 + signal.SIGTERM)
            self.assertEqual(self.leftovers(rundir), [])

    def test_sigterm_during_an_input(self):
        with TempDir() as rundir:
            term = self.start(rundir)
            term.send("import time; print('sleeping'); time.sleep(600)\r")
            term.read_until("sleeping\r\n")
            os.kill(term.pid, signal.SIGTERM)
            self.assertEqual(term.wait(), 128 + signal.SIGTERM)
            self.assertIn(b"KeyboardInterrupt", term.transcript)
            self.assertEqual(self.leftovers(rundir), [])

    def test_terminal_closed_during_an_input(self):
        with TempDir() as rundir:
            term = self.start(rundir)
            term.send("import time; print('sleeping'); time.sleep(600)\r")
            term.read_until("sleeping\r\n")
            os.close(term.fd)  # hang up: SIGHUP to runcell
            term.fd = None
            self.assertEqual(term.wait(), 128 + signal.SIGHUP)
            self.assertEqual(self.leftovers(rundir), [])


if __name__ == "__main__":
    unittest.main()
