"""The host-side scripts that run before the agent's package can be imported.

deployctl ships `deployctl/remote/` as one bundle: a zip of its modules under the package
name `PACKAGE`, named by the sha256 of its bytes. Each call runs `BOOTSTRAP` (`python -S -c`),
which imports the package from the folder the bundle was unpacked into, once, by `UNPACK`;
`IN_MEMORY` runs a call from a bundle carried in argv where nothing can be written.

What a call runs is trusted only when every part of its folder is the login user's own and
whole: `UNPACK` writes a manifest (each module's sha256, as the bundle holds it) beside the
modules, and `BOOTSTRAP` checks, before it imports anything from there, that every folder and
file is the user's, writable by nobody else and no symlink, that the manifest is the one the
client computed from its own bundle (`manifest_digest`), and that each module has its sha256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from .wire import AGENT_MISSING, AGENT_MISSING_EXIT, BUNDLE_ABSENT, BUNDLE_COMPLETE

# The package's name inside the bundle and on the host: unlike `deployctl`, no module a
# server or a verify script imports from the home folder is ever shadowed by it.
PACKAGE = "deployctl_remote"
# Beside the package in an unpacked folder: "<sha256>  <path>" per module, sorted by path.
MANIFEST = "manifest"


def manifest(files: Mapping[str, bytes]) -> bytes:
    """The manifest of a bundle's files (path in the bundle → bytes), as UNPACK writes it."""
    lines = (f"{hashlib.sha256(files[name]).hexdigest()}  {name}\n" for name in sorted(files))
    return "".join(lines).encode()


# `sha256_hex(DATA)` without hashlib's import (OpenSSL: ~6 ms of each call's start), as
# lean.sha256_hex: the bootstrap runs before the package may be imported.
_SHA256 = """def builtin_sha256():
    for name in ("_sha256", "_sha2"):
        try:
            return __import__(name).sha256
        except (ImportError, AttributeError):
            pass
    import hashlib
    return hashlib.sha256
sha256 = builtin_sha256()
def sha256_hex(data):
    return sha256(data).hexdigest()
"""

# `unsound(FOLDER, DIGEST)`: why FOLDER must not be run ("": it may). Only what the login user
# alone can change is run: a file another user can write, or a symlink anywhere in the folder,
# is code someone else chose. Bytecode in `__pycache__` is Python's own, so only its owner and
# mode are checked; any other file the manifest does not list could shadow a module.
_UNSOUND = f"""def unsound(folder, digest):
    uid = os.getuid()
    def odd(info, name):
        if stat.S_ISLNK(info.st_mode):
            return name + " is a symlink"
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            return name + " is not a file"
        if info.st_uid != uid:
            return name + " belongs to another user"
        if info.st_mode & 0o022:
            return name + " is writable by others"
        return ""
    try:
        top = os.lstat(folder)
        parent = os.stat(os.path.dirname(folder))
    except OSError:
        return "{BUNDLE_ABSENT}"
    why = odd(parent, "its parent folder") or odd(top, "the folder")
    if why or not stat.S_ISDIR(top.st_mode):
        return why or "the folder is a file"
    files, folders, pending = {{}}, set(), [("", folder)]
    try:
        while pending:
            prefix, path = pending.pop()
            for entry in os.scandir(path):
                name = prefix + ascii(entry.name)[1:-1]
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    # Python writes bytecode to a temporary name and renames it: another
                    # call of the agent at the same moment may rename it away mid-scan.
                    if os.path.basename(path) == "__pycache__":
                        continue
                    raise
                why = odd(info, name)
                if why:
                    return why
                if entry.is_dir(follow_symlinks=False):
                    folders.add(name)
                    pending.append((name + "/", entry.path))
                else:
                    files[name] = entry.path
        if "{BUNDLE_COMPLETE}" not in files or "{MANIFEST}" not in files:
            return "it is incomplete (no completion marker or manifest)"
        with open(files["{BUNDLE_COMPLETE}"]) as marker:
            if marker.read() != os.path.basename(folder):
                return "its completion marker names another bundle"
        with open(files["{MANIFEST}"], "rb") as listing:
            text = listing.read()
        if sha256_hex(text) != digest:
            return "its manifest is not this bundle's"
        listed = dict(reversed(line.split("  ", 1)) for line in text.decode().splitlines())
        for name in sorted(listed):
            if name not in files:
                return name + " is missing"
            with open(files[name], "rb") as module:
                if sha256_hex(module.read()) != listed[name]:
                    return name + " was changed"
    except OSError as exc:
        return "it cannot be read: " + str(exc.strerror) + ": " + ascii(exc.filename)
    wanted = {{"{BUNDLE_COMPLETE}", "{MANIFEST}"}} | set(listed)
    for name in sorted(files):
        if name not in wanted and os.path.basename(os.path.dirname(name)) != "__pycache__":
            return "it holds a file the bundle has not: " + name
    parents = set()
    for name in listed:
        while "/" in name:
            name = os.path.dirname(name)
            parents.add(name)
    for name in sorted(folders):
        if name not in parents and os.path.basename(name) != "__pycache__":
            return "it holds a folder the bundle has not: " + name
    return ""
"""

