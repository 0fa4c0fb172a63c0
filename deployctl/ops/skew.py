"""What SGLang and patch sets each server of a group runs: the nodes of one multi-node
server, and the prefills and decodes behind one PD router, must run the same. A skewed group
starts, then fails at NCCL init or at its first KV transfer, far from the cause; launch
refuses it before anything starts, from the facts its preflight already read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deployctl.ops.patch import PatchFacts, PatchState, set_state
from deployctl.patchset import PatchSet


@dataclass(frozen=True)
class AppliedPatch:
    name: str
    version: str
    content: str  # the set's content hash, as recorded at apply
    changed: bool  # its files changed since apply

    def describe(self, with_content: bool) -> str:
        text = f"{self.name} {self.version}"
        if with_content:
            text += f" (content {self.content[:12]})"
        return text + (" (changed since apply)" if self.changed else "")


@dataclass(frozen=True)
class Software:
    """One server's SGLang version and the patch sets applied to that installation."""

    sglang: str
    patches: tuple[AppliedPatch, ...]  # by name

    def describe(self, with_content: bool = False) -> str:
        """`SGLang 0.5.23 with spec-disable 1.2`; `SGLang 0.5.22 with no patch set`."""
        sets = " and ".join(p.describe(with_content) for p in self.patches) or "no patch set"
        return f"SGLang {self.sglang} with {sets}"


def software_of(facts: PatchFacts, judged: Sequence[PatchSet] = ()) -> Software | None:
    """What a host's preflight read of its SGLang; None when SGLang could not be read there
    (its own check says why). The sets in `judged` are read from the files, as the audit
    reads them (applied by hand or under another state_dir is applied); others from this
    state_dir's records."""
    if facts.error or not facts.sglang_version:
        return None
    patches = {
        name: AppliedPatch(name, record["version"], record["hash"], bool(facts.drifted_files(name)))
        for name, record in facts.records.items()
    }
    for patch_set in judged:
        state = set_state(facts, patch_set).state
        if state is PatchState.APPLIED:
            changed = bool(facts.changed_by_others(patch_set.name))
            patches[patch_set.name] = AppliedPatch(
                patch_set.name, patch_set.version, patch_set.content_hash, changed
            )
        elif state is PatchState.MISSING:
            patches.pop(patch_set.name, None)
    return Software(facts.sglang_version, tuple(patches[n] for n in sorted(patches)))


def skew_problem(members: Sequence[tuple[str, Software | None]]) -> str | None:
    """Each distinct software of the members with who runs it (`alpha runs SGLang 0.5.23
    with no patch set; bravo runs SGLang 0.5.22 with no patch set`); None when they all run
    one (members whose SGLang was not read are left out)."""
    runs: dict[Software, list[str]] = {}
    for label, software in members:
        if software is not None:
            runs.setdefault(software, []).append(label)
    if len(runs) < 2:
        return None
    texts = [s.describe() for s in runs]
    # Two contents of one set version read the same: say which content each has.
    with_content = len(set(texts)) < len(texts)
    return "; ".join(
        f"{' and '.join(who)} {'runs' if len(who) == 1 else 'run'} {s.describe(with_content)}"
        for s, who in runs.items()
    )


SKEW_HINT = (
    "install one SGLang version and apply the same patch sets everywhere in the group "
    "(deployctl patch audit shows each host's), then launch again"
)
