"""The wire types of a router's worker list and of the locks held per router (stdlib only):
the `router`, `workers` and `hold` calls of `protocol.CALLS`."""

from __future__ import annotations

from typing import Any, TypedDict


class WorkersArgs(TypedDict):
    bind_host: str  # the router's --host and --port, reached from its own host
    port: int


class RouterArgs(WorkersArgs):
    action: str  # "add", "remove" or "health" (does `url` answer /health now?)
    url: str | None  # the worker to add or remove
    wait: float  # seconds to wait for the change to show in the router's list
    # A worker of a router in PD mode: "prefill" or "decode" (None: a whole-request worker),
    # and a prefill's bootstrap port, which the router hands to decodes with each request.
    worker_type: str | None
    bootstrap_port: int | None


class RouterWorker(TypedDict):
    id: str | None  # None on a legacy router (it names workers by URL)
    url: str
    healthy: bool | None  # None: the router does not say
    load: int | None
    worker_type: str | None  # "prefill", "decode", "regular"; None: the router does not say
    bootstrap_port: int | None


class RouterReply(TypedDict):
    api: str | None  # "workers" (0.3 and later), "legacy" (up to 0.2.1), None: no router answers
    # Why the action did not happen ("" when it did); not `error`, which is the agent's own
    # failure answer.
    problem: str
    workers: list[RouterWorker]  # the list after the action (`workers`: as it is)


class HoldArgs(TypedDict):
    state_dir: str
    name: str  # the lock: a router deployment's name
    holder: dict[str, Any]  # who takes it, kept in the file for the next taker to name


class HoldReply(TypedDict):
    acquired: bool
    holder: dict[str, Any] | None  # who holds it, when not acquired ({} if it does not say)
