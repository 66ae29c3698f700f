"""A session's state beyond its next cell: undo (the kernel's whole memory before a cell, and
the files that cell and those after it changed), forks, snapshots (on one node and started
on another), and pauses (every process stopped, or hibernated), each with its limits: the
history's depth, an undo after the kernel was lost to an out-of-memory kill, a fork or a pause
while a cell runs, forks past --max-sessions, snapshots past --max-snapshots and past the
store quota."""
import os
import shutil
import tempfile
import threading
import time
import unittest

from rctest import HANG, RuncellTestCase, Server, ServerCase, wait_until

WAIT_FOR_GO = ("import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n")


def path_of(sid, rest=""):
    return "/v1/sessions/%s%s" % (sid, rest)


class Undo(ServerCase):
    def session(self, history=3, **opts):
        sid = self.srv.ok("POST", "/v1/sessions", dict(opts, history=history), status=201)["id"]
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        return sid

    def undo(self, sid, before=None, status=200):
        r = self.srv.request("POST", path_of(sid, "/undo"), {} if before is None
                             else {"before": before})
        self.assertEqual(r.status, status, r)
        return r.json()

    def test_a_cell_that_broke_a_dataframe_half_way_is_undone(self):
        sid = self.session()
        self.srv.execute(sid, "import pandas as pd\ndf = pd.DataFrame({'a': range(5)})\n"
                              "open('kept.csv', 'w').write('1')")
        rec = self.srv.execute(sid, "df['a'] *= 10\nopen('kept.csv', 'w').write('2')\n"
                                    "open('new.csv', 'w').write('x')\nraise ValueError('half')")
        self.assertStatus(rec, "error")
        report = self.undo(sid)
        self.assertEqual(report["execution_count"], 1)
        self.assertEqual(report["variables"], "restored")
        self.assertEqual(report["files"]["restored"], ["kept.csv"])
        self.assertEqual(report["files"]["removed"], ["new.csv"])
        rec = self.srv.execute(sid, "import os\nlist(df['a']), open('kept.csv').read(), "
                                    "os.path.exists('new.csv')")
        self.assertEqual(rec["results"], [{"text/plain": "([0, 1, 2, 3, 4], '1', False)"}])
        self.assertEqual(rec["execution_count"], 2)

    def test_undo_goes_back_as_deep_as_the_history_and_says_what_is_kept(self):
        sid = self.session(history=2)
        for i in range(1, 5):
            self.srv.execute(sid, "x = %d" % i)
        report = self.undo(sid, before=3)
        self.assertEqual(report["execution_count"], 2)
        self.assertEqual(self.srv.execute(sid, "x")["results"], [{"text/plain": "2"}])
        r = self.srv.request("POST", path_of(sid, "/undo"), {"before": 1})
        self.assertEqual((r.status, r.error_code), (404, "not_found"), r)
        self.assertIn("keeps the state before each of cells", r.json()["error"]["message"])
        r = self.srv.request("POST", "/v1/sessions", {"history": 101})
        self.assertEqual((r.status, r.error_code), (400, "bad_request"), r)
        plain = self.srv.create_session()
        r = self.srv.request("POST", path_of(plain, "/undo"), {})
        self.assertEqual((r.status, r.error_code), (400, "bad_request"), r)
        self.assertIn("history", r.json()["error"]["message"])

    def test_undo_after_an_out_of_memory_kill_says_the_state_is_gone(self):
        sid = self.session(memory_mb=256)
        self.srv.execute(sid, "x = 1")
        rec = self.srv.execute(sid, "b = bytearray(1 << 30)")
        self.assertStatus(rec, "oom")
        r = self.srv.request("POST", path_of(sid, "/undo"), {})
        self.assertEqual((r.status, r.error_code), (404, "not_found"), r)
        # The new interpreter keeps its own history from here.
        self.srv.execute(sid, "y = 2")
        self.srv.execute(sid, "y = 3")
        self.assertEqual(self.undo(sid)["execution_count"], 3)  # the session counts on
        self.assertEqual(self.srv.execute(sid, "y")["results"], [{"text/plain": "2"}])

    def test_an_undo_waits_for_the_running_cell_and_interrupts_still_reach_the_kernel(self):
        sid = self.session()
        self.srv.execute(sid, "x = 'before'")
        st = self.srv.stream(sid, "x = 'during'\nprint('up', flush=True)\n" + WAIT_FOR_GO)
        self.assertEqual(st.next()["type"], "stdout")
        box = {}
        t = threading.Thread(target=lambda: box.update(r=self.undo(sid)))
        t.start()
        self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        st.rest()
        t.join(HANG)
        self.assertEqual(box["r"]["execution_count"], 1)
        self.assertEqual(self.srv.execute(sid, "x")["results"], [{"text/plain": "'before'"}])
        # The kernel after an undo is another process: an interrupt still finds it.
        st = self.srv.stream(sid, "import time\nprint('up', flush=True)\ntime.sleep(300)")
        st.next()
        self.srv.ok("POST", path_of(sid, "/interrupt"))
        self.assertEqual(st.rest()[-1]["record"]["error"]["name"], "KeyboardInterrupt")


    def test_an_undo_after_a_restart_brings_back_the_files_of_the_new_cells(self):
        # The files' history is keyed by the kernel's count, which starts again at a restart:
        # what was kept before it is of cells no undo can name again.
        sid = self.session(history=5)
        for i in range(1, 4):
            self.srv.execute(sid, "open('f.txt', 'w').write('old %d')" % i)
        self.srv.ok("POST", path_of(sid, "/restart"))
        self.srv.execute(sid, "open('f.txt', 'w').write('new 1')")
        self.srv.execute(sid, "open('f.txt', 'w').write('new 2')")
        report = self.undo(sid, before=2)
        self.assertEqual(report["files"]["restored"], ["f.txt"], report)
        self.assertEqual(self.srv.execute(sid, "open('f.txt').read()")["results"],
                         [{"text/plain": "'new 1'"}])


