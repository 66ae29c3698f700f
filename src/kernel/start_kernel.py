"""start_kernel.py - runs kernel.py from its precompiled code (kernel.pyc, made by the build
beside it), so that a fresh kernel does not compile 1300 lines at every start; from the
source when kernel.pyc is missing, was made by another Python, or is not of this kernel.py
(checked by the source's hash, as Python checks a checked-hash .pyc). kernel.py then runs
exactly as `python3 kernel.py ARGS` would run it: as __main__, with its own __file__."""
import _imp
import marshal
from _frozen_importlib_external import MAGIC_NUMBER, _RAW_MAGIC_NUMBER


def _kernel_code(here):
    source_path = here + "/kernel.py"
    with open(source_path, "rb") as f:
        source = f.read()
    try:
        with open(here + "/kernel.pyc", "rb") as f:
            data = f.read()
        # The header: magic, flags (0b11: a checked hash), the source's hash.
        if (data[:4] == MAGIC_NUMBER and data[4:8] == b"\3\0\0\0" and
                data[8:16] == _imp.source_hash(_RAW_MAGIC_NUMBER, source)):
            code = marshal.loads(memoryview(data)[16:])
            _imp._fix_co_filename(code, source_path)  # where it runs, as the importer does
            return code
    except (OSError, ValueError, EOFError, TypeError):
        pass
    return compile(source, source_path, "exec", dont_inherit=True)


_here = __file__.rpartition("/")[0] or "."
__file__ = _here + "/kernel.py"
exec(_kernel_code(_here))
