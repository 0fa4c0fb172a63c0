"""Judging a patch set from an installation's files, without hosts: each file's shipped
hashes, the host agent's hunk search (on the real SGLang wheels' files), the record second;
the reverse diff that takes a set out; hashes.json kept up to date."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from deployctl.ops.patch import (
    FileState,
    PatchFacts,
    PatchState,
    patched_copies,
    set_state,
    unpatched_copies,
)
from deployctl.ops.patch_hashes import hashes_files, release_files
from deployctl.patchset import PatchSet, Variant, file_hashes, load_patch_set, load_patch_sets
from deployctl.project import SHIPPED_DATA
from deployctl.remote.patches import hunk_states
from tests.sglang_wheel import WHEELS, sglang_wheel

SHIPPED = load_patch_sets([SHIPPED_DATA / "patches"])
CASES = [(n, v) for n, s in SHIPPED.items() for v in s.variants]
SITE = "/venv/lib/python3.11/site-packages"


def found(variant: Variant, files: dict[str, bytes | None]) -> dict[str, list[str]]:
    """What the host agent says of each hunk, for files of these contents."""
    marks = variant.marks()
    return {path: hunk_states(files.get(path), marks[path]) for path in variant.files}


def sha(data: bytes | None) -> str | None:
    return file_hashes({}, {"x": data})["x"].patched


def facts_of(
    patch_set: PatchSet,
    files: dict[str, bytes | None],
    record: dict[str, Any] | None = None,
    version: str = "0.5.23",
) -> PatchFacts:
    """A host's facts with these file contents (and this state_dir's record, if any)."""
    variant = patch_set.variants[version]
    records = {patch_set.name: record} if record is not None else {}
    return PatchFacts(
        version, SITE, None, records,  # type: ignore[arg-type]
        {p: sha(d) for p, d in files.items()}, {patch_set.name: found(variant, files)},
    )  # fmt: skip


def record_of(patch_set: PatchSet, files: dict[str, bytes | None], **more: Any) -> dict[str, Any]:
    """The record an apply by deployctl left, the files as `files`."""
    return {
        "set": patch_set.name, "version": patch_set.version, "hash": patch_set.content_hash,
        "site": SITE, "sglang_version": "0.5.23", "applied_at": "2026-01-01T00:00:00+0000",
        "files": {p: {"original_sha256": None, "patched_sha256": sha(d)} for p, d in files.items()},
        **more,
    }  # fmt: skip


@pytest.fixture(scope="module")
def release() -> dict[tuple[str, str], tuple[dict[str, bytes | None], dict[str, bytes | None]]]:
    """(set, SGLang version) → its files as the wheel ships them, and with the set applied."""
    found: dict[tuple[str, str], Any] = {}
    for name, version in CASES:
        variant = SHIPPED[name].variants[version]
        pristine = release_files(sglang_wheel(version), variant.files)
        found[(name, version)] = (pristine, patched_copies(variant, pristine, variant.files))
    return found


@pytest.mark.parametrize(("name", "version"), CASES)
def test_the_host_finds_every_hunk_of_each_shipped_variant_in_the_real_files(
    release: dict, name: str, version: str
) -> None:
    variant = SHIPPED[name].variants[version]
    pristine, patched = release[(name, version)]
    assert {s for states in found(variant, pristine).values() for s in states} == {"missing"}
    assert {s for states in found(variant, patched).values() for s in states} == {"applied"}
    # The reverse diff of the hunks found gives back the wheel's own bytes.
    assert unpatched_copies(variant, patched, variant.files, found(variant, patched)) == pristine


def test_shipped_hashes_are_what_the_diffs_and_the_wheels_give() -> None:
    for version in sorted({v for _, v in CASES}):
        sglang_wheel(version)  # downloaded once, as scripts/test does
    stale = [f for f in hashes_files(list(SHIPPED.values()), WHEELS) if f.stale]
    assert not stale, "".join(f.diff() for f in stale) + "run scripts/patch-hashes --write"
    for name, version in CASES:
        assert SHIPPED[name].variants[version].hashes, (name, version)


def test_hashes_made_for_other_diffs_are_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "sm120-support"
    shutil.copytree(SHIPPED_DATA / "patches" / "sm120-support", folder)
    diff = folder / "0.5.23" / "sm120-support.diff"
    diff.write_text(diff.read_text().replace("SM90, SM10X or SM12X", "SM90/SM10X/SM12X"))
    edited = load_patch_set(folder)
    assert edited.variants["0.5.23"].hashes is None  # judged hunk by hunk instead
    assert edited.variants["0.5.22"].hashes == SHIPPED["sm120-support"].variants["0.5.22"].hashes


def test_a_malformed_hashes_file_is_one_line_naming_it(tmp_path: Path) -> None:
    from deployctl.errors import PatchError

    folder = tmp_path / "sm120-support"
    shutil.copytree(SHIPPED_DATA / "patches" / "sm120-support", folder)
    (folder / "hashes.json").write_text('{"variants": {"0.5.23": {"files": {}}}}')
    with pytest.raises(PatchError) as info:
        load_patch_set(folder)
    assert "hashes.json: not a hashes file" in info.value.message
    assert "scripts/patch-hashes --write" in (info.value.hint or "")


# ---- the judgement: files first, the record second ----------------------------------------


def test_applied_with_no_record_here_says_so(release: dict) -> None:
    spec = SHIPPED["spec-disable"]
    _, patched = release[("spec-disable", "0.5.23")]
    judged = set_state(facts_of(spec, patched), spec)
    assert (judged.state, judged.version, judged.detail) == ("applied", "1.2.0", "no record here")
    assert judged.recorded is False and judged.good
    assert set(judged.files.values()) == {FileState.APPLIED}
    recorded = set_state(facts_of(spec, patched, record_of(spec, patched)), spec)
    assert (recorded.state, recorded.detail, recorded.recorded) == ("applied", "", True)


def test_a_set_found_without_its_hashes_is_judged_hunk_by_hunk(release: dict) -> None:
    spec = SHIPPED["spec-disable"]
    bare = dataclasses.replace(spec.variants["0.5.23"], hashes=None)
    unhashed = dataclasses.replace(spec, variants={"0.5.23": bare})
    pristine, patched = release[("spec-disable", "0.5.23")]
    assert set_state(facts_of(unhashed, patched), unhashed).state == "applied"
    assert set_state(facts_of(unhashed, pristine), unhashed).state == "missing"


def test_one_file_reverted_by_hand_is_partly_applied_naming_it(release: dict) -> None:
    sm120 = SHIPPED["sm120-support"]
    pristine, patched = release[("sm120-support", "0.5.23")]
    add_norm = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
    files = {**patched, add_norm: pristine[add_norm]}
    judged = set_state(facts_of(sm120, files), sm120)
    assert judged.state == PatchState.PARTLY == "partly applied" and not judged.good
    assert judged.detail == f"lacks it: {add_norm}"
    assert judged.files[add_norm] is FileState.MISSING
    # One hunk of a file taken out: the file is partly applied, with how much it has.
    fusion = "sglang/srt/layers/flashinfer_comm_fusion.py"
    variant = sm120.variants["0.5.23"]
    first = variant.hunks(fusion)[0]
    text = patched[fusion].decode().replace("\n".join(first.after), "\n".join(first.before), 1)
    judged = set_state(facts_of(sm120, {**patched, fusion: text.encode()}), sm120)
    count = len(variant.hunks(fusion))
    assert judged.detail == f"lacks it: {fusion} ({count - 1} of {count} hunks applied)"


def test_a_record_of_files_that_lack_the_set_is_missing_with_why(release: dict) -> None:
    spec = SHIPPED["spec-disable"]
    pristine, patched = release[("spec-disable", "0.5.23")]
    judged = set_state(facts_of(spec, pristine, record_of(spec, patched)), spec)
    assert judged.state == "missing" and judged.recorded
    assert judged.detail.startswith("recorded here as 1.2.0, but the files lack it")


def test_an_edited_line_of_the_set_is_drifted_naming_the_file(release: dict) -> None:
    spec = SHIPPED["spec-disable"]
    _, patched = release[("spec-disable", "0.5.23")]
    field = "sglang/srt/arg_groups/fields/spec.py"
    edited = patched[field].replace(b"speculative_disable_batch_threshold", b"spec_threshold")
    files = {**patched, field: edited}
    judged = set_state(facts_of(spec, files), spec)
    assert judged.state == "drifted" and field in judged.detail
    assert judged.files[field] is FileState.DIFFERS
    recorded = set_state(facts_of(spec, files, record_of(spec, patched)), spec)
    assert recorded.state == "drifted" and recorded.detail == f"changed since apply: {field}"


def test_an_older_version_recorded_here_with_its_files_as_left_is_outdated(release: dict) -> None:
    spec = SHIPPED["spec-disable"]
    _, patched = release[("spec-disable", "0.5.23")]
    field = "sglang/srt/arg_groups/fields/spec.py"
    older = {**patched, field: patched[field].replace(b"threshold", b"limit")}
    record = record_of(spec, older, version="1.1.0", hash="older")
    judged = set_state(facts_of(spec, older, record), spec)
    assert (judged.state, judged.version, judged.detail) == (
        "outdated", "1.1.0", "1.1.0 applied, 1.2.0 available",
    )  # fmt: skip


def test_an_unsupported_release_is_told_before_the_files(release: dict) -> None:
    spec = SHIPPED["spec-disable"]
    _, patched = release[("spec-disable", "0.5.23")]
    facts = dataclasses.replace(facts_of(spec, patched), sglang_version="0.5.21")
    assert set_state(facts, spec).state == "unsupported"


# ---- two sets in one file ------------------------------------------------------------------


def two_sets(tmp_path: Path, original: str) -> tuple[PatchSet, PatchSet]:
    """Sets `a` and `b`, each changing its own lines of one file."""
    import difflib

    def write(name: str, old: str, new: str) -> PatchSet:
        folder = tmp_path / name
        (folder / "0.5.23").mkdir(parents=True)
        changed = original.replace(old, new, 1)
        diff = difflib.unified_diff(
            original.splitlines(keepends=True), changed.splitlines(keepends=True),
            "a/sglang/x.py", "b/sglang/x.py",
        )  # fmt: skip
        (folder / "0.5.23" / f"{name}.diff").write_text("".join(diff))
        spec = {"name": name, "version": "1.0.0", "description": name,
                "variants": {"0.5.23": {"diffs": [f"0.5.23/{name}.diff"]}}}  # fmt: skip
        (folder / "patch.yml").write_text(json.dumps(spec))
        return load_patch_set(folder)

    return write("a", "line 5\n", "line 5\nA\n"), write("b", "line 40\n", "line 40\nB\n")


def test_two_sets_in_one_file_are_each_judged_and_taken_out_alone(tmp_path: Path) -> None:
    original = "".join(f"line {n}\n" for n in range(60)).encode()
    a, b = two_sets(tmp_path, original.decode())
    path = "sglang/x.py"
    both = patched_copies(b.variants["0.5.23"], patched_copies(a.variants["0.5.23"], {path: original}, [path]), [path])  # fmt: skip
    assert both[path] is not None and b"A\n" in both[path] and b"B\n" in both[path]
    for one in (a, b):
        assert set_state(facts_of(one, both), one).state == "applied"
    # a taken out by its reverse diff: b's line stays, and b is still applied.
    variant = a.variants["0.5.23"]
    without_a = unpatched_copies(variant, both, [path], found(variant, both))
    assert without_a == patched_copies(b.variants["0.5.23"], {path: original}, [path])
    assert set_state(facts_of(a, without_a), a).state == "missing"
    assert set_state(facts_of(b, without_a), b).state == "applied"


def test_a_set_applied_by_hand_on_one_node_and_recorded_on_another_is_no_skew(
    release: dict,
) -> None:
    """The nodes of a group are compared by what their files are, as the audit judges."""
    from deployctl.ops.skew import skew_problem, software_of

    spec = SHIPPED["spec-disable"]
    pristine, patched = release[("spec-disable", "0.5.23")]
    recorded = software_of(facts_of(spec, patched, record_of(spec, patched)), [spec])
    by_hand = software_of(facts_of(spec, patched), [spec])
    assert skew_problem([("a", recorded), ("b", by_hand)]) is None, (recorded, by_hand)
    # A record over files that lack the set is no set: that node is the odd one.
    gone = software_of(facts_of(spec, pristine, record_of(spec, patched)), [spec])
    assert skew_problem([("a", recorded), ("b", gone)]) == (
        "a runs SGLang 0.5.23 with spec-disable 1.2.0; b runs SGLang 0.5.23 with no patch set"
    )