class Forks(ServerCase):
    server_args = ("--max-sessions", "8")

    def test_forks_start_from_the_state_and_share_nothing_writable(self):
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        self.srv.execute(sid, "import numpy as np\na = np.arange(6)\nopen('f.txt', 'w').write('s')")
        r = self.srv.request("POST", path_of(sid, "/fork"), {"count": 2})
        self.assertEqual(r.status, 201, r)
        forks = [f["id"] for f in r.json()["sessions"]]
        for f in forks:
            self.addCleanup(self.srv.request, "DELETE", path_of(f))
        self.assertEqual(sorted(r.json()["sessions"][0]["restored"]["variables"]), ["_", "a"])
        self.srv.execute(forks[0], "a[0] = 99\nopen('f.txt', 'w').write('fork')")
        for sid_, want in ((sid, "(0, 's')"), (forks[1], "(0, 's')"), (forks[0], "(99, 'fork')")):
            rec = self.srv.execute(sid_, "int(a[0]), open('f.txt').read()")
            self.assertEqual(rec["results"], [{"text/plain": want}], sid_)

    def test_forks_of_a_session_that_keeps_nothing_keep_nothing(self):
        sid = self.srv.ok("POST", "/v1/sessions", {"persist": False}, status=201)["id"]
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        self.srv.execute(sid, "x = 1\nopen('f.txt', 'w').write('x')")
        forks = self.srv.ok("POST", path_of(sid, "/fork"), {"count": 1}, status=201)["sessions"]
        fid = forks[0]["id"]
        self.srv.execute(fid, "open('g.txt', 'w').write('y')")
        self.assertEqual(self.srv.ok("GET", path_of(fid))["persist"], False)
        self.srv.ok("DELETE", path_of(fid))
        stored = os.path.join(self.srv.data_dir, "store", "sessions")
        self.assertNotIn(fid, os.listdir(stored) if os.path.isdir(stored) else [])

    def test_a_fork_waits_for_the_running_cell_and_past_max_sessions_none_is_made(self):
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        st = self.srv.stream(sid, "n = 1\nprint('up', flush=True)\n" + WAIT_FOR_GO + "n = 2")
        st.next()
        box = {}
        t = threading.Thread(target=lambda: box.update(
            r=self.srv.request("POST", path_of(sid, "/fork"), {"count": 1})))
        t.start()
        self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        st.rest()
        t.join(HANG)
        self.assertEqual(box["r"].status, 201, box["r"])
        fork = box["r"].json()["sessions"][0]["id"]
        self.addCleanup(self.srv.request, "DELETE", path_of(fork))
        self.assertEqual(self.srv.execute(fork, "n")["results"], [{"text/plain": "2"}])
        live = len(self.srv.ok("GET", "/v1/sessions")["sessions"])
        r = self.srv.request("POST", path_of(sid, "/fork"), {"count": 100})
        self.assertEqual((r.status, r.error_code), (429, "limit_exceeded"), r)
        self.assertIn("maximum of 8 live sessions", r.json()["error"]["message"])
        self.assertEqual(len(self.srv.ok("GET", "/v1/sessions")["sessions"]), live)
        r = self.srv.request("POST", path_of(sid, "/fork"), {"count": 101})
        self.assertEqual((r.status, r.error_code), (400, "bad_request"), r)


