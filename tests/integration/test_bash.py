"""test_bash - bash cells in one long-lived shell per session: state across cells (variables,
arrays, cwd, exports, functions, aliases), streams, exit status, `exit`, stdin, timeouts that
keep the shell and ones that cost it, output caps, a protocol no output can spoof, and the
interfaces (`runcell run --lang bash -c ... -c ...`, HTTP, MCP), checkpoint and resume.
"""
import os
import subprocess
import unittest

from mcpclient import StdioClient, texts
from rctest import RUNCELL, CellsCase, RuncellTestCase, ServerCase
from rctest import RestartableServer

class BashCase(CellsCase):
    lang_opts = ("--lang", "bash", "--keep-going")


class StateTest(BashCase):
    def test_variables_cwd_exports_functions_aliases_persist(self):
        recs = self.cells(
            "A=5; declare -a arr=(x y z); declare -A map=([k]=v); mkdir -p sub/dir; cd sub",
            "export GREETING=hello; greet() { echo \"$GREETING $1\"; }; alias ll='echo via-alias'",
            "echo \"$A ${arr[1]} ${map[k]} $PWD\"",
            "greet world; ll; bash -c 'echo child sees $GREETING'",
            "cd dir && touch made-here; pwd")
        for rec in recs:
            self.assertOk(rec)
        self.assertEqual(recs[2]["stdout"], "5 y v /workspace/sub\n")
        self.assertEqual(recs[3]["stdout"], "hello world\nvia-alias\nchild sees hello\n")
        self.assertEqual(recs[4]["stdout"], "/workspace/sub/dir\n")
        self.assertEqual(recs[4]["files"]["created"], ["sub/dir/made-here"])

    def test_first_cell_starts_in_the_workspace_with_stdin_at_eof(self):
        recs = self.cells("pwd; cat; echo \"cat=$?\"; read -r line; echo \"read=$?\"",
                          "head -c 10; echo \"head=$?\"")
        self.assertOk(recs[0], "/workspace\ncat=0\nread=1\n")
        self.assertOk(recs[1], "head=0\n")

    def test_a_cell_that_empties_tmp_keeps_the_shell_working(self):
        # the kernel's cell files live in /tmp/.runcell-bash: a cell may delete it
        recs = self.cells("X=1; find /tmp -mindepth 1 -delete", 'echo "x=$X"')
        self.assertOk(recs[0])
        self.assertOk(recs[1], "x=1\n")

    def test_a_cell_that_unsets_every_function_keeps_the_shell_working(self):
        # the kernel's own functions are read-only: a cell's "clear everything" leaves them
        recs = self.cells("f() { :; }; for n in $(compgen -A function); do unset -f \"$n\"; "
                          "done 2>/dev/null; __runcell_done() { :; } 2>/dev/null; echo cleared",
                          "echo alive", opts=("--timeout", "60"))
        self.assertOk(recs[0], "cleared\n")
        self.assertOk(recs[1], "alive\n")

    def test_execution_count_and_a_syntax_error_keep_the_shell(self):
        recs = self.cells("A=1", "if then fi", "echo $A", expect_exit=2)
        self.assertEqual([r["execution_count"] for r in recs], [1, 2, 3])
        self.assertStatus(recs[1], "error")
        self.assertEqual(recs[1]["exit_code"], 2)
        self.assertIn("syntax error", recs[1]["stderr"])
        self.assertEqual(recs[1]["state"], "kept")
        self.assertOk(recs[2], "1\n")

    def test_return_ends_a_cell_and_the_shell_stays(self):
        recs = self.cells("A=2; return 4; echo not-here", "echo $A", expect_exit=4)
        self.assertStatus(recs[0], "error")
        self.assertEqual(recs[0]["exit_code"], 4)
        self.assertEqual(recs[0]["stdout"], "")
        self.assertOk(recs[1], "2\n")


