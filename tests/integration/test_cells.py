"""test_cells - the stateful Python kernel through `runcell run -c CELL -c CELL ...`: state
across cells, result kinds, streams, errors, timeouts, crashes, packages, files, isolation.

Each test starts one session (one runcell process) and checks the records it prints.
"""
import base64
import json
import os
import signal
import subprocess
import unittest

from rctest import (RUNCELL, CellsCase, cgroups_expected, TempDir, make_wheel, png_size, run_cells,
                    runcell)

_sandbox_modules = None


def sandbox_has(module):
    """Whether module imports inside the sandbox (probed once for the data stack and pip)."""
    global _sandbox_modules
    if _sandbox_modules is None:
        recs, p = run_cells("import importlib.util, json\n"
                            "print(json.dumps({m: importlib.util.find_spec(m) is not None\n"
                            "    for m in ('pandas', 'matplotlib', 'pip')}))")
        if not recs or recs[0]["status"] != "ok":
            raise AssertionError("cannot probe the sandbox: exit %d, stderr %s"
                                 % (p.returncode, p.stderr))
        _sandbox_modules = json.loads(recs[0]["stdout"])
    return _sandbox_modules.get(module, False)


def needs(module):
    """Skips the test when module is not importable in the sandbox."""
    def wrap(fn):
        def test(self):
            if not sandbox_has(module):
                self.skipTest("%s is not installed for /usr/bin/python3 (apt install "
                              "python3-%s)" % (module, module))
            return fn(self)
        test.__name__ = fn.__name__
        test.__doc__ = fn.__doc__
        return test
    return wrap


class StateTest(CellsCase):
    def test_variables_functions_imports_classes_persist(self):
        recs = self.cells(
            "x = 20\nimport math",
            "def double(n):\n    return 2 * n",
            "class Point:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
            "    def norm(self):\n        return math.hypot(self.a, self.b)",
            "p = Point(3, 4)\nprint(double(x) + 2, p.norm())",
            "type(p).__name__, math.pi > 3, x")
        for i, rec in enumerate(recs, 1):
            self.assertOk(rec)
            self.assertEqual(rec["execution_count"], i)
        self.assertEqual(recs[3]["stdout"], "42 5.0\n")
        self.assertEqual(self.plain(recs[4]), ["('Point', True, 20)"])

    def test_last_value_is_underscore(self):
        recs = self.cells("6 * 7", "_ + 1")
        self.assertEqual(self.plain(recs[1]), ["43"])


