"""The nodes of one multi-node server, and the prefills and decodes behind one PD router,
run one SGLang version with the same patch sets: the comparison and the groups are pure
(here); the lab tests in test_multinode.py and test_pd.py read real installations."""

from __future__ import annotations

from typing import Any

from deployctl.ops.patch import PatchFacts
from deployctl.ops.preflight import Preflight, check_software, software_groups
from deployctl.ops.skew import AppliedPatch, Software, skew_problem, software_of
from deployctl.remote.patch_types import PatchRecord
from tests.test_disaggregation import fleet, pair
from tests.test_launch import group_plans


def record(version: str, content: str = "c" * 64, patched: str = "p1") -> PatchRecord:
    return {
        "set": "spec-disable", "version": version, "hash": content, "variant": "0.5.23",
        "sglang_version": "0.5.23", "site": "/site", "applied_at": "", "applied_by": "",
        "backup_dir": "", "files": {"a.py": {"original_sha256": "o", "patched_sha256": patched}},
    }  # fmt: skip


def facts(version: str | None, records: dict[str, PatchRecord], a_py: str = "p1") -> PatchFacts:
    return PatchFacts(version, "/site", None, records, {"a.py": a_py})


def test_a_host_runs_its_sglang_with_the_sets_recorded_on_it() -> None:
    assert software_of(facts("0.5.23", {})) == Software("0.5.23", ())
    assert software_of(facts(None, {})) is None  # not read: its own check says why
    found = software_of(facts("0.5.23", {"spec-disable": record("1.2")}, a_py="edited"))
    assert found == Software("0.5.23", (AppliedPatch("spec-disable", "1.2", "c" * 64, True),))
    assert found.describe() == "SGLang 0.5.23 with spec-disable 1.2 (changed since apply)"


def test_members_that_differ_are_each_named_with_what_they_run() -> None:
    plain = Software("0.5.23", ())
    patched = Software("0.5.23", (AppliedPatch("spec-disable", "1.2", "c" * 64, False),))
    older = Software("0.5.22", ())
    assert skew_problem([("a", plain), ("b", plain), ("c", None)]) is None
    assert skew_problem([("a", plain), ("b", older), ("c", plain)]) == (
        "a and c run SGLang 0.5.23 with no patch set; b runs SGLang 0.5.22 with no patch set"
    )
    assert skew_problem([("a", patched), ("b", plain)]) == (
        "a runs SGLang 0.5.23 with spec-disable 1.2; b runs SGLang 0.5.23 with no patch set"
    )
    # One set version of two contents (changed without a version bump): the contents differ.
    other = Software("0.5.23", (AppliedPatch("spec-disable", "1.2", "d" * 64, False),))
    assert skew_problem([("a", patched), ("b", other)]) == (
        f"a runs SGLang 0.5.23 with spec-disable 1.2 (content {'c' * 12}); "
        f"b runs SGLang 0.5.23 with spec-disable 1.2 (content {'d' * 12})"
    )


def preflights_of(plans: Any, software: dict[str, Software | None]) -> dict[str, Preflight]:
    return {p.host.label: Preflight(p, software=software.get(p.host.label)) for p in plans}


def test_a_skewed_group_is_refused_once_on_its_first_member() -> None:
    nodes = group_plans({"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "10.0.0.2"}})
    assert [(name, [p.host.label for p in members]) for name, members in software_groups(
        nodes, lambda pattern: []
    )] == [("the nodes of kimi (n1, n2)", ["n1/kimi", "n2/kimi"])]  # fmt: skip
    found = preflights_of(
        nodes, {"n1/kimi": Software("0.5.23", ()), "n2/kimi": Software("0.5.22", ())}
    )
    check_software(nodes, lambda pattern: [], found)
    assert found["n1/kimi"].problems == [
        "the nodes of kimi (n1, n2) would run different SGLang or patch sets: n1/kimi runs "
        "SGLang 0.5.23 with no patch set; n2/kimi runs SGLang 0.5.22 with no patch set"
    ]
    assert "deployctl patch audit" in found["n1/kimi"].hints[0]
    assert found["n2/kimi"].problems == []


def test_the_prefills_and_decodes_behind_one_pd_router_are_one_group() -> None:
    inv, plans = fleet(pair(), {"d1": {"role": "decode", "port": 30003, "router": "edge/router"}})
    groups = software_groups(plans, inv.select)
    assert [(name, [p.host.label for p in members]) for name, members in groups] == [
        ("the servers behind router edge/router", ["gpu1/p0", "gpu1/d0", "gpu2/d1"])
    ]
    same = Software("0.5.23", ())
    found = preflights_of(plans, {"gpu1/p0": same, "gpu1/d0": same, "gpu2/d1": same})
    check_software(plans, inv.select, found)
    assert all(p.problems == [] for p in found.values())
    found = preflights_of(
        plans, {"gpu1/p0": same, "gpu1/d0": same, "gpu2/d1": Software("0.5.22", ())}
    )
    check_software(plans, inv.select, found)
    assert found["gpu1/p0"].problems == [
        "the servers behind router edge/router would run different SGLang or patch sets: "
        "gpu1/p0 and gpu1/d0 run SGLang 0.5.23 with no patch set; gpu2/d1 runs SGLang 0.5.22 "
        "with no patch set"
    ]
