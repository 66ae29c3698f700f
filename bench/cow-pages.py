#!/usr/bin/python3
"""cow-pages.py - where an idle session's private memory is: the pages its kernel and init
no longer share with the template, and what was written in them.

usage: bench/cow-pages.py [RUNCELL] [--cell CODE]...   (as root, cgroups and the template on)

Starts `runcell serve`, makes one session, runs the cells (default one: `x = 1`), then
compares the session's processes with the template page by page: a page is the session's
own when /proc/PID/pagemap gives it another frame than the template's at the same address
(both forked from it, so the layouts match). For each such page it reads both copies
(/proc/PID/mem) and names what changed:
  - in Python's object arenas (anonymous mappings, 16 KiB pools of one block size), the
    type of the object in each changed block and the offset of the word (0: a reference
    count), or the pool header (an allocation or a free in that pool);
  - in the C heap (the template's chunks, walked from the heap's start), the type of the
    Python object in the chunk when there is one, else the chunk's size;
  - "copied, unchanged": a page written and put back as it was (a reference count taken and
    given back), which is still a copy.
It also lists the code objects written (their warm-up counter and quickened bytecode), by
file and name. The types are read from the template's copy, so a block freed and used
again for another object is named after its old one, and a page the init wrote before it
forked the kernel shows in both. Used for docs/PERFORMANCE.md.
"""
import bisect
import collections
import os
import re
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api  # noqa: E402

PAGE = 4096
POOL = 16 << 10  # obmalloc's pool on 64-bit CPython 3.10+ (with the radix tree)
POOL_HEADER = 48
PFN_MASK = (1 << 55) - 1


def maps(pid):
    out = []
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end, fields[1], fields[5] if len(fields) > 5 else "[anon]"))
    return out