class StreamsTest(BashCase):
    def test_stdout_and_stderr_keep_their_order_and_are_split(self):
        code = ("for i in $(seq 1 300); do echo out$i; echo err$i >&2; done; "
                "python3 -c 'print(\"py\")'")
        rec = self.cells(code, "true")[0]  # two cells: one alone runs as a script
        self.assertOk(rec)
        self.assertEqual(rec["stdout"], "".join("out%d\n" % i for i in range(1, 301)) + "py\n")
        self.assertEqual(rec["stderr"], "".join("err%d\n" % i for i in range(1, 301)))

    def test_output_that_looks_like_the_protocol_changes_nothing(self):
        # Lines shaped like the shell's reports, on every stream a cell can reach; the
        # report function itself, called by the cell, has no status fd to write to.
        spoof = ("for i in 1 2 3; do printf '%016x 0\\n' $i; printf '%016x 0\\n' $i >&2; done; "
                 "__runcell_done 0000000000000000; printf 'ffffffffffffffff 0\\n' >&201; "
                 "echo tail; exit_code_is=7; (exit 7)")
        recs = self.cells(spoof, "echo after $exit_code_is", expect_exit=7)
        self.assertStatus(recs[0], "error")
        self.assertEqual(recs[0]["exit_code"], 7)
        self.assertEqual(recs[0]["stdout"], "".join("%016x 0\n" % i for i in (1, 2, 3)) + "tail\n")
        self.assertIn("Bad file descriptor", recs[0]["stderr"])
        self.assertOk(recs[1], "after 7\n")

    def test_output_over_the_cap_is_truncated_and_the_shell_stays(self):
        recs = self.cells("A=kept; head -c 5000000 /dev/zero | tr '\\0' x; echo; echo done",
                          "echo $A")
        self.assertTrue(recs[0]["truncated"]["stdout"])
        self.assertIn("bytes of output dropped", recs[0]["stdout"])
        self.assertTrue(recs[0]["stdout"].endswith("done\n"))
        self.assertOk(recs[1], "kept\n")


class ExitTest(BashCase):
    def test_exit_status_is_the_records_exit_code(self):
        recs = self.cells("false", "sh -c 'exit 42'", "nosuchcommand",
                          "sleep 300 & kill -KILL $!; wait $!", "echo still", expect_exit=1)
        self.assertEqual([r["exit_code"] for r in recs[:4]], [1, 42, 127, 137])
        for rec in recs[:4]:
            self.assertStatus(rec, "error")
            self.assertEqual(rec["error"]["name"], "ShellError")
            self.assertEqual(rec["state"], "kept")
        self.assertIn("command not found", recs[2]["stderr"])
        self.assertIn("SIGKILL", recs[3]["error"]["value"])
        self.assertOk(recs[4], "still\n")

    def test_exit_ends_the_shell_and_the_next_cell_gets_a_new_one(self):
        recs = self.cells("A=1; mkdir -p d; cd d; export E=2", "echo bye; exit 3",
                          "echo \"${A:-unset} ${E:-unset} $PWD\"", expect_exit=3)
        rec = recs[1]
        self.assertStatus(rec, "error")
        self.assertEqual(rec["exit_code"], 3)
        self.assertEqual(rec["stdout"], "bye\n")
        self.assertIn("the shell exited", rec["error"]["value"])
        self.assertIn("next bash cell starts a new one", rec["error"]["value"])
        self.assertOk(recs[2], "unset unset /workspace\n")

    def test_exit_0_is_a_success_that_still_says_the_shell_ended(self):
        recs = self.cells("A=1", "echo done; exit 0", "echo ${A:-gone}")
        self.assertOk(recs[1], "done\n")
        self.assertIn("the shell exited (status 0)", recs[1]["stderr"])
        self.assertOk(recs[2], "gone\n")

    def test_set_e_ends_the_shell_at_the_first_failure(self):
        recs = self.cells("A=1; set -e", "echo before; false; echo after", "echo ${A:-unset}",
                          expect_exit=1)
        self.assertEqual(recs[1]["stdout"], "before\n")
        self.assertEqual(recs[1]["exit_code"], 1)
        self.assertIn("the shell exited", recs[1]["error"]["value"])
        self.assertOk(recs[2], "unset\n")


    def test_a_signal_to_the_shell_ends_it(self):
        recs = self.cells("A=1", "sh -c 'kill -KILL $PPID'; echo not-here", "echo ${A:-gone}",
                          expect_exit=137)
        self.assertEqual(recs[1]["exit_code"], 137)
        self.assertIn("SIGKILL", recs[1]["error"]["value"])
        self.assertIn("the shell exited", recs[1]["error"]["value"])
        self.assertOk(recs[2], "gone\n")

    def test_exec_of_a_program_ends_the_shell_and_a_timeout_still_stops_it(self):
        recs = self.cells("A=1", "exec sleep 300", "echo ${A:-gone}", opts=("--timeout", "2"),
                          expect_exit=124)
        self.assertStatus(recs[1], "timeout")
        self.assertEqual(recs[1]["state"], "kept")  # the kernel's: only the shell went
        self.assertIn("the shell exited", recs[1]["error"]["value"])
        self.assertOk(recs[2], "gone\n")