# How the host's python runs a call: without its site-packages (`-S`). The agent is stdlib
# only, and a host's `.pth` files and `sitecustomize` (code any installed package may add,
# measured here at 5 ms of a 55 ms call) neither run nor slow it; a call that looks for an
# installed package adds them first (files.find_package). Bootstraps and unpacking start no
# server: the server's own python is started afresh, with its site.
PYTHON_FLAGS = ("-S",)

# `python -S -c BOOTSTRAP FOLDER DIGEST CALL JSON-ARGS`: run FOLDER only when `unsound` finds
# nothing (DIGEST: the sha256 of its manifest); else say why and ask for the bundle. The
# modules are imported normally, so Python keeps their bytecode there.
BOOTSTRAP = f"""import os, stat, sys
{_SHA256}
{_UNSOUND}
why = unsound(sys.argv[1], sys.argv[2])
if why:
    print("{AGENT_MISSING} " + why)
    sys.exit({AGENT_MISSING_EXIT})
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = False  # the cache is the folder's own, whatever the login's env says
sys.argv = sys.argv[2:]
from {PACKAGE}.dispatch import main
main()
"""

# `python -c UNPACK FOLDER` with the bundle on stdin: unpack it into a private temporary
# folder beside FOLDER, every folder 0700 and file 0600 whatever the umask, with its manifest
# and each package's `__pycache__` (Python would make that one by the umask); mark it complete,
# then rename it into place, so a call never sees a half-unpacked folder and two first calls
# at once both succeed. A folder already there that `unsound` refuses is moved aside first.
UNPACK = f"""import hashlib, io, os, shutil, stat, sys, tempfile, zipfile
def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()
{_UNSOUND}
folder = sys.argv[1]
name, parent = os.path.basename(folder), os.path.dirname(folder)
data = sys.stdin.buffer.read()
if hashlib.sha256(data).hexdigest() != name:
    sys.exit("the bundle received is not " + name)
os.makedirs(parent, mode=0o700, exist_ok=True)
info = os.stat(parent)
if info.st_uid != os.getuid():
    sys.exit(parent + " belongs to another user")
if info.st_mode & 0o022:
    os.chmod(parent, 0o700)
unpacking = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
try:
    sums = []
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        for member in sorted(bundle.namelist()):
            if member.startswith("/") or ".." in member.split("/"):
                sys.exit("the bundle names a file outside its folder: " + member)
            target = os.path.join(unpacking, member)
            cache = os.path.join(os.path.dirname(target), "__pycache__")
            os.makedirs(cache, mode=0o700, exist_ok=True)
            content = bundle.read(member)
            with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                out.write(content)
            sums.append(hashlib.sha256(content).hexdigest() + "  " + member + "\\n")
    listing = "".join(sums).encode()
    for place, _, _ in os.walk(unpacking):
        os.chmod(place, 0o700)
    with open(os.path.join(unpacking, "{MANIFEST}"), "wb") as out:
        out.write(listing)
    with open(os.path.join(unpacking, "{BUNDLE_COMPLETE}"), "w") as marker:
        marker.write(name)
    for each in ("{MANIFEST}", "{BUNDLE_COMPLETE}"):
        os.chmod(os.path.join(unpacking, each), 0o600)
    try:
        os.rename(unpacking, folder)
    except OSError:  # there already: another first call's (fine) or one not to be run
        if unsound(folder, hashlib.sha256(listing).hexdigest()):
            stale = tempfile.mkdtemp(prefix=".stale-", dir=parent)
            os.rename(folder, os.path.join(stale, name))
            os.rename(unpacking, folder)
            shutil.rmtree(stale, ignore_errors=True)
finally:
    shutil.rmtree(unpacking, ignore_errors=True)
"""

# `python -S -c IN_MEMORY BUNDLE-BASE64 CALL JSON-ARGS`: where nothing can be written under
# state_dir (a full disk must not stop a `stop`), import the package from the bundle in
# memory, as the folder would have given it.
IN_MEMORY = f"""import base64, importlib.abc, importlib.util, io, sys, zipfile
with zipfile.ZipFile(io.BytesIO(base64.b64decode(sys.argv[1]))) as bundle:
    sources = {{n[:-3].replace("/", "."): bundle.read(n) for n in bundle.namelist()}}
class Bundle(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        package = name + ".__init__" in sources
        if package or name in sources:
            return importlib.util.spec_from_loader(name, self, is_package=package)
        return None
    def exec_module(self, module):
        key = module.__name__
        key = key + ".__init__" if key + ".__init__" in sources else key
        path = "<bundle>/" + key.replace(".", "/") + ".py"
        exec(compile(sources[key], path, "exec"), module.__dict__)
sys.meta_path.insert(0, Bundle())
sys.argv = sys.argv[1:]
from {PACKAGE}.dispatch import main
main()
"""
