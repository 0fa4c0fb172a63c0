"""The shapes every document shares: a failure of the whole command, a router's
registration, a Slurm job, and the per-host entries (`Entry`, `HostEntry`,
`DeploymentEntry`, `PerHost`).

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, Generic, Literal, NotRequired, TypedDict, TypeVar

F = TypeVar("F")


class Failure(TypedDict):
    """The command failed as a whole (a bad inventory, pattern or option): nothing was done on any host."""

    ok: Literal[False]
    error: str
    code: str
    hint: str | None


class Registration(TypedDict):
    """A worker added to its router or removed from it; `error` says why not."""

    worker: str
    router: str
    url: str
    action: Literal["add", "remove"]
    ok: bool
    error: str


class Job(TypedDict):
    """Where its launcher placed this run, as last seen (a Slurm job: squeue, else sacct, else its record)."""

    id: Annotated[str, "Its launcher's handle of it (a Slurm job's id)"]
    state: Annotated[
        str,
        "In its launcher's words; a Slurm job's state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, …; UNKNOWN when Slurm no longer knows it",
    ]
    reason: Annotated[
        str,
        "Why it waits (a pending Slurm job's Resources, Priority, BeginTime, …); empty otherwise",
    ]
    nodes: Annotated[list[str], "Its nodes, the head first"]
    head: Annotated[str, "Where the server answers (a Slurm job's head node's NodeAddr)"]
    time_left_s: Annotated[
        float | None, "Seconds to its time limit; null without one or when not running"
    ]
    exit_code: Annotated[str, "code:signal once it ended; empty before"]


class Entry(TypedDict, Generic[F]):
    # What every outcome says (a host's, a deployment's, a unit's); unless it failed (its
    # `error` null), the keys `F` requires too.
    ok: bool
    error: NotRequired[Annotated[str | None, "The failure in one line; null when it worked."]]
    code: NotRequired[
        Annotated[
            str | None,
            "The failure's stable code (see the README); null when it worked.",
            {"pattern": "^[a-z][a-z0-9_]*$"},
        ]
    ]
    hint: NotRequired[str]


class DeploymentEntry(Entry[F]):
    """One deployment of a host: its `Entry`, with its error and code."""


class HostEntry(Entry[F]):
    """One host: its `Entry`, or with several deployments one for each under `deployments`
    (a host entry with only those has no error or code of its own)."""

    deployments: NotRequired[dict[str, DeploymentEntry[F]]]


class PerHost(TypedDict, Generic[F]):
    # A per-host document as documents.hosts_document builds it; each document declares its
    # own (`Status`, `Stop`, …), of the same keys, so the contract names it.
    hosts: dict[str, HostEntry[F]]