class TimeoutTest(BashCase):
    def test_timeout_interrupts_a_command_and_keeps_the_shell(self):
        recs = self.cells("A=7; f() { sleep 300; echo f-after; }",
                          "echo start; f; echo cell-after",
                          "while :; do :; done; echo loop-after",
                          "echo kept $A", opts=("--timeout", "2"), expect_exit=124)
        for rec in recs[1:3]:
            self.assertStatus(rec, "timeout")
            self.assertEqual(rec["state"], "kept")
            self.assertEqual(rec["error"]["name"], "KeyboardInterrupt")
            self.assertEqual(rec["exit_code"], 130)
            self.assertIn("variables are kept", rec["message"])
        self.assertEqual(recs[1]["stdout"], "start\n")
        self.assertEqual(recs[2]["stdout"], "")
        self.assertOk(recs[3], "kept 7\n")

    def test_a_shell_that_ignores_sigint_is_killed_and_its_state_lost(self):
        recs = self.cells("A=7", "trap '' INT; while :; do :; done", "echo ${A:-lost}",
                          opts=("--timeout", "2"), expect_exit=124)
        self.assertStatus(recs[1], "timeout")
        self.assertEqual(recs[1]["state"], "lost")
        self.assertIn("did not stop", recs[1]["message"])
        self.assertOk(recs[2], "lost\n")

    def test_a_child_that_ignores_sigint_costs_the_shell(self):
        recs = self.cells("A=7", "python3 -c 'import signal, time\n"
                          "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                          "while True: time.sleep(1)'",
                          "echo ${A:-lost}", opts=("--timeout", "2"), expect_exit=124)
        self.assertEqual(recs[1]["state"], "lost")
        self.assertOk(recs[2], "lost\n")

    def test_background_jobs_survive_an_interrupt(self):
        recs = self.cells("sleep 300 & echo $! > bg.pid", "sleep 300",
                          "kill -0 $(cat bg.pid) && echo alive", opts=("--timeout", "3"),
                          expect_exit=124)
        self.assertStatus(recs[1], "timeout")
        self.assertOk(recs[2], "alive\n")


