"""The typed `--json` documents: one TypedDict per document and per shared shape.

documents.py builds them (mypy checks every key and value), and `python -m tools.contract
--write` generates their schemas from these declarations (tools/typed_schema.py): a key's
description is its `Annotated[..., "…"]` string, a mapping there adds keywords (`minimum`…),
an object's description is its docstring, an enum's values come from the enum.

A per-host document's entries are generic: `Entry[F]` is what every outcome says (ok, error,
code, hint) and, unless it failed, the fields `F` its builder returns; `HostEntry[F]` a host's
(with one `DeploymentEntry[F]` per deployment under `deployments`). tools/contract.py names
each parameterization (`statusHost`, …) and generates its wrapper from the fields' type.

Not every document is typed yet (issue 53, item 1): tools/contract.py still declares the
others by hand. No `from __future__ import annotations` here: Python 3.11 reads a
`NotRequired` key of a string annotation as required.
"""

from deployctl.present.shapes.bench import Suggestion, SuggestionLevel
from deployctl.present.shapes.common import (
    DeploymentEntry,
    Entry,
    Failure,
    HostEntry,
    Job,
    PerHost,
    Registration,
)
from deployctl.present.shapes.fleet import (
    Checked,
    CheckedFields,
    Flags,
    Fleet,
    Gpu,
    GpuProcess,
    Gpus,
    GpusFields,
    Graph,
    GroupEntry,
    HostListed,
    Inventory,
    LocalCrashes,
    Rendered,
    RenderedFields,
    ScanFields,
)
from deployctl.present.shapes.patches import (
    Action,
    Audit,
    AuditFields,
    PatchActions,
    PatchesFields,
    PatchList,
    PatchSetEntry,
    SetState,
)
from deployctl.present.shapes.rollout import (
    PatchDone,
    Rollout,
    RolloutUnit,
    UnitPlanFields,
    UnitResultFields,
)
from deployctl.present.shapes.runs import (
    Launch,
    LaunchFields,
    LaunchRun,
    ListedWorker,
    Metrics,
    MultiNodeUnit,
    NodeStatus,
    NothingRestarted,
    Preflight,
    RouterState,
    Status,
    StatusFields,
    Stop,
    StopFields,
)

__all__ = [
    "Action",
    "Audit",
    "AuditFields",
    "Checked",
    "CheckedFields",
    "DeploymentEntry",
    "Entry",
    "Failure",
    "Flags",
    "Fleet",
    "Gpu",
    "GpuProcess",
    "Gpus",
    "GpusFields",
    "Graph",
    "GroupEntry",
    "HostEntry",
    "HostListed",
    "Inventory",
    "Job",
    "Launch",
    "LaunchFields",
    "LaunchRun",
    "ListedWorker",
    "LocalCrashes",
    "Metrics",
    "MultiNodeUnit",
    "NodeStatus",
    "NothingRestarted",
    "PatchActions",
    "PatchDone",
    "PatchList",
    "PatchSetEntry",
    "PatchesFields",
    "PerHost",
    "Preflight",
    "Registration",
    "Rendered",
    "RenderedFields",
    "Rollout",
    "RolloutUnit",
    "RouterState",
    "ScanFields",
    "SetState",
    "Status",
    "StatusFields",
    "Stop",
    "StopFields",
    "Suggestion",
    "SuggestionLevel",
    "UnitPlanFields",
    "UnitResultFields",
]
