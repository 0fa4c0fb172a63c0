"""The shipped patch sets' variants checked on the real SGLang wheels, without hosts.

For each shipped set and each SGLang version it has a variant for: the diffs apply to the
pristine wheel's files with GNU patch as deployctl runs it (fuzz 0) and at their stated line
numbers, every patched Python file compiles, and every verify script passes on the patched
tree and fails on the pristine one. The scripts run as the host agent runs them
(remote.patches.run_verify_scripts: a copy in a temporary folder, DEPLOYCTL_SITE=<site-packages>).
"""

from __future__ import annotations

import json
import os
import py_compile
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from deployctl.ops.patch import PATCH_ARGS
from deployctl.patchset import PatchSet, Variant, load_patch_sets
from deployctl.project import SHIPPED_DATA
from deployctl.remote.patches import run_verify_scripts
from tests.sglang_wheel import extract_site

SHIPPED = load_patch_sets([SHIPPED_DATA / "patches"])
SETS = ("spec-disable", "sm120-support")
VERSIONS = ("0.5.22", "0.5.23")
# Older releases a set was ported to by hand: their layout differs (0.5.17 has one ServerArgs
# dataclass, no arg_groups/fields/), so their files and verify scripts are their own.
HAND_PORTED = {"spec-disable": ("0.5.17",), "sm120-support": ()}
CASES = [(name, version) for name in SETS for version in (*HAND_PORTED[name], *VERSIONS)]
SCRIPTS = [
    (name, version, script.name)
    for name, version in CASES
    for script in SHIPPED[name].variant_for(version).verify
]

Site = Callable[..., Path]