class HttpTest(ServerCase):
    def test_bash_session_keeps_state_and_streams(self):
        sid = self.srv.create_session(language="bash")
        self.assertEqual(self.srv.execute(sid, "cd /tmp; export V=1; X=2")["status"], "ok")
        rec = self.srv.execute(sid, "echo $PWD $V $X")
        self.assertEqual(rec["stdout"], "/tmp 1 2\n")
        # streamed: the first line arrives while the cell still waits for the file
        stream = self.srv.stream(sid, "echo first; while [ ! -e /workspace/go ]; do "
                                      "sleep 0.01; done; echo second >&2; echo $X")
        first = stream.next()
        self.assertEqual((first["type"], first["data"]), ("stdout", "first\n"))
        self.srv.ok("PUT", "/v1/sessions/%s/files/go" % sid, b"", status=201)
        events = stream.rest()
        self.assertEqual(events[-1]["type"], "done")
        streams = {"stdout": "", "stderr": ""}
        for e in events[:-1]:
            streams[e["type"]] += e["data"]
        # two pipes: each keeps its order, not their interleaving
        self.assertEqual(streams, {"stdout": "2\n", "stderr": "second\n"})
        self.srv.ok("DELETE", "/v1/sessions/%s" % sid)

    def test_bash_cells_of_a_python_session_share_one_shell(self):
        sid = self.srv.create_session()
        self.srv.execute(sid, "x = 'py'")
        self.srv.execute(sid, "B=from-bash; cd /tmp", language="bash")
        rec = self.srv.execute(sid, "echo $B $PWD", language="bash")
        self.assertEqual(rec["stdout"], "from-bash /tmp\n")
        # the Python side is untouched: its own cwd and variables
        rec = self.srv.execute(sid, "import os\nprint(x, os.getcwd())")
        self.assertEqual(rec["stdout"], "py /workspace\n")
        self.srv.ok("DELETE", "/v1/sessions/%s" % sid)

    def test_a_tmpdir_with_a_space_or_quote_still_runs_bash_cells(self):
        # the shell's cell files live under $TMPDIR: their path goes to the shell quoted
        sid = self.srv.create_session()
        self.srv.execute(sid, "import os\nos.environ['TMPDIR'] = \"/tmp/it's a dir\"")
        rec = self.srv.execute(sid, "X=1; echo ran", language="bash")
        self.assertEqual((rec["status"], rec["stdout"]), ("ok", "ran\n"), rec)
        rec = self.srv.execute(sid, "echo $X", language="bash")
        self.assertEqual((rec["status"], rec["stdout"]), ("ok", "1\n"), rec)
        self.srv.ok("DELETE", "/v1/sessions/%s" % sid)

    def test_a_shell_that_ended_between_cells_is_replaced_and_said(self):
        sid = self.srv.create_session()
        self.srv.execute(sid, "A=1; echo $$ > shell.pid", language="bash")
        # the kernel is the shell's parent: it finds it gone at the next bash cell
        # SIGKILL is sent at once but takes effect when the shell next runs: wait until it
        # is dead (a zombie, which the kernel reaps), the state the next cell must find
        rec = self.srv.execute(sid, "import os, time\npid = int(open('shell.pid').read())\n"
                               "os.kill(pid, 9)\n"
                               "while open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1]"
                               ".split()[0] != 'Z':\n    time.sleep(0.01)")
        self.assertEqual(rec["status"], "ok", rec)
        rec = self.srv.execute(sid, "echo ${A:-gone}", language="bash")
        self.assertEqual(rec["status"], "ok", rec)
        self.assertEqual(rec["stdout"], "gone\n")
        self.assertIn("the shell had exited (status 137)", rec["stderr"])
        self.srv.ok("DELETE", "/v1/sessions/%s" % sid)

    def test_a_cell_larger_than_a_pipe_and_an_argument(self):
        sid = self.srv.create_session(language="bash")
        rec = self.srv.execute(sid, "X=" + "a" * 300000 + "\necho ${#X}")
        self.assertEqual((rec["status"], rec["stdout"]), ("ok", "300000\n"), rec["stderr"])
        self.assertEqual(self.srv.execute(sid, "echo ${#X}")["stdout"], "300000\n")
        self.srv.ok("DELETE", "/v1/sessions/%s" % sid)

    def test_timeout_over_http_keeps_the_shell(self):
        sid = self.srv.create_session(language="bash")
        self.srv.execute(sid, "K=kept")
        rec = self.srv.execute(sid, "sleep 300", timeout_s=1)
        self.assertEqual((rec["status"], rec["state"]), ("timeout", "kept"))
        self.assertEqual(self.srv.execute(sid, "echo $K")["stdout"], "kept\n")
        self.srv.ok("DELETE", "/v1/sessions/%s" % sid)


