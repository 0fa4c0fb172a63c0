"""Renewing a Slurm job before its time limit: its successor started beside it and swapped
in at its router (watch's RenewBeforeLimit policy decides when)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deployctl.crash import Catalog
from deployctl.errors import DeployctlError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet
from deployctl.inventory import Host
from deployctl.ops.router import Registration, change_registration
from deployctl.ops.runs import (
    DEFAULT_STOP_TIMEOUT,
    LaunchReport,
    RunState,
    RunStatus,
    end_run,
    launch,
)
from deployctl.ops.serving import capture, point_back
from deployctl.patchset import PatchSet


@dataclass
class Renewal:
    """A Slurm job's successor, started beside it and swapped in at its router."""

    old_run: str
    launch: LaunchReport
    removal: Registration | None = None  # the old job's, from its router
    error: str = ""

    @property
    def new_run(self) -> str | None:
        outcomes = self.launch.outcomes.results
        return outcomes[0].value.run["id"] if outcomes and outcomes[0].value else None

    @property
    def state(self) -> str:
        outcomes = self.launch.outcomes.results
        if not outcomes:
            return "refused"
        return outcomes[0].value.state.value if outcomes[0].value else "failed"


def renew(
    fleet: Fleet,
    host: Host,
    status: RunStatus,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    *,
    timeout: float,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    events: EventSink = DISCARD,
) -> Renewal:
    """Submit the successor of a Slurm job with the same command and the next log version,
    beside it; once the successor serves and its router lists it, take the old job out of
    the router and cancel it. A successor that does not come up is cancelled and the old
    job stays the deployment's current run, serving until its limit."""
    assert status.run is not None
    old = capture(host, status, patch_sets)
    report = launch(
        fleet, [old.plan], catalog, timeout=timeout, restart_of={host.label: old.run},
        beside={host.label: old.run},
    )  # fmt: skip
    renewal = Renewal(old.run, report)
    conn = fleet.connection(host)
    if not report.ok:
        renewal.error = _renewal_failure(report)
        if report.started:
            try:  # what is left of the successor, then the old job is current again
                point_back(host, conn, old, stop_timeout)
            except DeployctlError as exc:
                renewal.error += f"; {old.run} not made current again: {exc.message}"
        return renewal
    renewal.removal = change_registration(fleet, host, False, old.port, events, old.head, old.url)
    end_run(host, conn, stop_timeout, run_id=old.run)
    return renewal


def _renewal_failure(report: LaunchReport) -> str:
    """Why a successor did not take over, in one line."""
    for pre in report.preflights:
        if pre.value is None:
            return pre.error or "its preflight failed"
        if pre.value.problems:
            return pre.value.problems[0]
    for out in report.outcomes:
        if out.value is None:
            return out.error or "it did not start"
        if out.value.state is not RunState.READY:
            crash = out.value.crashes[0].summary() if out.value.crashes else out.value.note
            return f"its successor {out.value.run['id']} {out.value.state.value}" + (
                f": {crash}" if crash else ""
            )
    failed = next((r for r in report.registrations if not r.ok), None)
    return f"its successor was not registered: {failed.error}" if failed else "it failed"
