"""Shared fixtures: real sshd test hosts on loopback and a runner for the deployctl CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import ansible_tools, cli_server, sglang_wheel
from tests.browser import VIEWPORT, missing_browser, running_browser
from tests.json_contract import CheckedPopen, check_output
from tests.slurm_cluster import SlurmCluster, start_cluster, stop_cluster
from tests.sshd_hosts import REPO, SSHLab, start_lab, stop_lab

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

HOST_NAMES = ["alpha", "bravo", "charlie", "delta"]
# Fixtures that start or use the sshd test hosts, need root (`full_disk` mounts a tmpfs) or
# start a listening service (`standin`: the stand-in SGLang server); a test needing any of them
# is a `lab` test, so the fast tier starts no service and runs without root. A test that starts
# a service some other way (the dashboard, a router) is marked `lab` where it is written.
LAB_FIXTURES = frozenset(
    {"lab", "hosts", "sglang_template", "slurm", "slurm_lab", "full_disk", "standin"}
)
# Fixtures that drive the real chromium; a test needing any of them is a `browser` test.
BROWSER_FIXTURES = frozenset({"browser", "page"})
# Fixtures of the session's Slurm cluster: under xdist (`--dist loadgroup`) their tests share
# one worker, so one cluster starts, not one per worker.
SLURM_FIXTURES = frozenset({"slurm", "slurm_lab"})

# A harness that starts the suite in the background can hand it SIGINT ignored, and ignored
# signals stay ignored in children: tests that end `logs -f` and `watch` with Ctrl-C need it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `lab` every test that reaches the sshd test hosts through any chain of fixtures,
    and `browser` every test that reaches chromium; a browser test is a lab test too (it needs
    what ./scripts/test installs), so the fast tier `-m 'not lab'` runs on a plain install.
    A `heavy` test (about half a second of CPU or more) is a lab test too, so the fast tier
    stays fast."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if BROWSER_FIXTURES.intersection(fixtures) or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.lab)
        if item.get_closest_marker("heavy"):
            item.add_marker(pytest.mark.lab)
        if LAB_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.lab)
        if SLURM_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    spread_long_tests(items)


# `window` tests hold a fixed window of minutes whatever the machine does (2.5 to 5.5 minutes
# each). Collected near the end, they ran alone for the suite's last minutes; handed out first,
# beside every worker's start-up, one window was starved of samples; two next to each other in
# the order went to one worker, one after the other (xdist queues two tests a worker). So they
# are spread evenly over this share of the order, the order xdist hands tests out in.
WINDOWS_FROM, WINDOWS_TO = 0.2, 0.6
# `long` tests (12 to 52 s each) collected near the end of the order were handed out last: one
# ran alone for its whole length after every other worker had finished (~50 s of a run). They
# are spread over this share of the order, after the windows, as they were collected.
LONG_FROM, LONG_TO = 0.6, 0.85


def window_minutes(item: pytest.Item) -> float:
    """How long a `window` test holds its window (0: it is none)."""
    marker = item.get_closest_marker("window")
    return 0.0 if marker is None else float(marker.kwargs["minutes"])


def spread_long_tests(items: list[pytest.Item]) -> None:
    """Put the `window` tests at even steps from WINDOWS_FROM to WINDOWS_TO of the others,
    the longest first, and the other `long` ones from LONG_FROM to LONG_TO."""
    windows = sorted(filter(window_minutes, items), key=window_minutes, reverse=True)
    longs = [i for i in items if i.get_closest_marker("long") and not window_minutes(i)]
    items[:] = spread(items, longs, LONG_FROM, LONG_TO)
    items[:] = spread(items, windows, WINDOWS_FROM, WINDOWS_TO)


def spread(
    items: list[pytest.Item], chosen: list[pytest.Item], start: float, end: float
) -> list[pytest.Item]:
    """`items` with `chosen` (in their order) at even steps from `start` to `end` of the rest."""
    picked = set(chosen)
    rest = [item for item in items if item not in picked]
    if not chosen or not rest:
        return items
    step = (end - start) / max(1, len(chosen) - 1)
    before: dict[int, list[pytest.Item]] = {}  # a few tests collected: several at one place
    for i, item in enumerate(chosen):
        before.setdefault(int(len(rest) * (start + step * i)), []).append(item)
    return [w for i, item in enumerate(rest) for w in (*before.get(i, ()), item)]


@pytest.fixture(scope="session", autouse=True)
def _run_folders(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The SGLang wheels are unzipped once per run, not once per xdist worker: in the run's
    temporary folder (each worker's is a folder in it), which pytest removes with old runs.
    Recorded Ansible commands find their test's folder in the worker's."""
    base = tmp_path_factory.getbasetemp()
    sglang_wheel.UNZIP_ROOT = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    ansible_tools.base_temp = base  # where a recorded Ansible command's test folder is