class ResultsTest(CellsCase):
    def test_last_expression_repr(self):
        recs = self.cells("1 + 1", "'text'", "[1, 'a', None]", "y = 5", "y")
        self.assertEqual(recs[0]["results"], [{"text/plain": "2"}])
        self.assertEqual(recs[1]["results"], [{"text/plain": "'text'"}])
        self.assertEqual(recs[2]["results"], [{"text/plain": "[1, 'a', None]"}])
        self.assertEqual(recs[3]["results"], [], "an assignment has no result")
        self.assertEqual(recs[4]["results"], [{"text/plain": "5"}])

    def test_none_gives_no_result(self):
        recs = self.cells("None", "print('p')", "def f(): pass\nf()")
        for rec in recs:
            self.assertOk(rec)
            self.assertEqual(rec["results"], [])
        self.assertEqual(recs[1]["stdout"], "p\n")

    @needs("pandas")
    def test_dataframe_html_and_plain(self):
        rec, = self.cells("import pandas as pd\n"
                          "pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3, 19]})")
        self.assertOk(rec)
        self.assertEqual(len(rec["results"]), 1)
        bundle = rec["results"][0]
        self.assertIn("<table", bundle["text/html"])
        self.assertIn("</table>", bundle["text/html"])
        self.assertIn("<td>Oslo</td>", bundle["text/html"])
        lines = bundle["text/plain"].splitlines()
        self.assertEqual(lines[0].split(), ["city", "temp"])
        self.assertEqual(lines[1].split(), ["0", "Oslo", "3"])
        self.assertEqual(lines[2].split(), ["1", "Lima", "19"])

    def test_repr_png(self):
        png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAA"
               "AABJRU5ErkJggg==")
        rec, = self.cells("import base64\n"
                          "class Dot:\n"
                          "    def _repr_png_(self):\n"
                          "        return base64.b64decode(%r)\n"
                          "    def __repr__(self):\n"
                          "        return '<a dot>'\n"
                          "Dot()" % png)
        self.assertOk(rec)
        self.assertEqual(len(rec["results"]), 1)
        bundle = rec["results"][0]
        self.assertEqual(bundle["text/plain"], "<a dot>")
        self.assertEqual(png_size(base64.b64decode(bundle["image/png"])), (1, 1))

    def test_display_gives_results_in_order(self):
        rec, = self.cells("print('before')\ndisplay(1, 'two')\nprint('after')\n3")
        self.assertOk(rec)
        self.assertEqual(self.plain(rec), ["1", "'two'", "3"])
        self.assertEqual(rec["stdout"], "before\nafter\n")

    def figure_size(self, bundle):
        self.assertIn("image/png", bundle, "not an image: %s" % list(bundle))
        return png_size(base64.b64decode(bundle["image/png"], validate=True))

    @needs("matplotlib")
    def test_matplotlib_show(self):
        rec, = self.cells("import matplotlib.pyplot as plt\n"
                          "fig = plt.figure(figsize=(4, 3), dpi=100)\n"
                          "plt.plot([1, 3, 2])\n"
                          "plt.show()\n"
                          "print('shown', plt.get_fignums())")
        self.assertOk(rec)
        self.assertEqual(rec["stdout"], "shown []\n", "show() closes the figure")
        self.assertEqual(len(rec["results"]), 1)
        self.assertEqual(self.figure_size(rec["results"][0]), (400, 300))
        self.assertIn("Figure size 400x300", rec["results"][0]["text/plain"])

    @needs("matplotlib")
    def test_matplotlib_figure_left_open(self):
        recs = self.cells("import matplotlib.pyplot as plt\n"
                          "plt.figure(figsize=(4, 3), dpi=100)\n"
                          "plt.bar(['a', 'b'], [1, 2])\n"
                          "None",
                          "plt.get_fignums()")
        self.assertOk(recs[0])
        self.assertEqual(len(recs[0]["results"]), 1)
        self.assertEqual(self.figure_size(recs[0]["results"][0]), (400, 300))
        self.assertEqual(self.plain(recs[1]), ["[]"], "figures are closed after the cell")

    @needs("matplotlib")
    def test_figure_as_the_value_is_shown_once(self):
        recs = self.cells("import matplotlib.pyplot as plt\n"
                          "fig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n"
                          "ax.plot([1, 2])\n"
                          "fig",
                          "plt.figure(figsize=(2, 1), dpi=100)",
                          "plt.get_fignums()")
        self.assertEqual([self.figure_size(b) for b in recs[0]["results"]], [(400, 300)])
        self.assertEqual([self.figure_size(b) for b in recs[1]["results"]], [(200, 100)])
        self.assertEqual(self.plain(recs[2]), ["[]"])

    @needs("matplotlib")
    def test_two_figures_in_one_cell(self):
        rec, = self.cells("import matplotlib.pyplot as plt\n"
                          "plt.figure(figsize=(2, 2), dpi=50); plt.plot([1])\n"
                          "plt.show()\n"
                          "plt.figure(figsize=(4, 3), dpi=100); plt.plot([2])\n"
                          "None")
        self.assertOk(rec)
        self.assertEqual([self.figure_size(b) for b in rec["results"]], [(100, 100), (400, 300)])


