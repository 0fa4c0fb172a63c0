"""The host-side scripts that run before the agent's package can be imported.

deployctl ships `deployctl/remote/` as one bundle: a zip of its modules under the package
name `PACKAGE`, named by the sha256 of its bytes. Each call runs `BOOTSTRAP` (`python -c`),
which imports the package from the folder the bundle was unpacked into, once, by `UNPACK`;
`IN_MEMORY` runs a call from a bundle carried in argv where nothing can be written.
"""

from __future__ import annotations

from .protocol import AGENT_MISSING, AGENT_MISSING_EXIT, BUNDLE_COMPLETE

# The package's name inside the bundle and on the host: unlike `deployctl`, no module a
# server or a verify script imports from the home folder is ever shadowed by it.
PACKAGE = "deployctl_remote"

# `python -c BOOTSTRAP FOLDER CALL JSON-ARGS`: use FOLDER only when it is complete (its
# marker names it, written last by UNPACK) and only its owner can change it; else ask for
# the bundle. The modules are imported normally, so Python keeps their bytecode there.
BOOTSTRAP = f"""import os, sys
folder = sys.argv[1]
try:
    info = os.stat(folder)
    with open(os.path.join(folder, "{BUNDLE_COMPLETE}")) as marker:
        ok = marker.read() == os.path.basename(folder)
    ok = ok and info.st_uid == os.getuid() and not info.st_mode & 0o022
except OSError:
    ok = False
if not ok:
    print("{AGENT_MISSING}")
    sys.exit({AGENT_MISSING_EXIT})
sys.path.insert(0, folder)
sys.dont_write_bytecode = False  # the cache is the folder's own, whatever the login's env says
sys.argv = sys.argv[1:]
from {PACKAGE}.dispatch import main
main()
"""

# `python -c UNPACK FOLDER` with the bundle on stdin: unpack it into a private temporary
# folder beside FOLDER, mark it complete, then rename it into place, so a call never sees a
# half-unpacked folder and two first calls at once both succeed.
UNPACK = f"""import hashlib, io, os, shutil, sys, tempfile, zipfile
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
def complete(path):
    try:
        with open(os.path.join(path, "{BUNDLE_COMPLETE}")) as marker:
            ok = marker.read() == name
        info = os.stat(path)
        return ok and info.st_uid == os.getuid() and not info.st_mode & 0o022
    except OSError:
        return False
unpacking = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
try:
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        for member in bundle.namelist():
            if member.startswith("/") or ".." in member.split("/"):
                sys.exit("the bundle names a file outside its folder: " + member)
            target = os.path.join(unpacking, member)
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            with open(target, "wb") as out:
                out.write(bundle.read(member))
    with open(os.path.join(unpacking, "{BUNDLE_COMPLETE}"), "w") as marker:
        marker.write(name)
    try:
        os.rename(unpacking, folder)
    except OSError:  # there already: another first call's (fine) or an incomplete one
        if not complete(folder):
            stale = tempfile.mkdtemp(prefix=".stale-", dir=parent)
            os.rename(folder, os.path.join(stale, name))
            os.rename(unpacking, folder)
            shutil.rmtree(stale, ignore_errors=True)
finally:
    shutil.rmtree(unpacking, ignore_errors=True)
"""

# `python -c IN_MEMORY BUNDLE-BASE64 CALL JSON-ARGS`: where nothing can be written under
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
