"""install.py - installs a session's packages with pip, inside its sandbox, before its code
runs; prints one JSON report as the last line of stdout.

usage: install.py --budget SECONDS [--requirements FILE] -- [REQUIREMENT...]

Everything is tried in one pip run first (one resolution, fast). If that fails, each
requirement is tried alone, so that the report names exactly which ones cannot be installed
and why (pip's own error lines), and the others are installed all the same. The budget is
for the whole; what it leaves no time for is reported as not installed.
"""
import json
import os
import re
import subprocess
import sys
import time

PIP = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
       "--progress-bar", "off", "--retries", "1", "--timeout", "15"]
REASON_MAX = 600


def name_of(req):
    """The project name of a requirement ("pandas>=2; python_version>'3'" -> "pandas")."""
    return re.split(r"[\s<>=!~;\[@(,]", req.strip(), maxsplit=1)[0]


def read_requirements(path):
    """Requirement lines and option lines (--index-url ..., which apply to every line)."""
    reqs, opts = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("-"):
                opts += line.split(None, 1)
            else:
                reqs.append(line)
    return reqs, opts


def reason_from(output):
    errors = [l[len("ERROR:"):].strip() for l in output.splitlines() if l.startswith("ERROR:")]
    text = " ".join(errors) if errors else (output.strip().splitlines() or ["pip failed"])[-1]
    return text[:REASON_MAX]


def pip(args, deadline):
    left = deadline - time.monotonic()
    if left <= 1:
        return None, "the install time budget ran out before this was tried"
    try:
        p = subprocess.run(PIP + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace", timeout=left)
    except subprocess.TimeoutExpired:
        return None, "the install time budget ran out while pip was working on it"
    return p.returncode == 0, p.stdout


def main(argv):
    budget, requirements, reqs = 120.0, None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--budget":
            budget = float(argv[i + 1])
            i += 1
        elif a.startswith("--requirements="):
            requirements = a.split("=", 1)[1]
        elif a == "--":
            reqs = argv[i + 1:]
            break
        i += 1
    deadline = time.monotonic() + budget
    opts = []
    source = "packages"
    if requirements:
        source = os.path.basename(requirements)
        reqs, opts = read_requirements(requirements)
    report = {"source": source, "requested": reqs, "installed": [], "missing": []}
    ok, out = (True, "") if not reqs else pip(opts + reqs, deadline)
    if ok:
        report["installed"] = list(reqs)
    else:
        timed_out = ok is None
        for req in reqs:
            ok1, out1 = (None, out) if timed_out else pip(opts + [req], deadline)
            if ok1:
                report["installed"].append(req)
                continue
            timed_out = timed_out or ok1 is None
            reason = out1 if ok1 is None else reason_from(out1)
            report["missing"].append({"requirement": req, "name": name_of(req),
                                      "reason": reason})
    if not report["missing"]:
        report["status"] = "ok"
    elif any("budget ran out" in m["reason"] for m in report["missing"]):
        report["status"] = "timeout"
    else:
        report["status"] = "partial" if report["installed"] else "failed"
    sys.stdout.flush()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