class StreamsTest(CellsCase):
    CODE = "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('three')"

    def test_stdout_and_stderr_in_the_record(self):
        rec, = self.cells(self.CODE)
        self.assertOk(rec)
        self.assertEqual(rec["stdout"], "one\nthree\n")
        self.assertEqual(rec["stderr"], "two\n")
        self.assertEqual(rec["truncated"], {"stdout": False, "stderr": False})

    def test_plain_mode_streams_in_order(self):
        p = subprocess.run([RUNCELL, "run", "-c", self.CODE, "-c", "print('cell 2')"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertEqual(p.stdout.decode(), "one\ntwo\nthree\ncell 2\n")

    def test_plain_mode_separates_streams(self):
        p = runcell("run", "-c", self.CODE, "-c", "'value'")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "one\nthree\n'value'\n")
        self.assertEqual(p.stderr, "two\n")

    def test_a_programs_output_keeps_its_place_among_the_cells(self):
        # The cell's print goes through the channel, a program's output through a pipe: the
        # kernel syncs with the daemon as the program starts, so that even a daemon that
        # wakes late (a loaded machine) takes them in the order they were written.
        rec, = self.cells(
            "import os, subprocess, sys\n"
            "for i in range(40):\n"
            "    print('py', i)\n"
            "    subprocess.run(['echo', 'child', str(i)])\n"
            "    os.system('echo system %d' % i)\n"
            "    print('err', i, file=sys.stderr)\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        print('forked', i, flush=True)\n"
            "        subprocess.run(['echo', 'grandchild', str(i)])\n"
            "        os._exit(0)\n"
            "    os.waitpid(pid, 0)\n"
            "    print('after', i)")
        self.assertOk(rec)
        want = []
        for i in range(40):
            want += ["py %d" % i, "child %d" % i, "system %d" % i, "forked %d" % i,
                     "grandchild %d" % i, "after %d" % i]
        self.assertEqual(rec["stdout"].splitlines(), want)
        self.assertEqual(rec["stderr"].splitlines(), ["err %d" % i for i in range(40)])

    def test_interrupted_while_starting_programs(self):
        # An interrupt that comes while the kernel waits for the daemon's answer to a sync
        # stops the cell as any other; the answer that comes later is not taken for the
        # next request.
        recs = self.cells("x = 41",
                          "import subprocess\nwhile True:\n    print('.')\n"
                          "    subprocess.run(['true'])",
                          "x + 1", "import subprocess\nprint(subprocess.run(['echo', 'ok'], "
                          "capture_output=True).stdout)",
                          opts=["--timeout", "2", "--keep-going"], expect_exit=124)
        self.assertStatus(recs[1], "timeout")
        self.assertEqual(recs[1]["state"], "kept", recs[1])
        self.assertEqual(recs[1]["error"]["name"], "KeyboardInterrupt")
        self.assertEqual(self.plain(recs[2]), ["42"])
        self.assertOk(recs[3])
        self.assertEqual(recs[3]["stdout"], "b'ok\\n'\n")

    def test_threads_and_child_processes(self):
        rec, = self.cells(
            "import os, subprocess, sys, threading\n"
            "def work(i):\n"
            "    print('thread', i)\n"
            "    print('thread err', i, file=sys.stderr)\n"
            "ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]\n"
            "for t in ts: t.start()\n"
            "for t in ts: t.join()\n"
            "subprocess.run(['echo', 'from echo'])\n"
            "os.system('echo from system; echo system err >&2')\n"
            "subprocess.run([sys.executable, '-c',\n"
            "                'import sys; sys.stderr.write(\"py child\\\\n\")'])\n"
            "print('end')")
        self.assertOk(rec)
        out = rec["stdout"].splitlines()
        err = rec["stderr"].splitlines()
        self.assertEqual(sorted(l for l in out if l.startswith("thread")),
                         ["thread 0", "thread 1", "thread 2"])
        self.assertIn("from echo", out)
        self.assertIn("from system", out)
        self.assertEqual(out[-1], "end")
        self.assertEqual(sorted(l for l in err if l.startswith("thread err")),
                         ["thread err 0", "thread err 1", "thread err 2"])
        self.assertIn("system err", err)
        self.assertIn("py child", err)

    def test_child_output_stays_in_its_cell(self):
        recs = self.cells("import subprocess\nsubprocess.run(['echo', 'first'])",
                          "subprocess.run(['echo', 'second']); print('py second')")
        self.assertEqual(recs[0]["stdout"], "first\n")
        self.assertEqual(recs[1]["stdout"], "second\npy second\n")

    def test_unicode_output(self):
        text = "h\u00e9llo \U0001f389 \u4e2d\u6587 \u0645\u0631\u062d\u0628\u0627"
        recs = self.cells("print(%r)" % text, "%r" % text)
        self.assertOk(recs[0])
        self.assertEqual(recs[0]["stdout"], text + "\n")
        self.assertEqual(self.plain(recs[1]), [repr(text)])

    def test_binary_output_repaired(self):
        recs = self.cells("import sys\nsys.stdout.buffer.write(b'ok\\xff\\xfe!\\n')\nNone",
                          "import os\nos.write(2, b'err\\xc3\\n')\nNone",
                          "print('still here')")
        for rec in recs:
            self.assertOk(rec)
        self.assertEqual(recs[0]["stdout"], "ok\ufffd\ufffd!\n")
        self.assertEqual(recs[1]["stderr"], "err\ufffd\n")
        self.assertEqual(recs[2]["stdout"], "still here\n")

    def test_binary_output_in_plain_mode_is_passed_through(self):
        p = subprocess.run([RUNCELL, "run", "-c",
                            "import sys\nsys.stdout.buffer.write(b'a\\xff\\xfeb\\n')\nNone"],
                           capture_output=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, b"a\xff\xfeb\n")

    def test_huge_output_truncated(self):
        recs = self.cells("for i in range(5):\n    print('x' * (1 << 20))\nprint('done')",
                          "print('next')")
        rec = recs[0]
        self.assertOk(rec)
        self.assertTrue(rec["truncated"]["stdout"])
        self.assertFalse(rec["truncated"]["stderr"])
        n = len(rec["stdout"].encode())
        self.assertTrue((1 << 20) - 4096 <= n <= (1 << 20) + 4096, "stdout is %d bytes" % n)
        self.assertIn("bytes of output dropped", rec["stdout"])
        self.assertTrue(rec["stdout"].endswith("done\n"), rec["stdout"][-100:])
        self.assertEqual(recs[1]["stdout"], "next\n")
        self.assertFalse(recs[1]["truncated"]["stdout"])

    def test_plain_mode_prints_all_of_an_output_under_the_cap(self):
        # More than the live head (512 KiB), less than the cap: nothing may go missing.
        p = subprocess.run([RUNCELL, "run", "-c", "print('a' * 700000)\nprint('done')",
                            "-c", "print('next')"], capture_output=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, b"a" * 700000 + b"\ndone\nnext\n")

    def test_script_mode_prints_all_of_an_output_under_the_cap(self):
        # The same for a one-shot script (a single bash -c), which streams the same way.
        p = subprocess.run([RUNCELL, "run", "--lang", "bash", "-c",
                            "head -c 700000 /dev/zero | tr '\\0' a; echo; echo done"],
                           capture_output=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, b"a" * 700000 + b"\ndone\n")

    def test_plain_mode_huge_output_has_head_marker_and_tail(self):
        p = subprocess.run([RUNCELL, "run", "-c",
                            "for i in range(5):\n    print(str(i) * (1 << 20))\nprint('done')",
                            "-c", "print('next')"], capture_output=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = p.stdout
        self.assertTrue((1 << 20) - 4096 <= len(out) <= (1 << 20) + 4096, len(out))
        self.assertTrue(out.startswith(b"0" * 1000))
        self.assertIn(b"bytes of output dropped", out)
        self.assertTrue(out.endswith(b"4" * 1000 + b"\ndone\nnext\n"), out[-100:])


class ErrorsTest(CellsCase):
    def test_exception_record(self):
        recs = self.cells("x = 1", "y = 2\nd = {}\nd['missing']", expect_exit=1)
        rec = recs[1]
        self.assertStatus(rec, "error")
        self.assertEqual(rec["state"], "kept")
        err = rec["error"]
        self.assertEqual(err["name"], "KeyError")
        self.assertEqual(err["value"], "'missing'")
        tb = err["traceback"]
        self.assertTrue(tb.startswith("Traceback (most recent call last):"), tb)
        self.assertIn('File "<cell 2>", line 3, in <module>', tb)
        self.assertIn("d['missing']", tb)
        self.assertTrue(tb.rstrip().endswith("KeyError: 'missing'"), tb)
        self.assertNotIn("kernel.py", tb)

    def test_traceback_into_a_function_of_an_earlier_cell(self):
        recs = self.cells("import math\n\ndef ratio(a, b):\n    return a / b",
                          "vals = [1, 2]\nratio(vals[0], vals[1] - 2)", expect_exit=1)
        err = recs[1]["error"]
        self.assertEqual(err["name"], "ZeroDivisionError")
        self.assertEqual(err["value"], "division by zero")
        tb = err["traceback"]
        self.assertNotIn("kernel.py", tb)
        cell2 = tb.index('File "<cell 2>", line 2, in <module>')
        cell1 = tb.index('File "<cell 1>", line 4, in ratio')
        self.assertLess(cell2, cell1, tb)
        self.assertIn("return a / b", tb, "the earlier cell's source line is shown")

    def test_syntax_error(self):
        recs = self.cells("ok = 1", "x = (1,\n     2 +)\n", "ok", expect_exit=1, n=2)
        err = recs[1]["error"]
        self.assertStatus(recs[1], "error")
        self.assertEqual(err["name"], "SyntaxError")
        self.assertEqual(err["lineno"], 2)
        self.assertEqual(err["offset"], 9)
        self.assertIn('File "<cell 2>", line 2', err["traceback"])
        self.assertNotIn("kernel.py", err["traceback"])

    def test_exception_stops_the_run(self):
        recs = self.cells("print('a')", "raise ValueError('boom')", "print('c')",
                          expect_exit=1, n=2)
        self.assertEqual(recs[1]["error"]["name"], "ValueError")
        self.assertEqual(recs[1]["error"]["value"], "boom")

    def test_keep_going_runs_the_rest(self):
        recs = self.cells("v = 'kept'", "raise ValueError('boom')", "print(v)", "1 / 0",
                          "print('last')", opts=["--keep-going"], expect_exit=1)
        self.assertEqual([r["status"] for r in recs], ["ok", "error", "ok", "error", "ok"])
        self.assertEqual(recs[2]["stdout"], "kept\n")
        self.assertEqual(recs[4]["stdout"], "last\n")

    def test_plain_mode_prints_the_traceback(self):
        p = runcell("run", "-c", "print('before')", "-c", "int('x')")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, "before\n")
        self.assertIn('File "<cell 2>", line 1, in <module>', p.stderr)
        self.assertIn("ValueError: invalid literal for int()", p.stderr)
        self.assertNotIn("kernel.py", p.stderr)

    def test_input_fails_at_once(self):
        recs = self.cells("name = input('your name? ')", "print('next')",
                          opts=["--keep-going", "--timeout", "120"], expect_exit=1, timeout=100)
        rec = recs[0]
        self.assertStatus(rec, "error")
        self.assertEqual(rec["error"]["name"], "EOFError")
        self.assertIn("input() is not available", rec["error"]["value"])
        self.assertNotIn("kernel.py", rec["error"]["traceback"])
        self.assertIn('File "<cell 1>", line 1, in <module>', rec["error"]["traceback"])
        self.assertEqual(recs[1]["stdout"], "next\n")

    def test_stdin_reads_end_of_file(self):
        rec, = self.cells("import sys\nsys.stdin.read()")
        self.assertOk(rec)
        self.assertEqual(self.plain(rec), ["''"])

    def test_sys_exit_status(self):
        recs = self.cells("print('a')", "import sys\nsys.exit(3)", "print('not reached')",
                          opts=["--keep-going"], expect_exit=3, n=2)
        rec = recs[1]
        self.assertStatus(rec, "error")
        self.assertEqual(rec["error"]["name"], "SystemExit")
        self.assertEqual(rec["exit_code"], 3)

    def test_sys_exit_zero(self):
        recs = self.cells("import sys\nsys.exit(0)", "print('not reached')", n=1)
        self.assertEqual(recs[0]["error"]["name"], "SystemExit")
        self.assertEqual(recs[0]["exit_code"], 0)
        p = runcell("run", "-c", "import sys\nsys.exit()")
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_sys_exit_after_a_failure_keeps_the_first_status(self):
        self.cells("1 / 0", "import sys\nsys.exit(4)", opts=["--keep-going"], expect_exit=1)

    def test_awkward_error_text_keeps_the_session(self):
        recs = self.cells("x = 'still here'",
                          "raise ValueError('lone \\ud800 surrogate and \\x00 nul')",
                          "class R:\n    def __repr__(self):\n        return 'nul\\x00repr'\nR()",
                          "class J:\n    def _repr_json_(self):\n"
                          "        return {'nan': float('nan'), 'big': 2 ** 70}\nJ()",
                          "x", opts=["--keep-going"], expect_exit=1)
        self.assertEqual([r["state"] for r in recs], ["kept"] * 5)
        self.assertEqual(recs[1]["error"]["name"], "ValueError")
        self.assertEqual(recs[1]["error"]["value"], "lone \ufffd surrogate and \ufffd nul")
        self.assertEqual(self.plain(recs[2]), ["nul\ufffdrepr"])
        self.assertEqual(recs[3]["results"][0]["application/json"],
                         {"nan": None, "big": str(2 ** 70)})
        self.assertEqual(self.plain(recs[4]), ["'still here'"])

    def test_interpreter_exit_status(self):
        recs = self.cells("open('f.txt', 'w').write('f')\nx = 1", "import os\nos._exit(5)",
                          "print(open('f.txt').read(), 'x' in dir())",
                          opts=["--keep-going"], expect_exit=5)
        rec = recs[1]
        self.assertStatus(rec, "crashed")
        self.assertEqual(rec["state"], "lost")
        self.assertEqual(rec["exit_code"], 5)
        self.assertIsNone(rec["signal"])
        self.assertIn("exited (status 5)", rec["message"])
        self.assertEqual(recs[2]["stdout"], "f False\n")

    def test_kernel_that_breaks_the_protocol_is_replaced(self):
        # User code can reach the control channel (the kernel's socket): what it writes there
        # must cost it its kernel, with a record that says why, and nothing more.
        recs = self.cells("x = 1\nopen('p.txt', 'w').write('p')\nNone",
                          "import os, stat, time\n"
                          "def is_socket(fd):\n"
                          "    try:\n"
                          "        return stat.S_ISSOCK(os.fstat(fd).st_mode)\n"
                          "    except OSError:\n"
                          "        return False\n"
                          "fd = [fd for fd in range(3, 1024) if is_socket(fd)][0]\n"
                          "os.write(fd, b'\\0\\0\\0\\5Zhello')\n"
                          "time.sleep(60)",
                          "print(open('p.txt').read(), 'x' in globals())",
                          opts=["--keep-going", "--timeout", "120"], expect_exit=137)
        rec = recs[1]
        self.assertStatus(rec, "crashed")
        self.assertEqual(rec["state"], "lost")
        self.assertIn("broke runcell's protocol", rec["message"])
        self.assertIn("unknown frame kind 0x5a", rec["message"])
        self.assertOk(recs[2])
        self.assertEqual(recs[2]["stdout"], "p False\n")


class LimitsTest(CellsCase):
    def test_timeout_keeps_state(self):
        recs = self.cells("x = 41",
                          "import time\nwhile True:\n    time.sleep(0.05)",
                          "x + 1", opts=["--timeout", "1", "--keep-going"], expect_exit=124)
        rec = recs[1]
        self.assertStatus(rec, "timeout")
        self.assertEqual(rec["state"], "kept")
        self.assertEqual(rec["error"]["name"], "KeyboardInterrupt")
        self.assertIn("variables are kept", rec["message"])
        self.assertIn('File "<cell 2>"', rec["error"]["traceback"])
        self.assertOk(recs[2])
        self.assertEqual(self.plain(recs[2]), ["42"])
        self.assertEqual(recs[2]["execution_count"], 3)

    def test_memory_peak_is_per_cell_or_says_it_is_the_sessions(self):
        # 150 MiB touched in cell 1, freed in cell 2 (whose peak still counts it: it was
        # there when the cell began), nothing in cell 3. cgroup v1 resets max_usage per cell;
        # v2 resets memory.peak (through one descriptor) only since Linux 6.12: before, the
        # figure is the session's peak and the record must say so.
        self.skip_unless_memory_limited()
        recs = self.cells("big = bytearray(150 << 20)\nfor i in range(0, len(big), 4096): big[i] = 1",
                          "del big", "1", opts=["--memory", "400"])
        first, second = recs[0]["usage"], recs[2]["usage"]
        self.assertGreaterEqual(first["memory_peak_kb"], 150 << 10, first)
        v2 = False
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            with open("/sys/fs/cgroup/cgroup.controllers") as f:
                v2 = "memory" in f.read().split()
        release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
        scope = "session" if v2 and release < (6, 12) else "cell"
        self.assertEqual(first["memory_peak_scope"], scope)
        self.assertEqual(second["memory_peak_scope"], scope)
        if scope == "cell":
            self.assertLess(second["memory_peak_kb"], 100 << 10, second)
        else:
            self.assertGreaterEqual(second["memory_peak_kb"], 150 << 10, second)

    def test_timeout_stops_the_run_without_keep_going(self):
        recs = self.cells("import time\nwhile True: time.sleep(0.05)", "print('no')",
                          opts=["--timeout", "1"], expect_exit=124, n=1)
        self.assertStatus(recs[0], "timeout")

    def test_timeout_that_ignores_the_interrupt_loses_state(self):
        recs = self.cells("x = 41\nopen('kept.txt', 'w').write('on disk')",
                          "import time\n"
                          "while True:\n"
                          "    try:\n"
                          "        time.sleep(0.05)\n"
                          "    except KeyboardInterrupt:\n"
                          "        pass",
                          "print(open('kept.txt').read())\n"
                          "print('x' in globals())\n"
                          "import os\n"
                          "print(os.getcwd())",
                          "x", opts=["--timeout", "1", "--keep-going"], expect_exit=124)
        rec = recs[1]
        self.assertStatus(rec, "timeout")
        self.assertEqual(rec["state"], "lost")
        self.assertIn("variables are lost", rec["message"])
        self.assertOk(recs[2])
        self.assertEqual(recs[2]["stdout"], "on disk\nFalse\n/workspace\n")
        self.assertEqual(recs[3]["error"]["name"], "NameError")
        self.assertEqual([r["execution_count"] for r in recs], [1, 2, 3, 4])

    def test_out_of_memory(self):
        self.skip_unless_memory_limited()
        recs = self.cells("x = 1\nopen('before.txt', 'w').write('written before')",
                          "blocks = []\n"
                          "for i in range(500):\n"
                          "    blocks.append(bytearray(1 << 20))\n",
                          "print(open('before.txt').read())\nprint('x' in globals())",
                          opts=["--memory", "200", "--keep-going"], expect_exit=137)
        rec = recs[1]
        self.assertStatus(rec, "oom")
        self.assertEqual(rec["state"], "lost")
        self.assertEqual(rec["signal"], 9)
        self.assertIn("out of memory", rec["message"])
        self.assertOk(recs[2])
        self.assertEqual(recs[2]["stdout"], "written before\nFalse\n")
        self.assertEqual(recs[2]["execution_count"], 3)

    def skip_unless_memory_limited(self):
        recs, p = run_cells("1", opts=["--memory", "200"])
        if recs and recs[0]["limits_degraded"]:
            expected, why = cgroups_expected()
            self.assertFalse(expected, "memory limits degraded where the host gives cgroups "
                             "(%s): %s" % (why, p.stderr.strip()))
            self.skipTest("memory limits are degraded here (%s): %s" % (why, p.stderr.strip()))

    def test_segfault(self):
        recs = self.cells("y = 2\nopen('s.txt', 'w').write('s')",
                          "import ctypes\nctypes.string_at(0)",
                          "print('alive', open('s.txt').read(), 'y' in globals())",
                          opts=["--keep-going"], expect_exit=139)
        rec = recs[1]
        self.assertStatus(rec, "crashed")
        self.assertEqual(rec["state"], "lost")
        self.assertEqual(rec["signal"], 11)
        self.assertIn("signal 11", rec["message"])
        self.assertOk(recs[2])
        self.assertEqual(recs[2]["stdout"], "alive s False\n")

    def test_output_before_a_crash_is_kept(self):
        recs = self.cells("import ctypes, subprocess\nprint('py before')\n"
                          "subprocess.run(['echo', 'child before'])\nctypes.string_at(0)",
                          expect_exit=139)
        self.assertStatus(recs[0], "crashed")
        self.assertEqual(recs[0]["stdout"], "py before\nchild before\n")


class PackagesTest(CellsCase):
    @needs("pip")
    def test_local_wheel_install_persists(self):
        with TempDir() as d:
            wheel = make_wheel(d, "rctiny", "0.1", {
                "rctiny/__init__.py": "def answer():\n    return 'tiny-42'\n"})
            name = os.path.basename(wheel)
            recs = self.cells(
                "import subprocess, sys\n"
                "p = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-index',\n"
                "                    './%s'], capture_output=True, text=True)\n"
                "print(p.returncode)\n"
                "print(p.stdout[-500:], p.stderr[-2000:], file=sys.stderr)" % name,
                "import rctiny\nrctiny.answer()",
                "rctiny.__file__.startswith('/workspace/')",
                opts=["--file", wheel], timeout=300)
        self.assertOk(recs[0])
        self.assertEqual(recs[0]["stdout"], "0\n", recs[0]["stderr"])
        self.assertIn("Successfully installed rctiny-0.1", recs[0]["stderr"])
        self.assertOk(recs[1])
        self.assertEqual(self.plain(recs[1]), ["'tiny-42'"])
        self.assertEqual(self.plain(recs[2]), ["True"])


    def test_a_module_written_by_a_cell_imports_at_once(self):
        """A module a cell writes into the workspace imports in that cell, right after an
        import of it failed, and in the next cell. The import system caches each directory's
        listing until its mtime changes; the kernel drops those caches when an import finds
        nothing (not before every cell), so a file written within the same clock tick as the
        last listing is found too."""
        cells = []
        for i in range(8):
            cells.append("try:\n    import rcsame%d\nexcept ImportError:\n    pass\n"
                         "open('rcsame%d.py', 'w').write('V = %d')\n"
                         "import rcsame%d\nrcsame%d.V" % (i, i, i, i, i))
            cells.append("import json\nopen('rcnext%d.py', 'w').write('V = %d')" % (i, i))
            cells.append("import rcnext%d\nrcnext%d.V" % (i, i))
        recs = self.cells(*cells)
        for i in range(8):
            for rec in recs[3 * i:3 * i + 3]:
                self.assertOk(rec)
            self.assertEqual(self.plain(recs[3 * i]), [str(i)])
            self.assertEqual(self.plain(recs[3 * i + 2]), [str(i)])


class FilesTest(CellsCase):
    def test_files_reported_per_cell(self):
        with TempDir() as d:
            src = os.path.join(d, "input.csv")
            with open(src, "w") as f:
                f.write("a,b\n1,2\n")
            recs = self.cells(
                "import os\nos.makedirs('out/deep', exist_ok=True)\n"
                "open('out/deep/r.txt', 'w').write('r')\nopen('a.txt', 'w').write('a')\nNone",
                "open('input.csv', 'a').write('3,4\\n')\nopen('b.txt', 'w').write('b')\nNone",
                "import os\nos.remove('a.txt')\nNone",
                "print('nothing')",
                opts=["--file", src])
        files = [r["files"] for r in recs]
        self.assertEqual(sorted(files[0]["created"]), ["a.txt", "out/deep/r.txt"])
        self.assertEqual(files[0]["modified"], [])
        self.assertEqual(files[1]["created"], ["b.txt"])
        self.assertEqual(files[1]["modified"], ["input.csv"])
        self.assertEqual(files[2], {"created": [], "modified": [], "deleted": ["a.txt"]})
        self.assertEqual(files[3], {"created": [], "modified": [], "deleted": []})

    @needs("matplotlib")
    def test_out_copies_files_and_saves_images(self):
        with TempDir() as d:
            out = os.path.join(d, "out")
            p = runcell("run", "--out", out,
                        "-c", "open('report.txt', 'w').write('the report')\nNone",
                        "-c", "import matplotlib.pyplot as plt\n"
                              "plt.figure(figsize=(4, 3), dpi=100); plt.plot([1, 2])\n"
                              "print('cell 2')\n'a value'",
                        "-c", "import os\nos.makedirs('sub', exist_ok=True)\n"
                              "open('sub/data.csv', 'w').write('1,2')\n"
                              "plt.figure(figsize=(2, 1), dpi=100); plt.plot([2, 1]); plt.show()\n"
                              "None")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(sorted(os.listdir(out)),
                             ["figure-2-1.png", "figure-3-1.png", "report.txt", "sub"])
            with open(os.path.join(out, "report.txt")) as f:
                self.assertEqual(f.read(), "the report")
            with open(os.path.join(out, "sub", "data.csv")) as f:
                self.assertEqual(f.read(), "1,2")
            with open(os.path.join(out, "figure-2-1.png"), "rb") as f:
                self.assertEqual(png_size(f.read()), (400, 300))
            with open(os.path.join(out, "figure-3-1.png"), "rb") as f:
                self.assertEqual(png_size(f.read()), (200, 100))
            self.assertIn("saved %s" % os.path.join(out, "figure-2-1.png"), p.stderr)
            # The images are files written to DIR too, and the summary counts them.
            summary = [l for l in p.stderr.splitlines() if "written to" in l]
            self.assertEqual(len(summary), 1, p.stderr)
            self.assertTrue(summary[0].startswith("runcell: 4 files written to %s:" % out),
                            p.stderr)
            self.assertEqual(sorted(summary[0].split(":", 2)[2].split()),
                             ["figure-2-1.png", "figure-3-1.png", "report.txt", "sub/data.csv"])
            self.assertIn("cell 2\n'a value'\n", p.stdout)

    @needs("matplotlib")
    def test_out_with_json_saves_images(self):
        with TempDir() as d:
            out = os.path.join(d, "out")
            recs = self.cells("import matplotlib.pyplot as plt\n"
                              "plt.figure(figsize=(3, 2), dpi=100); plt.plot([1])\nNone",
                              "open('x.txt', 'w').write('x')\nNone",
                              opts=["--out", out])
            self.assertEqual(len(recs[0]["results"]), 1)
            self.assertEqual(sorted(os.listdir(out)), ["figure-1-1.png", "x.txt"])
            with open(os.path.join(out, "figure-1-1.png"), "rb") as f:
                data = f.read()
            self.assertEqual(png_size(data), (300, 200))
            self.assertEqual(base64.b64decode(recs[0]["results"][0]["image/png"]), data)


class IsolationTest(CellsCase):
    def test_two_sessions_do_not_see_each_other(self):
        a = subprocess.Popen(
            [RUNCELL, "run", "--timeout", "120",
             "-c", "secret = 'session A'\n"
                   "open('/workspace/marker-a.txt', 'w').write('a')\n"
                   "open('/tmp/marker-a.txt', 'w').write('a')\n"
                   "None",
             "-c", "import subprocess\n"
                   "p = subprocess.Popen(['sleep', '987'])\n"
                   "print('ready', flush=True)\n"
                   "p.wait()"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = a.stdout.readline()
            self.assertEqual(line, b"ready\n", "session A did not start: %r" % line)
            rec, = self.cells(
                "import os, json\n"
                "procs = {}\n"
                "for pid in os.listdir('/proc'):\n"
                "    if pid.isdigit():\n"
                "        try:\n"
                "            procs[pid] = open('/proc/%s/cmdline' % pid, 'rb').read()"
                ".decode(errors='replace')\n"
                "        except OSError:\n"
                "            pass\n"
                "print(json.dumps({'ws': os.listdir('/workspace'), 'tmp': os.listdir('/tmp'),\n"
                "                  'procs': procs, 'secret': 'secret' in globals()}))")
            self.assertOk(rec)
            seen = json.loads(rec["stdout"])
            self.assertNotIn("marker-a.txt", seen["ws"])
            self.assertNotIn("marker-a.txt", seen["tmp"])
            self.assertFalse(seen["secret"])
            cmdlines = list(seen["procs"].values())
            self.assertTrue(any("kernel.py" in c for c in cmdlines), cmdlines)
            self.assertFalse(any("987" in c for c in cmdlines), cmdlines)
            self.assertLessEqual(len(cmdlines), 4, cmdlines)
            self.assertIsNone(a.poll(), "session A ended before the check")
        finally:
            a.send_signal(signal.SIGTERM)
            try:
                a.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                a.kill()
                a.communicate()
        self.assertEqual(a.returncode, 128 + signal.SIGTERM)


if __name__ == "__main__":
    unittest.main()
