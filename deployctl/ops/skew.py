"""What SGLang and patch sets each server of a group runs: the nodes of one multi-node
server, and the prefills and decodes behind one PD router, must run the same. A skewed group
starts, then fails at NCCL init or at its first KV transfer, far from the cause; launch
refuses it before anything starts, from the facts its preflight already read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deployctl.ops.patch import PatchFacts


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


def software_of(facts: PatchFacts) -> Software | None:
    """What a host's preflight read of its SGLang; None when SGLang could not be read there
    (its own check says why)."""
    if facts.error or not facts.sglang_version:
        return None
    patches = tuple(
        AppliedPatch(name, record["version"], record["hash"], bool(facts.drifted_files(name)))
        for name, record in sorted(facts.records.items())
    )
    return Software(facts.sglang_version, patches)


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