class Snapshots(RuncellTestCase):
    def test_a_snapshot_made_on_one_node_starts_on_another(self):
        store = tempfile.mkdtemp(prefix="runcell-snapstore-")
        self.addCleanup(shutil.rmtree, store, True)
        with Server("--store", store, "--node", "one") as a, \
                Server("--store", store, "--node", "two") as b:
            sid = a.create_session()
            a.execute(sid, "import pandas as pd\ndf = pd.DataFrame({'x': [1, 2]})\n"
                           "open('data.csv', 'w').write('a,b')")
            r = a.request("POST", path_of(sid, "/snapshots"), {"name": "clean data"})
            self.assertEqual(r.status, 201, r)
            snap = r.json()
            self.assertEqual((snap["name"], snap["files"]), ("clean data", 1))
            listed = b.ok("GET", "/v1/snapshots")["snapshots"]
            self.assertIn(snap["id"], [s["id"] for s in listed])
            r = b.request("POST", "/v1/sessions", {"snapshot": snap["id"]})
            self.assertEqual(r.status, 201, r)
            rec = b.execute(r.json()["id"], "list(df['x']), open('data.csv').read()")
            self.assertEqual(rec["results"], [{"text/plain": "([1, 2], 'a,b')"}])
            self.assertTrue(b.ok("DELETE", "/v1/snapshots/" + snap["id"])["deleted"])
            r = a.request("GET", "/v1/snapshots/" + snap["id"])
            self.assertEqual((r.status, r.error_code), (404, "not_found"), r)
            r = a.request("POST", "/v1/sessions", {"snapshot": snap["id"]})
            self.assertEqual((r.status, r.error_code), (404, "not_found"), r)

    def test_snapshots_are_capped_in_count_and_by_the_store_quota(self):
        with Server("--max-snapshots", "1", "--store-quota", "1") as srv:
            sid = srv.create_session()
            srv.execute(sid, "x = 1")
            first = srv.ok("POST", path_of(sid, "/snapshots"), {}, status=201)
            r = srv.request("POST", path_of(sid, "/snapshots"), {})
            self.assertEqual((r.status, r.error_code), (429, "limit_exceeded"), r)
            self.assertIn("maximum of 1 snapshots", r.json()["error"]["message"])
            srv.ok("DELETE", "/v1/snapshots/" + first["id"])
            srv.execute(sid, "open('big.bin', 'wb').write(b'x' * (3 << 20))")
            r = srv.request("POST", path_of(sid, "/snapshots"), {})
            self.assertEqual(r.status, 413, r)
            self.assertIn("quota", r.json()["error"]["message"])
            self.assertEqual(srv.ok("GET", "/v1/snapshots")["snapshots"], [])


    def test_a_snapshot_of_many_long_names_is_kept_listed_and_deleted(self):
        # Its record would pass what a record may be: the lists are cut to fit, so that it
        # can always be read, listed and deleted.
        with Server() as srv:
            sid = srv.create_session()
            srv.execute(sid, "for i in range(500):\n    globals()['v' * 240 + str(i)] = i")
            snap = srv.ok("POST", path_of(sid, "/snapshots"), {}, status=201)
            self.assertEqual(snap["variables"]["lists_cut_at"], 20, snap["variables"])
            self.assertEqual(len(snap["variables"]["saved"]), 20)
            self.assertEqual(srv.ok("GET", "/v1/snapshots/" + snap["id"])["variables"],
                             snap["variables"])
            self.assertEqual([s["id"] for s in srv.ok("GET", "/v1/snapshots")["snapshots"]],
                             [snap["id"]])
            # A session from it has every variable (the cut is of the record only).
            r = srv.ok("POST", "/v1/sessions", {"snapshot": snap["id"]}, status=201)
            rec = srv.execute(r["id"], "sum(1 for k in globals() if k.startswith('v' * 240))")
            self.assertEqual(rec["results"], [{"text/plain": "500"}])
            self.assertTrue(srv.ok("DELETE", "/v1/snapshots/" + snap["id"])["deleted"])
            self.assertEqual(srv.ok("GET", "/v1/snapshots")["snapshots"], [])

    def test_snapshots_made_at_once_stay_within_the_maximum(self):
        with Server("--max-snapshots", "1") as srv:
            sids = [srv.create_session() for _ in range(2)]
            for sid in sids:
                srv.execute(sid, "import numpy as np\na = np.ones(1 << 20)")
            got = {}
            threads = [threading.Thread(target=lambda s=sid: got.update(
                {s: srv.request("POST", path_of(s, "/snapshots"), {})})) for sid in sids]
            for th in threads:
                th.start()
            for th in threads:
                th.join(HANG)
            self.assertEqual(sorted(r.status for r in got.values()), [201, 429], got)
            self.assertEqual(len(srv.ok("GET", "/v1/snapshots")["snapshots"]), 1)