def frames(pid, start, end):
    with open("/proc/%d/pagemap" % pid, "rb") as f:
        f.seek(start // PAGE * 8)
        data = f.read((end - start) // PAGE * 8)
    return struct.unpack("<%dQ" % (len(data) // 8), data)


class Memory:
    def __init__(self, pid):
        self.f = open("/proc/%d/mem" % pid, "rb", buffering=0)

    def read(self, addr, n):
        try:
            self.f.seek(addr)
            return self.f.read(n)
        except (OSError, ValueError, OverflowError):
            return None

    def word(self, addr):
        b = self.read(addr, 8)
        return struct.unpack("<Q", b)[0] if b and len(b) == 8 else None


class Namer:
    """Names objects in the template's memory (CPython 3.11's layouts)."""

    def __init__(self, mem):
        self.mem, self.types = mem, {}

    def type_name(self, t):
        if t not in self.types:
            name, p = None, self.mem.word(t + 24)  # tp_name
            s = self.mem.read(p, 64) if p else None
            if s:
                s = s.split(b"\0")[0]
                if re.fullmatch(rb"[A-Za-z_][\w.]{0,62}", s):
                    name = s.decode()
            self.types[t] = name
        return self.types[t]

    def object_at(self, block):
        """(address, type name) of the object a block holds: at its start, or after a GC
        header of 16 bytes; (None, None) when neither looks like an object."""
        for header in (0, 16):
            t = self.mem.word(block + header + 8)
            name = self.type_name(t) if t else None
            if name:
                return block + header, name
        return None, None

    def text(self, p):
        d = self.mem.read(p + 48, 80) if p else None  # a compact ASCII str's characters
        return d.split(b"\0")[0].decode("ascii", "replace") if d else "?"

    def code_name(self, o):
        d = self.mem.read(o + 112, 24)  # co_filename, co_name, co_qualname
        if not d or len(d) < 24:
            return "?"
        filename, _, qualname = struct.unpack("<3Q", d)
        return "%s:%s" % (self.text(filename).rsplit("/", 1)[-1], self.text(qualname))


def heap_chunks(mem, start, end):
    data, chunks, c = mem.read(start, end - start), [], start
    while data and c + 16 <= end:
        size = struct.unpack_from("<Q", data, c - start + 8)[0] & ~7
        if size < 16 or c + size > end:
            break
        chunks.append((c, size))
        c += size
    return chunks


def compare(pid, template):
    kmem, tmem = Memory(pid), Memory(template)
    namer = Namer(tmem)
    tmaps = {(a, b): n for a, b, _, n in maps(template)}
    chunks = []
    for a, b, _, name in maps(template):
        if name == "[heap]":
            chunks = heap_chunks(tmem, a, b)
    starts = [c for c, _ in chunks]
    pages, kinds, words, code = (collections.Counter() for _ in range(4))
    for a, b, perm, name in maps(pid):
        if "w" not in perm or (a, b) not in tmaps:
            continue
        for i, (k, t) in enumerate(zip(frames(pid, a, b), frames(template, a, b))):
            if not k >> 63 or (t >> 63 and (k & PFN_MASK) == (t & PFN_MASK)):
                continue  # not present, or still the template's frame
            addr = a + i * PAGE
            pages[name] += 1
            mine, theirs = kmem.read(addr, PAGE), tmem.read(addr, PAGE)
            if not mine or not theirs or not t >> 63:
                kinds[(name, "not in the template")] += 1
                continue
            changed = [j for j in range(0, PAGE, 8) if mine[j:j + 8] != theirs[j:j + 8]]
            if not changed:
                kinds[(name, "copied, unchanged")] += 1
                continue
            what = set()
            for j in changed:
                w = addr + j
                if name == "[anon]":
                    pool = w & ~(POOL - 1)
                    h = tmem.read(pool, POOL_HEADER)
                    szidx, nextoffset = struct.unpack_from("<2I", h, 36) if h else (99, 0)
                    if szidx >= 32 or not POOL_HEADER <= nextoffset <= POOL + 1024:
                        what.add("not a pool")
                        continue
                    if w - pool < POOL_HEADER:
                        what.add("pool header")
                        words["pool header"] += 1
                        continue
                    size = (szidx + 1) * 16
                    block = pool + POOL_HEADER + (w - pool - POOL_HEADER) // size * size
                elif name == "[heap]" and chunks:
                    c, size = chunks[bisect.bisect_right(starts, w) - 1]
                    if w < c + 16:
                        what.add("malloc header")
                        words["malloc header"] += 1
                        continue
                    block = c + 16
                else:
                    what.add("data")
                    continue
                o, tname = namer.object_at(block)
                if tname == "code":
                    code[namer.code_name(o)] += 1
                label = ("%s %s" % (tname, "refcount" if w == o else "+%d" % (w - o)) if tname
                         else "no object (block of %d bytes)" % size)
                words[("%s: " % name) + label] += 1
                what.add(tname or "no object")
            kinds[(name, ", ".join(sorted(what))[:70])] += 1
    return pages, kinds, words, code


def report(title, pid, template):
    pages, kinds, words, code = compare(pid, template)
    print("\n== %s (pid %d): %d pages (%d kB) not shared with the template" % (
        title, pid, sum(pages.values()), sum(pages.values()) * 4))
    for name, n in pages.most_common():
        print("  %5d  %s" % (n, name))
    print("  pages by what changed in them:")
    for (name, what), n in kinds.most_common(25):
        print("  %5d  %-28s %s" % (n, name[-28:], what))
    print("  words written, by what holds them:")
    for what, n in words.most_common(25):
        print("  %5d  %s" % (n, what))
    if code:
        print("  code objects written (words):")
        for what, n in code.most_common(20):
            print("  %5d  %s" % (n, what))


def family(root):
    parent, comm = {}, {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    stat = f.read()
            except OSError:
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
            comm[int(d)] = stat[stat.find("(") + 1:stat.rfind(")")]
    below, grew = set(), True
    while grew:
        more = {p for p, pp in parent.items() if (pp == root or pp in below) and p not in below}
        below |= more
        grew = bool(more)
    return {p: parent[p] for p in below}, comm


def main(argv):
    binary = argv[0] if argv and not argv[0].startswith("--") else "build/src/runcell"
    cells = [argv[i + 1] for i, a in enumerate(argv) if a == "--cell"] or ["x = 1"]
    rc = api.Runcell(os.path.abspath(binary))
    try:
        conn = rc.conn()
        time.sleep(2)  # the ready pool filled
        sid = rc.call(conn, "POST", "/v1/sessions", {})["id"]
        for cell in cells:
            rc.call(conn, "POST", "/v1/sessions/%s/execute" % sid, {"code": cell})
        # The session's kernel is the process in the session's PID namespace (this last cell
        # is the only one not measured alone).
        ns = rc.call(conn, "POST", "/v1/sessions/%s/execute" % sid,
                     {"code": "import os; os.readlink('/proc/self/ns/pid')"})
        ns = ns["results"][0]["text/plain"].strip("'")
        parent, comm = family(rc.proc.pid)
        templates = [p for p, pp in parent.items() if comm[p] == "python3" and
                     parent.get(pp) == rc.proc.pid]
        if not templates:
            sys.exit("cow-pages: no template below runcell serve (it needs root and cgroups)")
        template = templates[0]
        kernels = [p for p in parent if comm[p] == "python3" and p != template and
                   os.readlink("/proc/%d/ns/pid" % p) == ns]
        if len(kernels) != 1:
            sys.exit("cow-pages: cannot tell the session's kernel (%s in %s)" % (kernels, ns))
        kernel = kernels[0]
        report("kernel, after %d cell(s)" % len(cells), kernel, template)
        report("init", parent[kernel], template)
    finally:
        rc.close()


if __name__ == "__main__":
    main(sys.argv[1:])