def apply(site: Path, patch_set: PatchSet, version: str) -> None:
    """Apply a variant's diffs as deployctl does; no hunk may need an offset either."""
    for diff in patch_set.variant_for(version).diffs:
        done = subprocess.run(
            [*PATCH_ARGS, "-d", str(site), "-i", str(diff)],
            check=False,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{diff}: {done.stdout}{done.stderr}"
        assert not re.search(r"offset|fuzz|FAILED", done.stdout), f"{diff}: {done.stdout}"


def members(variant: Variant) -> dict[str, bytes]:
    """The verify scripts as the apply payload carries them to the host agent."""
    return {f"verify/{path.name}": path.read_bytes() for path in variant.verify}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The pristine site-packages of an SGLang version, unzipped once per module."""
    sites: dict[str, Path] = {}

    def site(version: str) -> Path:
        if version not in sites:
            sites[version] = extract_site(version, tmp_path_factory.mktemp(f"pristine-{version}"))
        return sites[version]

    return site


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """A fresh unzip of an SGLang version with the named sets applied in order."""
    sites: dict[tuple[str, tuple[str, ...]], Path] = {}

    def site(version: str, *names: str) -> Path:
        key = (version, names)
        if key not in sites:
            target = extract_site(version, tmp_path_factory.mktemp(f"patched-{version}"))
            for name in names:
                apply(target, SHIPPED[name], version)
            sites[key] = target
        return sites[key]

    return site


@pytest.mark.parametrize("name", SETS)
def test_each_set_has_a_variant_for_each_version(name: str) -> None:
    patch_set = SHIPPED[name]
    assert sorted(patch_set.variants) == [*HAND_PORTED[name], *VERSIONS]
    newest = patch_set.variant_for(VERSIONS[-1])
    for version in VERSIONS:
        variant = patch_set.variant_for(version)
        assert variant.files == newest.files
        assert variant.verify == newest.verify
        assert [d.relative_to(patch_set.folder).as_posix() for d in variant.diffs] == [
            f"{version}/{name}.diff"
        ]


def changed_lines(diff: Path) -> dict[str, list[str]]:
    """Each file's removed and added lines, in order, without context or line numbers."""
    changes: dict[str, list[str]] = {}
    current = ""
    for line in diff.read_text().splitlines():
        if line.startswith("+++ "):
            current = line[4:]
            changes[current] = []
        elif line.startswith(("--- ", "diff --git ", "new file mode ")):
            continue
        elif line.startswith(("+", "-")):
            changes[current].append(line)
    return changes


@pytest.mark.parametrize("name", SETS)
def test_older_variants_make_the_same_change(name: str) -> None:
    """A port to an older release moves context only: it adds and removes the same lines."""
    patch_set = SHIPPED[name]
    [newest] = patch_set.variant_for(VERSIONS[-1]).diffs
    for version in VERSIONS[:-1]:
        [diff] = patch_set.variant_for(version).diffs
        assert changed_lines(diff) == changed_lines(newest), version


@pytest.mark.parametrize(("name", "version"), CASES)
@pytest.mark.heavy
def test_variant_applies_compiles_and_passes_its_verify_scripts(
    name: str, version: str, pristine: Site, patched: Site
) -> None:
    variant = SHIPPED[name].variant_for(version)
    site = patched(version, name)
    for relpath in variant.files:
        before = pristine(version) / relpath
        assert (site / relpath).exists()
        assert not before.exists() or before.read_bytes() != (site / relpath).read_bytes()
        if relpath.endswith(".py"):
            py_compile.compile(str(site / relpath), doraise=True)
    assert variant.verify
    run_verify_scripts(str(site), [p.name for p in variant.verify], members(variant))


@pytest.mark.parametrize(("name", "version", "script"), SCRIPTS)
@pytest.mark.heavy
def test_verify_script_fails_on_the_pristine_wheel(
    name: str, version: str, script: str, pristine: Site
) -> None:
    variant = SHIPPED[name].variant_for(version)
    with pytest.raises(RuntimeError, match=rf"^verify {re.escape(script)} failed: \S"):
        run_verify_scripts(str(pristine(version)), [script], members(variant))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.heavy
def test_the_sets_apply_together(version: str, patched: Site) -> None:
    site = patched(version, *SETS)
    for name in SETS:
        variant = SHIPPED[name].variant_for(version)
        for relpath in variant.files:
            py_compile.compile(str(site / relpath), doraise=True)
        run_verify_scripts(str(site), [p.name for p in variant.verify], members(variant))


def verify_probe(site: Path, script: Path, code: str) -> dict:
    """Run code against a verify script imported as a module, in a fresh interpreter
    (each script stubs the `sglang` package for one site); the code prints JSON."""
    done = subprocess.run(
        [sys.executable, "-c", f"import json, sys\nsys.path.insert(0, {str(script.parent)!r})\n{code}"],
        env={**os.environ, "DEPLOYCTL_SITE": str(site), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


PREFLIGHT = """
import sm120_gates as g
site = __import__("os").environ["DEPLOYCTL_SITE"]
fusion = g.Source(site, g.FUSION)
sm120 = g.platform_for(g.Source(site, g.COMMON), (12, 0))
ok, driver, sizes = g.preflight(fusion, sm120, {backend!r})
print(json.dumps({{"ok": ok, "calls": driver.calls, "sizes": sizes}}))
"""


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.heavy
def test_sm120_trtllm_preflight_needs_no_multicast(
    version: str, pristine: Site, patched: Site
) -> None:
    """On a PCIe SM120 part (no multicast), upstream's preflight queries multicast, fails
    and turns fusion off; the patched one probes the trtllm workspace as FlashInfer
    allocates it and proceeds. Torch-free, on the real source."""
    script = SHIPPED["sm120-support"].folder / "verify" / "sm120_gates.py"
    before = verify_probe(pristine(version), script, PREFLIGHT.format(backend=None))
    assert before["ok"] is False and "cuMulticastGetGranularity" in before["calls"]
    after = verify_probe(
        patched(version, "sm120-support"), script, PREFLIGHT.format(backend="trtllm")
    )
    assert after["ok"] is True and "cuMulticastGetGranularity" not in after["calls"]
    assert after["calls"].count("cuMemCreate") == 3 == after["calls"].count("cuMemRelease")
    assert all(size % (2 << 20) == 0 for size in after["sizes"])


LONG_RUN = """
import threshold_decision as t
site = __import__("os").environ["DEPLOYCTL_SITE"]
t._stub_packages(site)
from sglang.srt.speculative import spec_disable_policy as policy_mod
print(json.dumps(t.check_long_run(site, policy_mod)))
"""

UPSTREAM_RUN = """
import threshold_decision as t
site = __import__("os").environ["DEPLOYCTL_SITE"]
t._stub_packages(site)

class EveryStep:
    # A policy that switches on every batch crossing N, as 1.1.0's did.
    candidate_steps = [0, t.STEPS]
    def set_cuda_graph_bs(self, bs): pass
    def cuda_graph_bs_for_step(self, step): return None
    def get_steps_for_batch(self, bs): return t.STEPS if bs <= t.N else 0
    def on_verify_complete(self, drafts, batch_size): return None

batches = [t.N + 1 if i % 2 == 0 else t.N for i in range(t.LONG_RUN)]
worker, trace, ctx = t.drive(site, EveryStep(), batches, t.FakeClock())
entries = [s for s, _ in ctx.overrides_log() if s == "adaptive_spec.restore"]
print(json.dumps({"switch_log_entries": len(entries), "log_lines": len(worker.log_lines)}))
"""


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.heavy
def test_spec_disable_stays_bounded_over_ten_thousand_steps(
    version: str, pristine: Site, patched: Site
) -> None:
    """The real AdaptiveController, apply_runtime_state and RuntimeContext over 10,000
    decode steps around N: upstream's switch records and log lines grow with every
    switch; with the set, both stay bounded and the hysteresis rule holds."""
    script = SHIPPED["spec-disable"].folder / "verify" / "threshold_decision.py"
    upstream = verify_probe(pristine(version), script, UPSTREAM_RUN)
    assert upstream == {"switch_log_entries": 10_000, "log_lines": 10_000}
    figures = verify_probe(patched(version, "spec-disable"), script, LONG_RUN)
    assert figures["steps"] == 10_000 and figures["switches"] == 2 * figures["bursts"]
    assert figures["switch_log_entries"] == 1 and figures["log_lines"] <= 8
    assert figures["memory_growth_bytes"] < 64 * 1024