class McpTest(RuncellTestCase):
    def test_run_shell_and_run_code_bash_share_the_shell(self):
        c = StdioClient(RUNCELL)
        self.addCleanup(c.kill)
        c.initialize("2025-11-25")
        r = c.tool_result("run_shell", {"command": "mkdir -p proj && cd proj && export MODE=fast"})
        self.assertFalse(r["isError"], texts(r))
        r = c.tool_result("run_shell", {"command": "echo $MODE; pwd"})
        self.assertEqual(texts(r).split(), ["fast", "/workspace/proj"])
        r = c.tool_result("run_code", {"code": "echo $MODE in $(basename $PWD)",
                                       "language": "bash"})
        self.assertFalse(r["isError"], texts(r))
        self.assertEqual(texts(r).strip(), "fast in proj")
        r = c.tool_result("run_shell", {"command": "exit 5"})
        self.assertTrue(r["isError"])
        self.assertEqual(r["structuredContent"]["exit_code"], 5)
        self.assertIn("the shell exited", texts(r))
        r = c.tool_result("run_shell", {"command": "echo ${MODE:-gone}; pwd"})
        self.assertEqual(texts(r).split(), ["gone", "/workspace"])
        self.assertEqual(c.close(), 0, c.stderr)


class PersistTest(RuncellTestCase):
    def test_checkpoint_and_resume_restore_the_shell(self):
        tmp = self.enterContext_tmp()
        srv = RestartableServer(os.path.join(tmp, "data")).start()
        self.addCleanup(srv.stop)
        st, s = srv.request("POST", "/v1/sessions", {"language": "bash"})
        self.assertEqual(st, 201, s)
        code = ("set -u; declare -a EMPTY; mkdir -p work/deep; cd work/deep; touch kept; "
                "export TOKEN='a b' PATH=$PATH:/opt/tools; PLAIN=1; "
                "declare -a ARR=(p q); f() { echo \"f:$1\"; }; alias hi='echo hi-alias'")
        st, rec = srv.request("POST", "/v1/sessions/%s/execute" % s["id"], {"code": code})
        self.assertEqual((st, rec["status"]), (200, "ok"), rec)
        st, closed = srv.request("DELETE", "/v1/sessions/%s?checkpoint=true" % s["id"])
        self.assertEqual(st, 200, closed)
        saved = closed["checkpoint"]["variables"]["bash"]
        for item in ("cwd /workspace/work/deep", "variable TOKEN", "variable PLAIN",
                     "variable ARR", "function f", "alias hi"):
            self.assertIn(item, saved)
        self.assertFalse([i for i in saved if "runcell" in i], saved)
        # the environment as the sandbox gave it is not the shell's state; PATH changed
        self.assertNotIn("variable HOME", saved)
        self.assertIn("variable PATH", saved)
        st, r = srv.request("POST", "/v1/sessions", {"resume_from": s["id"]})
        self.assertEqual(st, 201, r)
        self.assertIn("variable TOKEN", r["restored"]["bash"])
        st, rec = srv.request("POST", "/v1/sessions/%s/execute" % r["id"],
                              {"code": "echo \"$PWD|$TOKEN|$PLAIN|${ARR[1]}|${PATH##*:}\"; "
                                       "f x; hi; "
                                       "bash -c 'echo \"child:$TOKEN\"'"})
        self.assertEqual(st, 200, rec)
        self.assertEqual(rec["stdout"], "/workspace/work/deep|a b|1|q|/opt/tools\nf:x\n"
                                        "hi-alias\nchild:a b\n")

    def enterContext_tmp(self):
        import tempfile
        tmp = tempfile.mkdtemp(prefix="runcell-bash-")
        os.chmod(tmp, 0o755)
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", tmp]))
        return tmp


if __name__ == "__main__":
    unittest.main()