class Pauses(ServerCase):
    def size_of(self, sid, name):
        return sum(f["size"] for f in self.srv.ok("GET", path_of(sid, "/files"))["files"]
                   if f["path"] == name)

    def test_a_paused_session_runs_nothing_until_it_resumes(self):
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        self.srv.execute(sid, "import subprocess\np = subprocess.Popen(['bash', '-c', "
                              "'while :; do echo x >> ticks; sleep 0.01; done'])\nkept = 7")
        self.assertTrue(wait_until(lambda: self.size_of(sid, "ticks") > 0))
        self.assertEqual(self.srv.ok("POST", path_of(sid, "/pause"), {"keep_memory": True}),
                         {"state": "paused"})
        self.assertEqual(self.srv.ok("GET", path_of(sid))["state"], "paused")
        before = self.size_of(sid, "ticks")
        time.sleep(0.3)  # nothing in the sandbox runs: the file cannot grow, however long
        self.assertEqual(self.size_of(sid, "ticks"), before)
        r = self.srv.request("POST", path_of(sid, "/pause"), {"keep_memory": True})
        self.assertEqual((r.status, r.error_code), (409, "busy"), r)
        self.assertEqual(self.srv.ok("POST", path_of(sid, "/resume"))["state"], "running")
        self.assertTrue(wait_until(lambda: self.size_of(sid, "ticks") > before))
        self.assertEqual(self.srv.execute(sid, "p.kill(); kept")["results"],
                         [{"text/plain": "7"}])

    def test_a_hibernated_session_comes_back_with_its_variables_at_its_next_cell(self):
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        self.srv.execute(sid, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\n"
                              "import time\nborn = time.monotonic()")
        report = self.srv.ok("POST", path_of(sid, "/pause"), {})
        self.assertEqual(report["state"], "hibernated")
        self.assertEqual(sorted(report["variables"]["saved"]), ["born", "df"])
        self.assertEqual(self.srv.ok("GET", path_of(sid))["state"], "hibernated")
        # Its variables and their modules (time, as the report named it) came back.
        rec = self.srv.execute(sid, "int(df['a'].sum()), born < time.monotonic()")
        self.assertEqual(rec["results"], [{"text/plain": "(6, True)"}])
        self.assertEqual(self.srv.ok("GET", path_of(sid))["state"], "running")

    def test_an_idle_session_hibernates_by_itself_and_comes_back_when_used(self):
        # hibernate_after_s: once idle that long, the server hibernates it (its interpreter
        # stops); a file read does not wake it, its next cell does, with its variables.
        sid = self.srv.ok("POST", "/v1/sessions", {"hibernate_after_s": 0.5}, status=201)["id"]
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        self.assertEqual(self.srv.ok("GET", path_of(sid))["hibernate_after_s"], 0.5)
        hibernated = self.srv.ok("GET", "/healthz")["hibernated"]
        self.srv.execute(sid, "kept = 41\nopen('f.txt', 'w').write('x')")
        self.assertTrue(wait_until(
            lambda: self.srv.ok("GET", path_of(sid))["state"] == "hibernated"))
        r = self.srv.request("GET", path_of(sid, "/files/f.txt"))
        self.assertEqual((r.status, r.body), (200, b"x"))
        self.assertEqual(self.srv.ok("GET", path_of(sid))["state"], "hibernated")
        self.assertEqual(self.srv.ok("GET", "/healthz")["hibernated"], hibernated + 1)
        rec = self.srv.execute(sid, "kept + 1")
        self.assertEqual(rec["results"], [{"text/plain": "42"}])
        self.assertEqual(self.srv.ok("GET", path_of(sid))["state"], "running")
        # 0 is never; a negative value is refused.
        r = self.srv.request("POST", "/v1/sessions", {"hibernate_after_s": -1})
        self.assertEqual(r.status, 400, r)
        never = self.srv.ok("POST", "/v1/sessions", {"hibernate_after_s": 0}, status=201)["id"]
        self.addCleanup(self.srv.request, "DELETE", path_of(never))
        self.assertEqual(self.srv.ok("GET", path_of(never))["hibernate_after_s"], 0)

    def stored_ids(self):
        d = os.path.join(self.srv.data_dir, "store", "sessions")
        return set(os.listdir(d)) if os.path.isdir(d) else set()

    def test_a_hibernated_session_closed_leaves_nothing_of_its_variables_in_the_store(self):
        sid = self.srv.ok("POST", "/v1/sessions", {"persist": False}, status=201)["id"]
        self.srv.execute(sid, "kept = 'not to outlive its session'")
        before = self.stored_ids()
        self.assertEqual(self.srv.ok("POST", path_of(sid, "/pause"), {})["state"], "hibernated")
        self.assertEqual(len(self.stored_ids() - before), 1)  # its variables, while it sleeps
        self.srv.ok("DELETE", path_of(sid))
        self.assertEqual(self.stored_ids() - before, set())

    def test_a_javascript_session_is_not_hibernated(self):
        sid = self.srv.ok("POST", "/v1/sessions", {"language": "javascript"}, status=201)["id"]
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        self.srv.execute(sid, "let kept = 5")
        r = self.srv.request("POST", path_of(sid, "/pause"), {})
        self.assertEqual((r.status, r.error_code), (400, "bad_request"), r)
        self.assertIn("pause it with keep_memory", r.json()["error"]["message"])
        self.assertEqual(self.srv.execute(sid, "kept")["results"], [{"text/plain": "5"}])

    def test_processes_that_continue_each_other_are_all_stopped_or_the_pause_refused(self):
        # Two processes that send each other SIGCONT in a loop: a pause stops both (the
        # freezer, or SIGSTOP until each is seen stopped), or says it could not and leaves
        # them running; it never answers paused while one runs.
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        loop = ("import os, signal, time\n"
                "while True:\n"
                "    try:\n        os.kill(int(open('%s').read()), signal.SIGCONT)\n"
                "    except (OSError, ValueError):\n        pass\n"
                "    with open('%s', 'a') as f:\n        f.write('x')\n"
                "    time.sleep(0.001)\n")
        self.srv.execute(sid, "import subprocess, sys\n"
                              "a = subprocess.Popen([sys.executable, '-c', %r])\n"
                              "b = subprocess.Popen([sys.executable, '-c', %r])\n"
                              "open('pa', 'w').write(str(a.pid))\n"
                              "open('pb', 'w').write(str(b.pid))"
                              % (loop % ("pb", "ta"), loop % ("pa", "tb")))
        self.assertTrue(wait_until(lambda: self.size_of(sid, "ta") > 0 and
                                   self.size_of(sid, "tb") > 0))
        r = self.srv.request("POST", path_of(sid, "/pause"), {"keep_memory": True})
        if r.status == 200:
            sizes = (self.size_of(sid, "ta"), self.size_of(sid, "tb"))
            time.sleep(0.3)  # nothing in the sandbox runs: the files cannot grow, however long
            self.assertEqual((self.size_of(sid, "ta"), self.size_of(sid, "tb")), sizes)
            self.srv.ok("POST", path_of(sid, "/resume"))
        else:
            self.assertIn("did not all stop", r.json()["error"]["message"], r)
            sizes = (self.size_of(sid, "ta"), self.size_of(sid, "tb"))
            self.assertTrue(wait_until(lambda: self.size_of(sid, "ta") > sizes[0]))
        self.srv.execute(sid, "a.kill(); b.kill()")

    def test_a_pause_waits_for_the_running_cell(self):
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        st = self.srv.stream(sid, "print('up', flush=True)\n" + WAIT_FOR_GO + "done = 1")
        st.next()
        box = {}
        t = threading.Thread(target=lambda: box.update(
            r=self.srv.request("POST", path_of(sid, "/pause"), {"keep_memory": True})))
        t.start()
        self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        self.assertStatus(st.rest()[-1]["record"], "ok")
        t.join(HANG)
        self.assertEqual(box["r"].status, 200, box["r"])
        # Its next cell resumes it.
        self.assertEqual(self.srv.execute(sid, "done")["results"], [{"text/plain": "1"}])


if __name__ == "__main__":
    unittest.main()
