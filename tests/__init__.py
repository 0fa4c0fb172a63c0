"""deployctl's tests."""

import os
import sys
import tempfile

# Bytecode is cached (beside the sources; git ignores __pycache__/) even where the environment
# says not to (PYTHONDONTWRITEBYTECODE): otherwise each xdist worker compiles the tests and
# deployctl again (~3 s of CPU here) and so does each of the hundreds of CLI runs (~0.1 s each).
# Here, the first module of the suite pytest imports, it also covers conftest and its imports.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _ram_disk(path: str = "/dev/shm", room: int = 4 << 30) -> bool:
    """Whether `path` is a RAM disk we may write and run files in, with `room` bytes free."""
    try:
        disk = os.statvfs(path)
    except OSError:
        return False
    usable = os.access(path, os.W_OK | os.X_OK) and not disk.f_flag & os.ST_NOEXEC
    return usable and disk.f_bavail * disk.f_frsize >= room


# Temporary files (pytest's tmp_path, and those of the processes the tests start, `patch port`
# among them) go to a RAM disk unless TMPDIR says where: this machine's disk costs ~0.4 ms of
# system CPU per file created (unpacking an SGLang wheel, 6,000 files: 2.4 s on disk, 0.1 s on
# /dev/shm), and the patch tests unpack several (the patch and variant tests: 56 s -> 23 s).
if "TMPDIR" not in os.environ and _ram_disk():
    os.environ["TMPDIR"] = "/dev/shm"
    tempfile.tempdir = None  # read TMPDIR again
