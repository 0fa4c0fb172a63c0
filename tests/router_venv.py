"""The routers the tests deploy: the real sglang-router 0.3.2 and a stand-in of the legacy one.

Both are Debian's python (what test hosts run) in a venv under .cache, built once per
checkout and readable by every user, so a deployment takes either as its `python`:

    python: str(router_venv() / "bin" / "python")   # sglang-router 0.3.2, `/workers` API
    python: str(legacy_router_python())             # ≤ 0.2.1 API, tests/standin/legacy_router.py

and both run `{{ python }} -m sglang_router.launch_router --host H --port P --policy X`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.sglang_wheel import SITE, WHEELS, built_once
from tests.sshd_hosts import HOST_PYTHON, REPO, sh

ROUTER_VERSION = "0.3.2"
LEGACY_ROUTER = Path(__file__).parent / "standin" / "legacy_router.py"


def router_venv() -> Path:
    """Build (once) and return a venv with the real sglang-router, from .cache/wheels or PyPI."""
    wanted = f"sglang-router=={ROUTER_VERSION}"

    def build(venv: Path) -> None:
        sh(HOST_PYTHON, "-m", "venv", venv)
        # scripts/test downloads the wheel (31 MB); its dependencies come from PyPI either way.
        wheel = next(WHEELS.glob(f"sglang_router-{ROUTER_VERSION}-*.whl"), wanted)
        sh(venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel)
        sh("chmod", "-R", "a+rX", venv)

    return built_once(REPO / ".cache" / "router-venv", wanted, build)


def legacy_router_python() -> Path:
    """Build (once) and return the python of a venv whose `sglang_router` is the legacy stand-in."""

    def build(venv: Path) -> None:
        sh(HOST_PYTHON, "-m", "venv", "--without-pip", venv)  # the stand-in is stdlib only
        package = venv / SITE / "sglang_router"
        package.mkdir()
        (package / "__init__.py").write_text('"""tests/standin/legacy_router.py as a package."""\n')
        shutil.copy(LEGACY_ROUTER, package / "launch_router.py")
        # Compiled now: test host users cannot write __pycache__ here.
        sh(venv / "bin" / "python", "-m", "compileall", "-q", package)
        sh("chmod", "-R", "a+rX", venv)

    venv = built_once(REPO / ".cache" / "legacy-router", LEGACY_ROUTER.read_text(), build)
    return venv / "bin" / "python"
