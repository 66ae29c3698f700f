"""test_run - the `runcell run` contract (DESIGN.md "CLI", "Result record"), driven through
the real binary: languages and code sources, exit statuses, live streaming, the JSON record,
the output cap, files in and out, the environment inside, bad input, cleanup after normal
runs and after a SIGKILL of runcell, and the degraded (unprivileged) mode.

No test depends on how fast this machine is: every timeout below only stops a hang.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import unittest
import uuid

from rctest import (HANG, RUNCELL, RuncellTestCase, TempDir, cgroup_bases, cgroups_expected,
                    cgroups_of, is_root, mounts_below, procs_with, reachable_build, read_line,
                    run_dir_entries, run_json, runcell, wait_until)


def rec_of(p):
    """The JSON record on the stdout of a finished `runcell run --json`."""
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError("no JSON record; exit %d, stderr: %s" % (p.returncode, p.stderr))
    return json.loads(lines[-1])


def one_line(test, text):
    """Asserts that text is exactly one non-empty line and returns it."""
    lines = text.splitlines()
    test.assertEqual(len(lines), 1, "expected one line on stderr, got: %r" % text)
    test.assertTrue(lines[0].strip(), "empty error line")
    return lines[0]


# ---- the contract ----

class Languages(RuncellTestCase):
    def test_python_code(self):
        p = runcell("run", "-c", "print(6 * 7)")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "42\n")

    def test_python_file_with_arguments(self):
        with TempDir() as d:
            os.makedirs(os.path.join(d, "sub"))
            script = os.path.join(d, "sub", "prog.py")
            with open(script, "w") as f:
                f.write("import sys\nprint(sys.argv)\n")
            p = runcell("run", script, "a", "b c", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        # The script runs under its own name; everything after it is the script's.
        self.assertEqual(p.stdout, "['prog.py', 'a', 'b c', '--json']\n")

    def test_python_stdin_with_arguments(self):
        # As `python3 - x 'y z'`: argv[0] is "-", the code is the <stdin> script, and the
        # program's stdin is at its end once the code is read.
        p = runcell("run", "-", "x", "y z",
                    input="import sys\nprint(sys.argv, __file__)\nprint(repr(sys.stdin.read()))\n")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "['-', 'x', 'y z'] <stdin>\n''\n")

    def test_python_stdin_code_larger_than_an_argument(self):
        # Code on stdin is not a command-line argument, so the kernel's 128 KiB limit on one
        # does not apply to it.
        code = "x = 1\n" + "# padding line of a long generated script\n" * 6000 + "print(x + 1)\n"
        self.assertGreater(len(code), 200 * 1024)
        p = runcell("run", "-", input=code)
        self.assertEqual((p.returncode, p.stdout), (0, "2\n"), p.stderr)

    def test_python_code_with_arguments(self):
        # As `python3 -c CODE 1 --two`: argv[0] is "-c".
        p = runcell("run", "-c", "import sys; print(sys.argv)", "1", "--two")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "['-c', '1', '--two']\n")
        p = runcell("run", "-c", "import sys; print(sys.argv)", "-c", "print(sys.argv)", "z")
        self.assertEqual(p.stdout, "['-c', 'z']\n['-c', 'z']\n", p.stderr)

    def test_bash_code_file_and_stdin(self):
        p = runcell("run", "--lang", "bash", "-c", 'echo "$1|$2"; exit 4', "p", "q r")
        self.assertEqual((p.returncode, p.stdout), (4, "p|q r\n"), p.stderr)
        with TempDir() as d:
            script = os.path.join(d, "s.sh")
            with open(script, "w") as f:
                f.write('echo "$0|$1"; pwd\n')
            p = runcell("run", "--lang", "bash", script, "arg")
        self.assertEqual((p.returncode, p.stdout), (0, "s.sh|arg\n/workspace\n"), p.stderr)
        p = runcell("run", "--lang", "bash", "-", "v", input='echo "got $1"\n')
        self.assertEqual((p.returncode, p.stdout), (0, "got v\n"), p.stderr)

    def test_bash_record(self):
        rec, p = run_json("echo out; echo err >&2; exit 7", lang="bash")
        self.assertEqual(p.returncode, 7)
        self.assertStatus(rec, "error")
        self.assertEqual((rec["stdout"], rec["stderr"], rec["exit_code"]), ("out\n", "err\n", 7))


class ExitStatus(RuncellTestCase):
    def test_program_status_is_passed_through(self):
        for code, want in (("pass", 0), ("import sys; sys.exit(3)", 3), ("raise SystemExit(200)", 200)):
            p = runcell("run", "-c", code)
            self.assertEqual(p.returncode, want, "%s: %s" % (code, p.stderr))

    def test_uncaught_exception_is_1_and_error(self):
        # -c code runs as a cell: the exception is the record's error, the CLI exits 1.
        rec, p = run_json("d = {}\nd['fare']")
        self.assertEqual(p.returncode, 1)
        self.assertStatus(rec, "error")
        self.assertEqual((rec["error"]["name"], rec["error"]["value"]), ("KeyError", "'fare'"))
        self.assertIn("KeyError: 'fare'", rec["error"]["traceback"])
        self.assertIsNone(rec["exit_code"])
        # A script is a process: its status is 1 and the traceback is on its stderr.
        with TempDir() as d:
            script = os.path.join(d, "fail.py")
            with open(script, "w") as f:
                f.write("d = {}\nd['fare']\n")
            p = runcell("run", "--json", script)
        rec = json.loads(p.stdout)
        self.assertEqual((p.returncode, rec["exit_code"]), (1, 1))
        self.assertStatus(rec, "error")
        self.assertIn("KeyError: 'fare'", rec["stderr"])

    def test_timeout_is_124(self):
        rec, p = run_json("while True: pass", "--timeout", "1")
        self.assertEqual(p.returncode, 124)
        self.assertStatus(rec, "timeout")
        self.assertIsNone(rec["exit_code"])
        self.assertIn("timed out", rec["message"])
        p = runcell("run", "--timeout", "0.5", "-c", "import time; time.sleep(100)")
        self.assertEqual(p.returncode, 124)
        self.assertIn("timed out", p.stderr)

    def test_oom_is_137(self):
        hog = "a = []\nwhile True: a.append(bytearray(1 << 20))"
        rec, p = run_json(hog, "--memory", "64")
        if rec["limits_degraded"]:
            expected, why = cgroups_expected()
            self.assertFalse(expected, "limits degraded where the host gives cgroups (%s): %s"
                             % (why, p.stderr))
            self.skipTest("no memory cgroup to be had here (%s); see DegradedMode" % why)
        self.assertEqual(p.returncode, 137, rec)
        self.assertStatus(rec, "oom")
        self.assertEqual(rec["signal"], 9)
        self.assertIsNone(rec["exit_code"])
        p = runcell("run", "--memory", "64", "-c", hog)
        self.assertEqual(p.returncode, 137)
        self.assertIn("out of memory", p.stderr)

    def test_signal_is_128_plus_n(self):
        rec, p = run_json("import os; os.kill(os.getpid(), 15)")
        self.assertEqual(p.returncode, 143)
        self.assertStatus(rec, "killed")
        self.assertEqual((rec["signal"], rec["exit_code"]), (15, None))

    def test_segfault_is_139_crashed(self):
        rec, p = run_json("import ctypes; ctypes.string_at(0)")
        self.assertEqual(p.returncode, 139)
        self.assertStatus(rec, "crashed")
        self.assertEqual(rec["signal"], 11)

    def test_sandbox_setup_failure_is_125(self):
        with TempDir() as empty:
            env = {"RUNCELL_LIBEXEC": empty}
            p = runcell("run", "-c", "print('never')", env=env)
            self.assertEqual(p.returncode, 125)
            self.assertNotIn("never", p.stdout)
            self.assertIn("runcell-sandbox", one_line(self, p.stderr))
            p = runcell("run", "--json", "-c", "print('never')", env=env)
        self.assertEqual(p.returncode, 125)
        rec = rec_of(p)
        self.assertStatus(rec, "sandbox_error")
        self.assertIn("RUNCELL_LIBEXEC", rec["message"])

    def test_a_low_open_files_limit_is_kept_not_refused(self):
        # The sandbox's own limit (1024) is above this hard one, which only
        # CAP_SYS_RESOURCE of the host could raise: the sandbox takes the lower one.
        p = subprocess.run(["prlimit", "--nofile=512:512", RUNCELL, "run", "-c",
                            "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"],
                           capture_output=True, text=True, timeout=HANG)
        self.assertEqual((p.returncode, p.stdout), (0, "(512, 512)\n"), p.stderr)

    def test_sigterm_to_runcell_kills_the_sandbox(self):
        token = uuid.uuid4().hex
        p = subprocess.Popen([RUNCELL, "run", "--json", "--lang", "bash", "-c",
                              "sleep 300; : " + token],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertTrue(wait_until(lambda: procs_with(token, but=(p.pid,))),
                            "the sandbox never started")
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=HANG)
        finally:
            p.kill()
        self.assertEqual(p.returncode, 143, err)
        rec = json.loads(out)
        self.assertStatus(rec, "killed")
        self.assertTrue(wait_until(lambda: not procs_with(token)), "sandbox processes survived")


# The cell blocks SIGUSR1, says it is up, and waits for SIGUSR1, which the test sends once
# it has read the first line: the run cannot be over before that line was read.
WAIT_FOR_USR1 = ("import signal\n"
                 "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n")
AWAIT_USR1 = "signal.sigwait({signal.SIGUSR1})\n"


def release_waiting_cells(root_pid):
    """Sends SIGUSR1 to the interpreters under root_pid; returns how many. Called once the
    cell's first line was read, when the cell blocks SIGUSR1 (or waits for it: sigwait
    unblocks it meanwhile, so /proc cannot tell the two apart) and nothing else is running
    Python there. The sandbox's init is left alone."""
    parent = {}
    for name in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
            parent[int(name)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (ValueError, OSError):
            continue
    under, todo = set(), [root_pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in under]
        under.update(kids)
        todo.extend(kids)
    sent = 0
    for pid in under:
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().strip() != "python3":
                    continue
            os.kill(pid, signal.SIGUSR1)
            sent += 1
        except OSError:
            continue
    return sent


class LiveOutput(RuncellTestCase):
    def test_output_streams_before_the_end(self):
        code = WAIT_FOR_USR1 + 'print("first", flush=True)\n' + AWAIT_USR1 + 'print("second")'
        p = subprocess.Popen([RUNCELL, "run", "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            first, early = read_line(p.stdout)
            self.assertEqual(release_waiting_cells(p.pid), 1, "the cell was not waiting")
            rest, err = p.communicate(timeout=HANG)
        finally:
            p.kill()
        self.assertEqual(first, b"first\n")
        self.assertEqual((early + rest, p.returncode), (b"second\n", 0), err)

    def test_stderr_streams_too(self):
        code = (WAIT_FOR_USR1 + 'import sys\nprint("err-first", file=sys.stderr)\n' +
                AWAIT_USR1)
        p = subprocess.Popen([RUNCELL, "run", "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            first, _ = read_line(p.stderr)
            self.assertEqual(release_waiting_cells(p.pid), 1, "the cell was not waiting")
            p.communicate(timeout=HANG)
        finally:
            p.kill()
        self.assertEqual(first, b"err-first\n")
        self.assertEqual(p.returncode, 0)


# What runcell (src/cli/main.c) must not load for `run`: the libraries only runcell-full's
# commands use, each ~ms of its start.
SERVER_LIBS = ("libcurl", "libsqlite3", "libmicrohttpd", "libedit", "libcrypto", "libssl")


class Front(RuncellTestCase):
    """runcell has only `run`; every other command is runcell-full, exec'd in its place."""

    def test_a_running_one_shot_has_none_of_the_server_libraries_mapped(self):
        code = WAIT_FOR_USR1 + 'print("ready", flush=True)\n' + AWAIT_USR1
        p = subprocess.Popen([RUNCELL, "run", "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            line, _ = read_line(p.stdout)  # the loader has mapped all it will by now
            with open("/proc/%d/maps" % p.pid) as f:
                maps = f.read()
            self.assertEqual(release_waiting_cells(p.pid), 1, "the cell was not waiting")
            p.communicate(timeout=HANG)
        finally:
            p.kill()
        self.assertEqual(line, b"ready\n")
        self.assertIn(os.path.realpath(RUNCELL), maps)  # the maps of runcell itself
        # Linked static (src/meson.build), it maps no library; a sanitizer build's maps
        # libjansson and libc, and none of the server's.
        self.assertEqual([lib for lib in SERVER_LIBS if lib in maps], [])

    def test_another_command_is_runcell_full_in_the_same_process(self):
        srv = subprocess.Popen([RUNCELL, "mcp"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            srv.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
            srv.stdin.flush()
            reply, _ = read_line(srv.stdout)
            exe = os.readlink("/proc/%d/exe" % srv.pid)
            with open("/proc/%d/maps" % srv.pid) as f:
                maps = f.read()
        finally:
            srv.kill()
            srv.communicate()
        self.assertEqual(json.loads(reply)["id"], 1)
        self.assertEqual(exe, os.path.join(os.path.dirname(os.path.realpath(RUNCELL)),
                                           "runcell-full"))
        self.assertIn("libsqlite3", maps)

    def test_a_missing_runcell_full_is_named_with_what_to_do(self):
        if os.path.exists("/usr/local/libexec/runcell/runcell-full"):
            self.skipTest("an installed runcell-full would be found (/usr/local/libexec)")
        with TempDir() as d:
            alone = os.path.join(d, "runcell")
            shutil.copy(RUNCELL, alone)
            p = subprocess.run([alone, "doctor"], capture_output=True, text=True,
                               timeout=HANG)
            ran = subprocess.run([alone, "--version"], capture_output=True, text=True,
                                 timeout=HANG)
        self.assertEqual(p.returncode, 127, p.stderr)
        self.assertIn("runcell doctor: cannot start /usr/local/libexec/runcell/runcell-full",
                      p.stderr)
        self.assertIn("reinstall runcell", p.stderr)
        self.assertEqual((ran.returncode, ran.stdout.split()[0]), (0, "runcell"))


class Record(RuncellTestCase):
    FIELDS = {"status", "stdout", "stderr", "truncated", "results", "error", "files",
              "exit_code", "signal", "usage", "limits_degraded"}

    def test_fields_of_a_successful_run(self):
        rec, p = run_json("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                          "x = b'x' * (20 << 20)\nsum(range(10**6))")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.count("\n"), 1, "--json prints the record and nothing else")
        self.assertLessEqual(self.FIELDS, set(rec))
        self.assertStatus(rec, "ok")
        self.assertEqual((rec["stdout"], rec["stderr"]), ("out\n", "err\n"))
        self.assertEqual(rec["truncated"], {"stdout": False, "stderr": False})
        # -c code is a cell: the last expression's value is a result, no process exited.
        self.assertEqual(rec["results"], [{"text/plain": "499999500000"}])
        self.assertIsNone(rec["error"])
        self.assertEqual(rec["files"], {"created": [], "modified": [], "deleted": []})
        self.assertEqual((rec["exit_code"], rec["signal"]), (None, None))
        self.assertEqual((rec["state"], rec["execution_count"]), ("kept", 1))
        u = rec["usage"]
        self.assertGreater(u["wall_ms"], 0)
        self.assertGreater(u["cpu_ms"], 0)
        self.assertGreater(u["memory_peak_kb"], 0)
        self.assertIsInstance(rec["limits_degraded"], bool)
        if is_root() and not rec["limits_degraded"]:
            # With a memory cgroup the peak counts the 20 MiB the program touched.
            self.assertGreaterEqual(u["memory_peak_kb"], 20 << 10)
        self.assertNotIn("message", rec)

    def test_not_degraded_as_root_with_cgroups(self):
        if not is_root():
            self.skipTest("needs root")
        expected, why = cgroups_expected()
        if not expected:
            self.skipTest("this host gives root no cgroups: %s" % why)
        rec, p = run_json("pass")
        self.assertFalse(rec["limits_degraded"], "%s, stderr %s" % (why, p.stderr))
        self.assertNotIn("warning", p.stderr)

    def test_output_cap_keeps_head_and_tail(self):
        code = ("import sys\n"
                "for i in range(50000):\n"
                "    sys.stdout.write(('line %06d ' % i).ljust(99, 'x') + '\\n')\n"
                "print('FINAL-LINE')\n")
        total = 50000 * 100 + len("FINAL-LINE\n")
        rec, p = run_json(code)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["truncated"], {"stdout": True, "stderr": False})
        out = rec["stdout"]
        m = re.search(r"\n\[\.\.\. runcell: (\d+) bytes of output dropped \.\.\.\]\n", out)
        self.assertIsNotNone(m, "no truncation marker")
        head, tail = out[:m.start()], out[m.end():]
        self.assertTrue(head.startswith("line 000000 "))
        self.assertTrue(tail.endswith("FINAL-LINE\n"), "the program did not run to the end")
        self.assertEqual(len(head) + int(m.group(1)) + len(tail), total)
        self.assertLessEqual(len(head) + len(tail), 1 << 20)
        self.assertGreater(len(head) + len(tail), (1 << 20) - 1024)

    def test_output_cap_in_plain_mode(self):
        code = ("import sys\n"
                "for i in range(50000):\n"
                "    sys.stdout.write(('line %06d ' % i).ljust(99, 'x') + '\\n')\n"
                "print('FINAL-LINE')\n")
        p = runcell("run", "-c", code)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertTrue(p.stdout.startswith("line 000000 "))
        self.assertIn("bytes of output dropped", p.stdout)
        self.assertTrue(p.stdout.endswith("FINAL-LINE\n"))
        self.assertLess(len(p.stdout), (1 << 20) + 200)

    def test_output_between_head_and_cap_is_all_printed(self):
        # More than the live head (512 KiB) but less than the cap: nothing is dropped, in
        # the record or on the terminal.
        code = "import sys\nsys.stdout.write('x' * 600000)\nprint('END')"
        p = runcell("run", "-c", code)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(p.stdout), 600004)
        self.assertTrue(p.stdout.endswith("xEND\n"))
        rec, _ = run_json(code)
        self.assertEqual(rec["truncated"]["stdout"], False)
        self.assertEqual(len(rec["stdout"]), 600004)

    def test_stderr_cap(self):
        code = "import sys\nsys.stderr.write('e' * (3 << 20))\nsys.stderr.write('LAST\\n')"
        rec, p = run_json(code)
        self.assertEqual(rec["truncated"], {"stdout": False, "stderr": True})
        self.assertTrue(rec["stderr"].endswith("eLAST\n"))
        self.assertIn("bytes of output dropped", rec["stderr"])


class Text(RuncellTestCase):
    UNI = "héllo ✓ 日本語 🎉"

    def test_unicode_output(self):
        code = "import sys\nprint(%r)\nprint(%r, file=sys.stderr)" % (self.UNI, self.UNI)
        p = runcell("run", "-c", code)
        self.assertEqual((p.stdout, p.stderr), (self.UNI + "\n", self.UNI + "\n"))
        rec, _ = run_json(code)
        self.assertEqual((rec["stdout"], rec["stderr"]), (self.UNI + "\n", self.UNI + "\n"))

    def test_unicode_code_and_arguments(self):
        p = runcell("run", "-c", "import sys; print('ü', sys.argv[1])", "ß→")
        self.assertEqual(p.stdout, "ü ß→\n", p.stderr)

    def test_invalid_utf8_is_repaired_in_json_only(self):
        code = ("import sys\n_ = sys.stdout.buffer.write(b'a\\xffb\\xc3\\n')\n"
                "_ = sys.stderr.buffer.write(b'\\xfe\\n')")
        p = subprocess.run([RUNCELL, "run", "-c", code], capture_output=True, timeout=HANG)
        self.assertEqual((p.stdout, p.stderr), (b"a\xffb\xc3\n", b"\xfe\n"))
        rec, p = run_json(code)
        self.assertEqual(rec["stdout"], "a\ufffdb\ufffd\n")
        self.assertEqual(rec["stderr"], "\ufffd\n")
        json.loads(p.stdout.encode("utf-8"))  # the record itself is valid UTF-8


class Files(RuncellTestCase):
    def test_inputs_outputs_and_changes(self):
        with TempDir() as d:
            for name, text in (("in.txt", "hello\n"), ("keep.txt", "keep\n"), ("del.txt", "x")):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            out = os.path.join(d, "out", "not", "yet")  # --out creates it
            code = ("import os\n"
                    "assert open('data/sub/in.txt').read() == 'hello\\n'\n"
                    "assert open('keep.txt').read() == 'keep\\n'\n"
                    "open('data/sub/in.txt', 'a').write('more\\n')\n"
                    "os.remove('del.txt')\n"
                    "os.makedirs('res/deep')\n"
                    "open('res/deep/r.txt', 'w').write('r')\n"
                    "open('new.txt', 'w').write('n')\n")
            rec, p = run_json(code, "--file", os.path.join(d, "in.txt") + ":data/sub/in.txt",
                              "--file", os.path.join(d, "keep.txt"),
                              "--file", os.path.join(d, "del.txt"), "--out", out)
            self.assertStatus(rec, "ok")
            self.assertEqual(rec["files"], {"created": ["new.txt", "res/deep/r.txt"],
                                            "modified": ["data/sub/in.txt"],
                                            "deleted": ["del.txt"]})
            got = sorted(os.path.relpath(os.path.join(r, f), out)
                         for r, _, fs in os.walk(out) for f in fs)
            self.assertEqual(got, ["data/sub/in.txt", "new.txt", "res/deep/r.txt"])
            with open(os.path.join(out, "data/sub/in.txt")) as f:
                self.assertEqual(f.read(), "hello\nmore\n")
            with open(os.path.join(out, "res/deep/r.txt")) as f:
                self.assertEqual(f.read(), "r")
            with open(os.path.join(d, "in.txt")) as f:
                self.assertEqual(f.read(), "hello\n", "the host's input file was changed")

    def test_script_is_not_reported_or_copied_out(self):
        with TempDir() as d:
            script = os.path.join(d, "job.py")
            with open(script, "w") as f:
                f.write("open('result.csv', 'w').write('a,b\\n')\n")
            out = os.path.join(d, "out")
            p = runcell("run", "--json", "--out", out, script)
            rec = rec_of(p)
            self.assertEqual(rec["files"]["created"], ["result.csv"])
            self.assertEqual(os.listdir(out), ["result.csv"])
            p = runcell("run", "--out", out, script)  # plain mode says what it wrote
            self.assertEqual(p.returncode, 0)
            self.assertIn("1 file written to %s: result.csv" % out, p.stderr)

    def test_links_are_not_copied_out(self):
        with TempDir() as d:
            out = os.path.join(d, "out")
            p = runcell("run", "--out", out, "-c",
                        "import os\nopen('real.txt', 'w').write('r')\n"
                        "os.symlink('/etc/passwd', 'link')\n")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(os.listdir(out), ["real.txt"])
            self.assertIn("1 file written to %s: real.txt\n" % out, p.stderr)
            self.assertIn("link is a symbolic link", p.stderr)

    def test_out_dir_with_nothing_produced(self):
        with TempDir() as d:
            out = os.path.join(d, "o")
            p = runcell("run", "--out", out, "-c", "pass")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(os.listdir(out) if os.path.isdir(out) else [], [])


class Environment(RuncellTestCase):
    def test_clean_environment_and_cwd(self):
        code = "import os, json; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
        p = runcell("run", "-c", code, env={"RUNCELL_TEST_CANARY": "leak-me",
                                            "AWS_SECRET_ACCESS_KEY": "leak-me-too"})
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout)
        env = got["env"]
        self.assertEqual(got["cwd"], "/workspace")
        self.assertEqual(env["HOME"], "/workspace")
        self.assertEqual(env["LANG"], "C.UTF-8")
        self.assertEqual(env["MPLBACKEND"], "Agg")
        self.assertEqual(env["TMPDIR"], "/tmp")
        self.assertIn("/usr/bin", env["PATH"].split(":"))
        self.assertNotIn("RUNCELL_TEST_CANARY", env)
        self.assertNotIn("AWS_SECRET_ACCESS_KEY", env)
        self.assertNotIn("leak-me", json.dumps(env))

    def test_bash_sees_the_same(self):
        p = runcell("run", "--lang", "bash", "-c", 'echo "$HOME $PWD ${RUNCELL_TEST_CANARY:-absent}"',
                    env={"RUNCELL_TEST_CANARY": "leak-me"})
        self.assertEqual(p.stdout, "/workspace /workspace absent\n", p.stderr)


class BadInput(RuncellTestCase):
    """Each is one line on stderr naming the culprit, exit 2, and nothing run."""

    def check(self, args, *needles, input=None):
        p = runcell("run", *args, input=input)
        self.assertEqual(p.returncode, 2, "%s: %s" % (args, p.stderr))
        self.assertEqual(p.stdout, "", args)
        line = one_line(self, p.stderr)
        self.assertTrue(line.startswith("runcell run: "), line)
        for n in needles:
            self.assertIn(n, line, args)
        return line

    def test_unknown_options(self):
        self.check(["--bogus", "-c", "pass"], "--bogus")
        self.check(["-x", "-c", "pass"], "-x")
        self.check(["--json=1", "-c", "pass"], "--json", "takes no value")

    def test_option_without_value(self):
        self.check(["--memory"], "--memory", "needs a value")
        self.check(["--timeout"], "--timeout", "needs a value")
        self.check(["-c"], "-c")

    def test_missing_file(self):
        self.check(["/nonexistent/prog.py"], "/nonexistent/prog.py")

    def test_bad_numbers(self):
        self.check(["--memory", "abc", "-c", "pass"], "--memory", "'abc'")
        self.check(["--memory", "0", "-c", "pass"], "--memory", "'0'")
        self.check(["--timeout", "-1", "-c", "pass"], "--timeout", "'-1'")
        self.check(["--timeout", "0", "-c", "pass"], "--timeout", "'0'")
        self.check(["--timeout", "nan", "-c", "pass"], "--timeout", "'nan'")
        self.check(["--pids", "many", "-c", "pass"], "--pids", "'many'")
        self.check(["--cpus", "-2", "-c", "pass"], "--cpus", "'-2'")
        self.check(["--cpus", "0.0004", "-c", "pass"], "--cpus", "'0.0004'", "0.001 of a core")

    def test_binary_file(self):
        with TempDir() as d:
            path = os.path.join(d, "blob.py")
            with open(path, "wb") as f:
                f.write(b"print(1)\n\x00\x01\x02")
            self.check([path], path, "not text")

    def test_nul_on_stdin(self):
        self.check(["-"], "stdin", "not text", input="print(1)\0\n")

    def test_unknown_language(self):
        self.check(["--lang", "cobol", "-c", "pass"], "--lang", "cobol")

    def test_network_policy(self):
        self.check(["--net", "open", "-c", "pass"], "--net", "open")
        self.check(["--net", "allow:a..b", "-c", "pass"], "--net", "a..b")

    def test_file_options(self):
        self.check(["--file", "/etc/hostname:../x", "-c", "pass"], "--file", "../x")
        self.check(["--file", "/etc/hostname:a/../../b", "-c", "pass"], "--file", "a/../../b")
        self.check(["--file", "/etc/hostname:/etc/x", "-c", "pass"], "--file", "/etc/x")
        self.check(["--file", "/nonexistent/data.csv", "-c", "pass"], "--file",
                   "/nonexistent/data.csv")
        self.check(["--file", ":x", "-c", "pass"], "--file", "':x'")
        self.check(["--file", "/etc", "-c", "pass"], "--file", "/etc")

    def test_out_not_a_directory(self):
        with TempDir() as d:
            plain = os.path.join(d, "file")
            open(plain, "w").close()
            self.check(["--out", plain, "-c", "print('ran')"], "--out", plain)
            self.check(["--out", plain + "/sub", "-c", "print('ran')"], "--out", plain + "/sub")

    def test_no_code(self):
        self.check([], "nothing to run")
        self.check(["--json"], "nothing to run")


class SecondsOptions(RuncellTestCase):
    """Seconds options stop at one day, the idle timeouts of serve and mcp at seven (the
    default of --max-idle-timeout is 604800)."""

    def usage_line(self, args):
        p = runcell(*args)
        self.assertEqual(p.returncode, 2, "%s: %s" % (args, p.stderr))
        return one_line(self, p.stderr)

    def test_idle_timeouts_go_up_to_seven_days(self):
        for cmd, opt in (("serve", "--max-idle-timeout"), ("serve", "--idle-timeout"),
                         ("mcp", "--idle-timeout")):
            # Accepted: parsing goes on to the stray argument, which is what is refused.
            line = self.usage_line([cmd, opt, "604800", "stray"])
            self.assertEqual(line, "runcell %s: unexpected argument 'stray'" % cmd)
            line = self.usage_line([cmd, opt, "604801", "stray"])
            self.assertTrue(line.startswith("runcell %s: %s: '604801'" % (cmd, opt)), line)
            self.assertIn("at most 604800", line)

    def test_other_seconds_options_stop_at_one_day(self):
        line = self.usage_line(["serve", "--max-timeout", "86401", "stray"])
        self.assertIn("--max-timeout: '86401'", line)
        self.assertIn("at most 86400", line)
        line = self.usage_line(["mcp", "--max-timeout", "86401"])
        self.assertIn("--max-timeout: '86401'", line)
        line = self.usage_line(["run", "--timeout", "86401", "-c", "pass"])
        self.assertIn("--timeout: '86401'", line)


class Help(RuncellTestCase):
    def test_help_names_the_network_and_package_options(self):
        for cmd in ("run", "repl"):
            p = runcell(cmd, "--help")
            self.assertEqual(p.returncode, 0, p.stderr)
            for opt in ("allow:HOST[:PORT]", "--package", "--index-url", "--install-timeout"):
                self.assertIn(opt, p.stdout, cmd)
        for cmd in ("agent", "mcp"):  # these refuse them, and say so
            p = runcell(cmd, "--help")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("--package, --index-url and --install-timeout are refused", p.stdout)


class OptionErrors(RuncellTestCase):
    """One parser reads every subcommand's options (src/cli/opttab.c): each says the same of
    the same mistake, in one line, with exit status 2, and runs nothing."""

    COMMANDS = ("run", "repl", "serve", "mcp", "agent", "review", "doctor")

    def usage_line(self, cmd, *args):
        p = runcell(cmd, *args, input="")
        self.assertEqual((p.returncode, p.stdout), (2, ""), "%s %s: %s" % (cmd, args, p.stderr))
        return one_line(self, p.stderr)

    def test_an_unknown_option(self):
        for cmd in self.COMMANDS:
            for opt in ("--bogus", "-x"):
                self.assertEqual(self.usage_line(cmd, opt),
                                 "runcell %s: unknown option '%s'; run 'runcell %s --help'"
                                 % (cmd, opt, cmd))

    def test_a_flag_given_a_value(self):
        for cmd, flag in (("run", "--json"), ("repl", "--no-persist"), ("serve", "--e2b"),
                          ("agent", "--json"), ("review", "--json"), ("doctor", "--json")):
            self.assertEqual(self.usage_line(cmd, flag + "=1"),
                             "runcell %s: option '%s' takes no value" % (cmd, flag))

    def test_an_option_without_its_value(self):
        for cmd, opt in (("run", "--timeout"), ("repl", "--resume"), ("serve", "--listen"),
                         ("mcp", "--max-timeout"), ("agent", "--model"), ("review", "--data"),
                         ("serve", "--store")):
            self.assertEqual(self.usage_line(cmd, opt),
                             "runcell %s: option '%s' needs a value" % (cmd, opt))
        self.assertEqual(self.usage_line("run", "-c"), "runcell run: -c needs CODE")

    def test_a_shared_option_refused_where_it_does_not_apply(self):
        self.assertEqual(self.usage_line("serve", "--file", "x"),
                         "runcell serve: --file and --out do not apply to serve")
        self.assertIn("options of sessions", self.usage_line("serve", "--package", "x"))
        self.assertIn("use the write_file and read_file tools",
                      self.usage_line("mcp", "--out", "x"))

    def test_help_lists_each_table(self):
        for cmd in self.COMMANDS:
            p = runcell(cmd, "--help")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertTrue(p.stdout.startswith("usage: runcell %s" % cmd), p.stdout[:200])
            self.assertEqual(runcell(cmd, "-h").stdout, p.stdout)
        run_help = runcell("run", "--help").stdout
        for opt in ("--lang", "-c CODE", "--json", "--keep-going", "--timeout SEC", "--cpus N",
                    "--file LOCAL[:DEST]", "--install-timeout SEC"):
            self.assertIn("\n  " + opt, run_help)
        for cmd in ("serve", "repl"):  # the store's table, listed by both
            self.assertIn("\n  --store-max-files N", runcell(cmd, "--help").stdout)


class Cleanup(RuncellTestCase):
    def runs(self, env):
        """A mix of endings; returns the pids of the runcell processes."""
        pids = []
        with TempDir() as d:
            src = os.path.join(d, "in.txt")
            with open(src, "w") as f:
                f.write("x")
            cases = [
                ["-c", "print(1)"],
                ["--timeout", "1", "-c", "while True: pass"],
                ["--memory", "64", "-c", "a = []\nwhile True: a.append(bytearray(1 << 20))"],
                ["-c", "import ctypes; ctypes.string_at(0)"],
                ["--file", src + ":a/b.txt", "--out", os.path.join(d, "o"), "-c",
                 "open('c.txt', 'w').write('c')"],
                ["--lang", "bash", "--timeout", "1", "-c", "sleep 100 & (sleep 100 &); sleep 100"],
            ]
            for args in cases:
                p = subprocess.Popen([RUNCELL, "run", *args], env=dict(os.environ, **env),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                pids.append(p.pid)
                _, err = p.communicate(timeout=HANG)
                self.assertNotIn(b"cannot", err, args)
        return pids

    def assertNothingLeft(self, run_dir, pids):
        self.assertEqual(run_dir_entries(run_dir), [], "left in %s" % run_dir)
        self.assertEqual(mounts_below(run_dir), [])
        for pid in pids:
            self.assertEqual(cgroups_of(pid), [], "cgroups left by runcell %d" % pid)

    def test_nothing_left_after_runs(self):
        with TempDir() as run_dir:
            pids = self.runs({"RUNCELL_RUNDIR": run_dir})
            self.assertNothingLeft(run_dir, pids)

    def test_nothing_left_in_the_default_run_dir(self):
        if not is_root():
            self.skipTest("the default run dir /run/runcell is root's")
        pids = self.runs({})
        # Other runcell processes may share /run/runcell: look only at ours.
        for pid in pids:
            left = [n for n in os.listdir("/run/runcell") if n.startswith("%d-" % pid)]
            self.assertEqual(left, [])
            self.assertEqual(cgroups_of(pid), [])
        self.assertEqual([m for m in mounts_below("/run/runcell")
                          if any("/%d-" % pid in m for pid in pids)], [])

    def test_timeout_kills_background_processes(self):
        token = uuid.uuid4().hex
        # Three sleeps named after the token: one in the background, one in a session of
        # its own whose parent is gone, one in the foreground.
        p = runcell("run", "--lang", "bash", "--timeout", "1", "-c",
                    "(exec -a %s-1 sleep 300) & (setsid bash -c 'exec -a %s-2 sleep 301' &); "
                    "exec -a %s-3 sleep 302" % (token, token, token))
        self.assertEqual(p.returncode, 124, p.stderr)
        self.assertTrue(wait_until(lambda: not procs_with(token)),
                        "left running: %s" % procs_with(token))

    def test_sigkill_of_runcell_is_swept_by_the_next_start(self):
        if not is_root():
            self.skipTest("needs root: workspace mounts and cgroups are root's")
        token = uuid.uuid4().hex
        with TempDir() as run_dir:
            env = dict(os.environ, RUNCELL_RUNDIR=run_dir)
            p = subprocess.Popen([RUNCELL, "run", "--lang", "bash", "-c",
                                  "echo up; sleep 300; : " + token],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                self.assertEqual(read_line(p.stdout)[0], b"up\n")
                self.assertTrue(procs_with(token, but=(p.pid,)))
                owner = run_dir_entries(run_dir)
                self.assertEqual(len(owner), 1, owner)
                self.assertTrue(owner[0].startswith("%d-" % p.pid))
                self.assertTrue(mounts_below(run_dir), "no workspace mount while running")
                cgroups = cgroups_of(p.pid)
            finally:
                p.kill()
                p.communicate(timeout=HANG)  # reaped: its pid no longer names a live owner
            # init has PDEATHSIG=SIGKILL: it dies with runcell and takes the namespace along.
            self.assertTrue(wait_until(lambda: not procs_with(token)),
                            "sandbox processes outlived runcell")
            # Nobody has cleaned up yet.
            self.assertEqual(run_dir_entries(run_dir), owner)
            self.assertTrue(mounts_below(run_dir))
            if is_root() and cgroup_bases():
                self.assertTrue(cgroups, "the run had no cgroups to leave behind")
            # The next start sweeps all of it.
            q = subprocess.run([RUNCELL, "run", "-c", "print('next')"], env=env,
                               capture_output=True, text=True, timeout=HANG)
            self.assertEqual((q.returncode, q.stdout), (0, "next\n"), q.stderr)
            self.assertEqual(run_dir_entries(run_dir), [])
            self.assertEqual(mounts_below(run_dir), [])
            self.assertEqual([c for c in cgroups if os.path.exists(c)], [])
            self.assertEqual(cgroups_of(p.pid), [])


UNPRIV = 65534


def _asan_build():
    with open(RUNCELL, "rb") as f:
        return b"libasan.so" in f.read()


class DegradedMode(RuncellTestCase):
    """runcell as an unprivileged uid: user namespaces only, rlimits instead of cgroups."""

    @classmethod
    def setUpClass(cls):
        if _asan_build():
            raise unittest.SkipTest("sanitizer build: the address-space rlimit of degraded "
                                    "mode starves AddressSanitizer's shadow mappings")
        if not is_root():
            raise unittest.SkipTest("needs root to switch to uid %d" % UNPRIV)
        if not shutil.which("setpriv"):
            raise unittest.SkipTest("setpriv (util-linux) is not installed")
        probe = subprocess.run(cls.as_nobody(["unshare", "--user", "true"]),
                               capture_output=True, text=True, timeout=HANG)
        if probe.returncode != 0:
            raise unittest.SkipTest("unprivileged user namespaces are unavailable here: "
                                    + probe.stderr.strip())
        # The binaries must be reachable by that uid.
        cls.dir, _ = reachable_build()
        cls.run_dir = os.path.join(cls.dir, "run")
        os.mkdir(cls.run_dir, 0o700)
        os.chown(cls.run_dir, UNPRIV, UNPRIV)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @staticmethod
    def as_nobody(argv):
        return ["setpriv", "--reuid=%d" % UNPRIV, "--regid=%d" % UNPRIV, "--clear-groups", *argv]

    def run_nobody(self, *args):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUNCELL_RUNDIR": self.run_dir}
        return subprocess.run(self.as_nobody([os.path.join(self.dir, "runcell"), "run", *args]),
                              capture_output=True, text=True, timeout=HANG, env=env, cwd="/")

    def test_runs_sandboxed_with_one_warning(self):
        p = self.run_nobody("-c", "import os; print(os.getuid(), os.getcwd(), os.listdir('/'))")
        self.assertEqual(p.returncode, 0, p.stderr)
        uid, cwd, root = p.stdout.split(" ", 2)
        self.assertEqual((uid, cwd), ("1000", "/workspace"))
        self.assertIn(".runcell", root)  # the sandbox's own root, not the host's
        self.assertNotIn("'boot'", root)
        warning = one_line(self, p.stderr)
        self.assertTrue(warning.startswith("runcell: warning:"), warning)
        self.assertIn("degraded", warning)

    def test_record_says_degraded(self):
        p = self.run_nobody("--json", "-c", "print('hi')")
        self.assertEqual(p.returncode, 0, p.stderr)
        rec = rec_of(p)
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"], "hi\n")
        self.assertIs(rec["limits_degraded"], True)
        one_line(self, p.stderr)

    def test_memory_hog_is_still_stopped(self):
        p = self.run_nobody("--json", "--memory", "100", "-c",
                            "a = []\nwhile True: a.append(bytearray(1 << 20))")
        rec = rec_of(p)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(rec["status"], ("error", "oom"), rec)
        if rec["status"] == "error":  # -c is a cell: the exception is the record's error
            self.assertEqual(rec["error"]["name"], "MemoryError")
        self.assertLess(rec["usage"]["memory_peak_kb"], 200 << 10)

    def test_timeout_and_cleanup(self):
        p = self.run_nobody("--timeout", "1", "-c", "while True: pass")
        self.assertEqual(p.returncode, 124, p.stderr)
        self.assertEqual(run_dir_entries(self.run_dir), [])


if __name__ == "__main__":
    unittest.main()
