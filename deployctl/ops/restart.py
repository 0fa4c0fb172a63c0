"""Restarting recorded runs: `restart`, and the relaunch that `restart` and `watch` share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deployctl.crash import Catalog
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.ops.runs import (
    DEFAULT_STOP_TIMEOUT,
    LaunchReport,
    Replacement,
    RunStatus,
    replace,
    run_status,
    units,
)
from deployctl.ops.serving import recorded_plan
from deployctl.patchset import PatchSet


def relaunch_recorded(
    fleet: Fleet,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    nodes: Sequence[HostResult[RunStatus]],
    *,
    timeout: float,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    wait: bool = True,
    events: EventSink = DISCARD,
) -> Replacement:
    """Replace each read node's recorded run by a new one with the same command and the next
    log version, through the one stop-then-start (runs.replace)."""
    read = [(node.host, node.value) for node in nodes if node.value is not None]
    plans = [recorded_plan(host, status, patch_sets) for host, status in read]
    restart_of = {host.label: status.run["id"] for host, status in read if status.run}
    return replace(
        fleet, plans, catalog, restart_of=restart_of, stop_timeout=stop_timeout, wait=wait,
        timeout=timeout, events=events,
    )  # fmt: skip


def restart(
    fleet: Fleet,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    *,
    crashed_only: bool,
    timeout: float,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    wait: bool = True,
    events: EventSink = DISCARD,
) -> RestartReport:
    """Replace each recorded run by a new one with the same command and the next log
    version; a multi-node server's nodes all together when any of them crashed."""
    statuses = fleet.run(lambda host, conn: run_status(host, conn, catalog))
    chosen = [
        node
        for unit in units(statuses)
        if unit.restartable and (unit.crashed or not crashed_only)
        for node in unit.nodes
    ]
    if not chosen:
        return RestartReport(statuses, None)
    replaced = relaunch_recorded(
        fleet, catalog, patch_sets, chosen, timeout=timeout, stop_timeout=stop_timeout,
        wait=wait, events=events,
    )  # fmt: skip
    failed_stops: list[HostResult[RunStatus]] = [
        HostResult(r.host, exception=r.exception) for r in replaced.stops if r.failed
    ]
    return RestartReport(FleetResult([*failed_stops, *statuses]), replaced.launch)


@dataclass
class RestartReport:
    """What restart saw on each host, and the launch of the runs it chose (None: none)."""

    statuses: FleetResult[RunStatus]
    launch: LaunchReport | None

    @property
    def ok(self) -> bool:
        """Every host could be read and stopped, and every relaunch came up."""
        # A crashed run is why restart was called: it does not fail the restart itself.
        read = not self.statuses.failed
        return read and (self.launch is None or self.launch.ok)
