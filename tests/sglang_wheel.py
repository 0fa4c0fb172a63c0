"""The real SGLang 0.5.23 wheel, installed with --no-deps into test hosts' virtualenvs."""

from __future__ import annotations

import atexit
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.sshd_hosts import HOST_PYTHON, REPO, TestHost, copy_standin, locked, sh

SGLANG_VERSION = "0.5.23"
WHEELS = REPO / ".cache" / "wheels"
WHEELS_LOCK = REPO / ".cache" / "wheels.lock"
SITE = "lib/python3.11/site-packages"


def ensure_wheels() -> list[Path]:
    """Download the SGLang and msgspec wheels once (scripts/test does it too)."""
    wanted = [f"sglang-{SGLANG_VERSION}-*.whl", "msgspec-*.whl"]
    with locked(WHEELS_LOCK):  # pip writes a wheel in place: another worker must not see half
        if not all(list(WHEELS.glob(p)) for p in wanted):
            WHEELS.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["python3", "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                 "--python-version", "3.11", "-d", str(WHEELS), f"sglang=={SGLANG_VERSION}",
                 "msgspec"],
                check=True,
            )  # fmt: skip
    return [next(WHEELS.glob(p)) for p in wanted]


def sglang_wheel(version: str) -> Path:
    """The real SGLang wheel of one release, downloaded once (scripts/test does it too).

    The patch-set variant tests unzip it; pip fetches one version of a package per call.
    """
    pattern = f"sglang-{version}-*.whl"
    with locked(WHEELS_LOCK):
        if not list(WHEELS.glob(pattern)):
            WHEELS.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                 "--python-version", "3.11", "-d", str(WHEELS), f"sglang=={version}"],
                check=True,
            )  # fmt: skip
    return next(WHEELS.glob(pattern))


def built_once(venv: Path, wanted: str, build: Callable[[Path], None]) -> Path:
    """`venv`, built by `build` unless its stamp already says `wanted` (then left as it is).

    A lock beside it: two xdist workers may ask for it at once, and one must not delete or
    use the other's half-built venv.
    """
    stamp = venv / "deployctl-stamp"

    def current() -> bool:
        return stamp.exists() and stamp.read_text() == wanted

    if current():
        return venv
    with locked(venv.with_name(f"{venv.name}.lock")):
        if not current():
            shutil.rmtree(venv, ignore_errors=True)
            build(venv)
            stamp.write_text(wanted)
    return venv


_unzipped: dict[str, Path] = {}
# Where the wheels are unzipped: set by tests/conftest.py to the run's temporary folder, shared
# by its xdist workers (pytest removes it with old runs); None: a folder of this process's own.
UNZIP_ROOT: Path | None = None


def extract_site(version: str, target: Path) -> Path:
    """The real wheel's sglang/ package and dist-info under target (a site-packages folder).

    The wheel (6,000 files, 120 MB; 2-4 s of CPU) is unzipped once per test run, by the first
    worker that needs it; each target gets hard links to those files, which is safe as long as
    nothing rewrites a file in place (GNU patch and py_compile replace files by rename).
    """
    if version not in _unzipped:
        _unzipped[version] = _unzip_once(version)
    target.mkdir(parents=True, exist_ok=True)
    sh("cp", "-al", f"{_unzipped[version]}/.", target)
    return target


def _unzip_once(version: str) -> Path:
    root = UNZIP_ROOT
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="deployctl-sglang-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    unzipped = root / f"sglang-{version}-unzipped"
    done = root / f"sglang-{version}-unzipped.done"  # beside it: `cp -al` copies what is in it
    with locked(root / f"sglang-{version}-unzipped.lock"):
        if not done.exists():
            shutil.rmtree(unzipped, ignore_errors=True)  # a worker that died half way
            wanted = ("sglang/", f"sglang-{version}.dist-info/")
            with zipfile.ZipFile(sglang_wheel(version)) as archive:
                metadata = archive.read(f"sglang-{version}.dist-info/METADATA").decode()
                assert f"\nVersion: {version}\n" in metadata
                names = [n for n in archive.namelist() if n.startswith(wanted)]
                archive.extractall(unzipped, names)
            done.touch()
    return unzipped


def build_template(base: Path) -> Path:
    """A virtualenv of Debian's python with the real SGLang wheel and msgspec (no torch).

    No pip or setuptools in it (nothing on a host uses them): ensurepip's 1,600 files were
    more than half of the build (7.9 s, 3.4 s without, at load 9); the test runner's pip
    installs into it.
    """
    venv = base / "venv-sglang"
    sh(HOST_PYTHON, "-m", "venv", "--without-pip", venv)
    sh(
        sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
        "--disable-pip-version-check", "--no-deps", "--no-compile", "--no-index",
        *ensure_wheels(),
    )  # fmt: skip
    return venv


