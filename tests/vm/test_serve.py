"""test_serve - a smoke test of `runcell serve` on the VM stage's guest (Debian 12's 6.1
kernel, pure cgroup v2, root in the root cgroup): a real HTTP client creates a session,
runs stateful cells under real limits, runs a one-shot, deletes the session and stops the
server, which must leave no process, cgroup or mount behind. The wider HTTP suite runs on
the host (tests/integration/test_http.py); this proves the daemon on the other kernel."""
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from rctest import (RuncellTestCase, Server, cgroups_of, is_root,  # noqa: E402
                    mounts_below)


class Serve(RuncellTestCase):
    def test_session_lifecycle_with_limits(self):
        with Server() as srv:
            self.assertEqual(srv.request("GET", "/healthz").status, 200)
            sid = srv.create_session(memory_mb=128, pids=32)
            desc = srv.ok("GET", "/v1/sessions/%s" % sid)
            if is_root():
                self.assertFalse(desc["limits_degraded"], desc)
            self.assertStatus(srv.execute(sid, "x = 21"), "ok")
            rec = srv.execute(sid, "x * 2")
            self.assertStatus(rec, "ok")
            self.assertIn("42", rec["stdout"] + repr(rec["results"]))
            if is_root():
                self.assertTrue(cgroups_of(srv.pid), "no cgroup for the session")
            if is_root():
                # A pause with keep_memory freezes the session's cgroup (v2's freezer here),
                # and a resume thaws it with every variable.
                self.assertEqual(srv.ok("POST", "/v1/sessions/%s/pause" % sid,
                                        {"keep_memory": True})["state"], "paused")
                frozen = []
                for cg in cgroups_of(srv.pid):
                    with open(os.path.join(cg, "cgroup.events")) as f:
                        frozen.append("frozen 1" in f.read())
                self.assertIn(True, frozen)
                srv.ok("POST", "/v1/sessions/%s/resume" % sid)
                self.assertIn("42", repr(srv.execute(sid, "x * 2")["results"]))
            rec = srv.ok("POST", "/v1/execute", {"code": "print(sum(range(10)))"})
            self.assertStatus(rec, "ok")
            self.assertEqual(rec["stdout"], "45\n")
            r = srv.request("DELETE", "/v1/sessions/%s" % sid)
            self.assertIn(r.status, (200, 204), r)
            self.assertEqual(srv.request("GET", "/v1/sessions/%s" % sid).status, 404)
            # The server may keep warm sandboxes (each with its cgroup) for later sessions:
            # everything must be gone once it has stopped.
            self.assertEqual(srv.stop(signal.SIGTERM), 0, srv.log()[-3000:])
            self.assertEqual(cgroups_of(srv.pid), [])
            self.assertEqual(mounts_below(srv.run_dir), [])


if __name__ == "__main__":
    unittest.main()
