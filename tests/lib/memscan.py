"""memscan - looking for a value in processes' memory without ever holding it whole: from the
host (/proc/PID/mem, as root) and from inside a sandbox (its own /proc/self/mem). The value
is given as two halves, joined only where the scan compares bytes, so that the scanning code
never puts the whole value into the memory it searches (tests/integration/test_template.py
scans the same way)."""
import os


def children_of():
    """{ppid: [pid, ...]} of every live process (zombies left out)."""
    tree = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, ppid = fields[0], int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
        if state != "Z":
            tree.setdefault(ppid, []).append(int(d))
    return tree


def descendants(pid):
    tree, out, todo = children_of(), [], [pid]
    while todo:
        for c in tree.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


MAX_REGION = 4 << 30  # bytes of one mapping scanned at most


def holds(pid, head, tail):
    """Whether head+tail (bytes) appears in pid's environment, command line or readable
    memory."""
    keep = len(head) + len(tail)

    def found(data):
        i = data.find(head)
        while i >= 0:
            if data[i + len(head):i + keep] == tail:
                return True
            i = data.find(head, i + 1)
        return False

    for name in ("environ", "cmdline"):
        try:
            with open("/proc/%d/%s" % (pid, name), "rb") as f:
                if found(f.read()):
                    return True
        except OSError:
            pass
    try:
        maps = open("/proc/%d/maps" % pid)
        mem = open("/proc/%d/mem" % pid, "rb", 0)
    except OSError:
        return False
    step = 8 << 20
    with maps, mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if not perms.startswith("r") or line.rstrip().endswith("[vvar]"):
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            if hi - lo > MAX_REGION:
                continue  # a sanitizer's shadow memory, terabytes of reserved zeros
            # In pieces that overlap by the value's length, so none is missed at a seam.
            for at in range(lo, hi, step):
                try:
                    mem.seek(at)
                    if found(mem.read(min(step + keep, hi - at))):
                        return True
                except (OSError, OverflowError, ValueError):
                    break
    return False


# Run inside a sandbox: where head is directly followed by tail in this process's memory,
# its environment, its files (below the given roots) and the other processes it can see.
# Reads its memory in capped pieces into one buffer mapped apart from the heap.
SANDBOX_SCAN = r'''
import ctypes, mmap, os
def _hits_in(data, head, tail):
    keep, i = len(head) + len(tail), data.find(head)
    while i >= 0:
        if data[i + len(head):i + keep] == tail:
            return True
        i = data.find(head, i + 1)
    return False
def scan_memory(head, tail):
    step, keep = 8 << 20, len(head) + len(tail)
    buf, hits, regions, scanned = mmap.mmap(-1, step + keep), [], [], 0
    own = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    with open("/proc/self/maps") as maps:
        for line in maps:
            f = line.split()
            if f[1].startswith("r") and (len(f) < 6 or f[5] not in ("[vvar]", "[vsyscall]")):
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                if not lo <= own < hi:
                    regions.append((lo, hi, f[5] if len(f) > 5 else ""))
    with open("/proc/self/mem", "rb", 0) as mem:
        for lo, hi, name in regions:
            at = lo
            while at < hi:
                try:
                    mem.seek(at)
                    n = mem.readinto(memoryview(buf)[:min(step + keep, hi - at)])
                except OSError:
                    break
                scanned += n
                i = buf.find(head, 0, n)
                while i >= 0:
                    if buf[i + len(head):i + keep] == tail:
                        hits.append("%x %s" % (at + i, name))
                    i = buf.find(head, i + 1, n)
                at += step
    return {"hits": hits, "scanned_mb": scanned >> 20}
def scan_files(head, tail, roots, skip, max_bytes=8 << 20):
    hits, n = [], 0
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if os.path.join(d, x) not in skip]
            for f in files:
                p = os.path.join(d, f)
                try:
                    if os.path.islink(p) or os.path.getsize(p) > max_bytes:
                        continue
                    with open(p, "rb") as fh:
                        data = fh.read()
                except OSError:
                    continue
                n += 1
                if _hits_in(data, head, tail):
                    hits.append(p)
    return {"hits": hits, "files": n}
def scan_processes(head, tail):
    hits = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("environ", "cmdline"):
            try:
                with open("/proc/%s/%s" % (pid, what), "rb") as fh:
                    if _hits_in(fh.read(), head, tail):
                        hits.append("%s/%s" % (pid, what))
            except OSError:
                pass
    env = "\0".join("%s=%s" % kv for kv in os.environ.items()).encode()
    return {"hits": hits + (["os.environ"] if _hits_in(env, head, tail) else [])}
'''