# SGLang's serving benchmark's client-side imports, pinned as the 0.5.23 wheel pins them.
BENCH_SERVING_DEPS = [
    "aiohttp", "msgspec", "numpy", "orjson", "pillow", "psutil", "pybase64", "pyzmq>=25.1.2",
    "requests", "tokenizers==0.23.2", "tqdm", "transformers==5.19.0",
]  # fmt: skip
BENCH_SHIM = Path(__file__).parent / "standin" / "bench_serving_shim.py"


def bench_serving_venv() -> Path:
    """Debian's python with the real SGLang wheel, bench_serving's client dependencies and
    the import shim (tests/standin/bench_serving_shim.py); built once per checkout.

    Test hosts share it read-only: its python runs the agent, the stand-in server and
    `python -m sglang.benchmark.serving`.
    """

    def build(venv: Path) -> None:
        sh(HOST_PYTHON, "-m", "venv", venv)
        pip = [venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check"]
        sh(*pip, *BENCH_SERVING_DEPS)
        sh(*pip, "--no-deps", "--no-index", ensure_wheels()[0])
        shutil.copy(BENCH_SHIM, venv / SITE / BENCH_SHIM.name)
        (venv / SITE / "deployctl_bench_shim.pth").write_text(f"import {BENCH_SHIM.stem}\n")

    wanted = "\n".join([*BENCH_SERVING_DEPS, BENCH_SHIM.read_text()])
    return built_once(REPO / ".cache" / "bench-serving-venv", wanted, build)


TOKENIZER = """
import sys
import tempfile
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {f"w{i}": i for i in range(2000)}
vocab["[UNK]"] = len(vocab)
words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def write_tokenizer(venv: Path, folder: Path) -> None:
    """A small word-level Hugging Face tokenizer in a model folder, as bench_serving loads one."""
    sh(venv / "bin" / "python", "-c", TOKENIZER, folder)


def install_on(host: TestHost, template: Path, standin: Path | None = None) -> str:
    """Give a host its own copy of the template venv; return its python.

    Hard links make the copy cheap and are safe: deployctl replaces files by rename.
    """
    venv = host.home / "venv"
    sh("cp", "-al", template, venv)
    if standin is not None:
        copy_standin(venv / SITE, standin)  # root's files, readable; its folders chowned below
    sh("find", venv, "-type", "d", "-exec", "chown", f"{host.user}:{host.user}", "{}", "+")
    sh("chown", "-h", f"{host.user}:{host.user}", venv)
    return str(venv / "bin" / "python")


def claim_version(host: TestHost, version: str) -> None:
    """Make the host's copy of SGLang (install_on's) say it is another release: its
    METADATA written anew, not through the link to the template's."""
    metadata = next((host.home / "venv" / SITE).glob("sglang-*.dist-info")) / "METADATA"
    text = metadata.read_text()
    metadata.unlink()
    metadata.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", text, count=1))


def site_file(template: Path, relpath: str) -> Path:
    return template / SITE / relpath


def write_patch_set(
    project: Path,
    name: str,
    version: str,
    template: Path,
    edits: dict[str, list[tuple[str, str]]],
    verify: dict[str, str] | None = None,
    flags: dict | None = None,
    sglang_version: str = SGLANG_VERSION,
) -> Path:
    """Write patches/<name>/ with a real unified diff made from edits to the wheel's files."""
    folder = project / "patches" / name
    (folder / sglang_version).mkdir(parents=True, exist_ok=True)
    chunks = []
    for relpath, replacements in edits.items():
        original = site_file(template, relpath).read_text()
        changed = original
        for old, new in replacements:
            assert old in changed, f"{old!r} not in {relpath}"
            changed = changed.replace(old, new, 1)
        chunks += difflib.unified_diff(
            original.splitlines(keepends=True),
            changed.splitlines(keepends=True),
            f"a/{relpath}",
            f"b/{relpath}",
        )
    (folder / sglang_version / f"{name}.diff").write_text("".join(chunks))
    verify_names = []
    for script_name, body in (verify or {}).items():
        (folder / "verify").mkdir(exist_ok=True)
        (folder / "verify" / script_name).write_text(body)
        verify_names.append(f"verify/{script_name}")
    spec = {
        "name": name,
        "version": version,
        "description": f"test set {name}",
        "flags": flags or {},
        "variants": {
            sglang_version: {"diffs": [f"{sglang_version}/{name}.diff"], "verify": verify_names}
        },
    }
    (folder / "patch.yml").write_text(yaml.safe_dump(spec))
    return folder