@pytest.fixture(scope="session")
def lab() -> Iterator[SSHLab]:
    """Start one real sshd per test host for the whole session."""
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        pytest.fail(
            "the sshd test hosts need root and openssh-server: run ./scripts/test"
            " (or skip them: pytest -m 'not lab')"
        )
    base = Path(tempfile.mkdtemp(prefix="deployctl-hosts-", dir="/tmp"))
    lab = start_lab(base, HOST_NAMES)
    try:
        yield lab
    finally:
        stop_lab(lab)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Start Playwright and Debian's headless chromium once for the whole session."""
    lack = missing_browser()
    if lack:
        pytest.fail(f"{lack}: run ./scripts/test (or skip them: pytest -m 'not browser')")
    with running_browser() as started:
        yield started


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page in a context of its own (no cookies or storage of another test), 1440x900."""
    context = browser.new_context(viewport=VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def hosts(lab: SSHLab) -> SSHLab:
    """The lab with every host reset to a clean state for this test."""
    for host in lab.hosts.values():
        host.reset()
    return lab


@pytest.fixture(scope="session")
def slurm(lab: SSHLab) -> Iterator[SlurmCluster]:
    """Start one real Slurm cluster (two nodes, the lab hosts its login nodes) for the session."""
    if not Path("/usr/sbin/slurmctld").exists():
        pytest.fail("the Slurm tests need slurm-wlm: run ./scripts/test (or pytest -m 'not lab')")
    cluster = start_cluster(lab.slurm_base)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture
def slurm_lab(hosts: SSHLab, slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with no job of an earlier test left; after the test, nothing left running."""
    slurm.cancel_all()
    yield slurm
    left = slurm.cancel_all()
    assert not left, f"the test left Slurm jobs or their processes running: {left}"


@pytest.fixture
def fresh_boot_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's `time.monotonic()` starts near zero, as on a machine booted just now."""
    from tests.fresh_boot import booted_just_now

    monkeypatch.setattr("time.monotonic", booted_just_now())


@pytest.fixture
def client_home(tmp_path: Path) -> Path:
    """An empty HOME for the CLI, so the operator's own ~/.ssh never leaks into a test."""
    home = tmp_path / "client-home"
    home.mkdir()
    return home


class CLI:
    """Run `python -m deployctl` as a user would, from a working folder. With `forked`, a run
    is forked from a process that imported deployctl once (tests/cli_server.py), as the same
    command line would run in a fresh process."""

    def __init__(self, cwd: Path, home: Path, *, forked: bool = False) -> None:
        self.cwd = cwd
        self.home = home
        self.forked = forked

    def env(self, **extra: str) -> dict[str, str]:
        """The environment the CLI runs in: ours without deployctl's or ssh-agent's settings,
        with the test's HOME."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_AUTH"))}
        # The run's own PYTHONPATH stays after the repository (tests/fresh_boot.py's clock).
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env.update(HOME=str(self.home), PYTHONPATH=path, COLUMNS="200", **extra)
        return env

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start the CLI without waiting, its stdout and stderr piped as text."""
        return CheckedPopen(
            [sys.executable, "-m", "deployctl", *args],
            cwd=self.cwd,
            env=self.env(**(env or {})),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def __call__(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "deployctl", *args]
        result: subprocess.CompletedProcess[str]
        if self.forked:
            result = cli_server.run(
                argv, cwd=str(self.cwd), env=self.env(**(env or {})), timeout=timeout
            )
        else:
            result = subprocess.run(
                argv,
                cwd=self.cwd,
                env=self.env(**(env or {})),
                text=True,
                capture_output=True,
                timeout=timeout,
            )
        check_output(args, result.returncode, result.stdout)  # the --json contract
        return result


@pytest.fixture
def cli(request: pytest.FixtureRequest, tmp_path: Path, client_home: Path) -> CLI:
    work = tmp_path / "work"
    work.mkdir()
    # Runs are forked (tests/cli_server.py: what a fresh `python -m deployctl` would do, for
    # ~0.25 s of CPU less each, a quarter of a lab test's); a `fresh_cli` test starts a real
    # Python per run, so the whole path of a user's command over SSH stays checked too.
    return CLI(work, client_home, forked=request.node.get_closest_marker("fresh_cli") is None)


@pytest.fixture(scope="session")
def sglang_template(lab: SSHLab) -> Path:
    """A venv with the real SGLang 0.5.23 wheel (no deps) and msgspec, built once."""
    from tests.sglang_wheel import build_template

    return build_template(lab.base)


class FullDisk:
    """A tiny tmpfs of our own: `fill()` takes every free byte, so the next write fails."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self) -> None:
        fd = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # ENOSPC: full
            pass
        finally:
            os.close(fd)

    def names(self) -> set[str]:
        """What is in it, the filler aside: a failed write must leave nothing there."""
        return {p.name for p in self.path.iterdir()} - {"filler"}


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[FullDisk]:
    """A 64 KiB tmpfs mounted for this test (we are root), unmounted afterwards."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        yield FullDisk(folder)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
