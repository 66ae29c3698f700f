"""A session's state beyond its next cell: undo (the kernel's whole memory before a cell, and
the files that cell and those after it changed), forks, snapshots (on one node and started
on another), and pauses (every process stopped, or hibernated), each with its limits: the
history's depth, an undo after the kernel was lost to an out-of-memory kill, a fork or a pause
while a cell runs, forks past --max-sessions, snapshots past --max-snapshots and past the
store quota."""
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
