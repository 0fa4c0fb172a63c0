"""The dashboard's facts: the documents the CLI prints, refreshed by one thread that owns
every connection.

Each round is `status --metrics` over the fleet's open connections (Fleet.poll: a host that
went away keeps its error and is tried again with backoff, never stalling the rest), so no
host is asked more often than the interval. Patch audits and kept tune and bench records
change rarely and are read every RECORDS_EVERY seconds. The page gets one document per
round: `/api/status` is exactly `status --metrics --json`; `/api/dashboard` adds what the
page draws (rows per deployment, throughput history, crash reports, log tails, the audit
matrix, tune and bench curves, and each router's newest canary, read every round: a running
canary's buckets move while it is judged).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from deployctl import agent
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.deployments import group_of
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.inventory import Host
from deployctl.ops.canary import find_canaries
from deployctl.ops.patch import AuditReport, audit_host
from deployctl.ops.rounds import answer_within, metrics_round, status_rounds
from deployctl.ops.router import is_router_run
from deployctl.ops.runs import RunStatus, with_router_states
from deployctl.ops.tune import find_tunes
from deployctl.patchset import PatchSet
from deployctl.present.documents import audit_json, hosts_document, status_document
from deployctl.present.shapes import PerHost
from deployctl.remote.measures import BenchResultsArgs, CanaryRecord, TuneRecord
from deployctl.schema import versioned

# Throughput points kept per deployment: ten minutes at the default 2 s.
HISTORY_POINTS = 300
# Seconds between reads of what changes rarely: patch audits, kept tune and bench records.
RECORDS_EVERY = 60.0
# The log read with each status: enough for the detail view's tail.
TAIL_BYTES = 32 * 1024


class Records(TypedDict):
    """What the page reads besides the statuses, refreshed every RECORDS_EVERY seconds."""

    audit: PerHost[dict[str, Any]] | None  # the patch-audit document, with each set expected
    tunes: dict[str, TuneRecord]  # deployment → its newest kept tune (app.js draws it)
    bench: dict[str, list[dict[str, Any]]]  # deployment → its current run's kept sweeps


@dataclass(frozen=True)
class Snapshot:
    """One round's documents; `seq` grows by one per round."""

    seq: int
    status: dict[str, Any]
    dashboard: dict[str, Any]


class Collector:
    """Refresh the fleet's documents every `interval` seconds in a thread of its own."""

    def __init__(
        self,
        fleet: Fleet,
        catalog: Catalog,
        patch_sets: Mapping[str, PatchSet],
        interval: float,
        groups: Mapping[str, Sequence[str]] | None = None,
        clock: Callable[[], float] = time.time,
        records_every: float = RECORDS_EVERY,
    ) -> None:
        self.fleet = fleet
        self.catalog = catalog
        self.patch_sets = patch_sets
        self.interval = interval
        self.groups = groups or {}
        self.clock = clock
        self.history: dict[str, deque[tuple[float, float | None]]] = {}
        self._records: Records = {"audit": None, "tunes": {}, "bench": {}}
        self.records_every = records_every
        self._records_at: float | None = None  # when the records were last read
        self._listeners: list[Callable[[], None]] = []
        self._latest: Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dashboard-collector", daemon=True)
        self.failure: BaseException | None = None  # a bug that ended the thread

    def add_listener(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from the collector's thread) after each round, a failure or a stop."""
        self._listeners.append(wake)

    def _notify(self) -> None:
        for wake in self._listeners:
            wake()

    def start(self) -> None:
        self.fleet.keep_agents()  # one agent process per host for as long as the page polls
        self._thread.start()

    def request_stop(self) -> None:
        """End the rounds and wake every waiter, without waiting for the thread."""
        self._stop.set()
        self._notify()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, timeout: float = 30) -> None:
        self.request_stop()
        self._thread.join(timeout=timeout)

    def latest(self) -> Snapshot | None:
        with self._lock:
            return self._latest

    def _loop(self) -> None:
        try:
            for _ in status_rounds(self.refresh, self.interval, stop=self._stop):
                pass
        except BaseException as exc:  # the page shows it; the server stays up to say so
            self.failure = exc
            self._notify()

    def refresh(self) -> Snapshot:
        """One round: every deployment's status with metrics, and the records when due."""
        started = time.monotonic()
        results = with_router_states(
            self.fleet,
            metrics_round(self.fleet, self.catalog, TAIL_BYTES, answer_within(self.interval)),
        )
        now = self.clock()
        self._remember(results, now)
        status = versioned(status_document(results))
        dashboard = {
            "updated_at": now,
            "interval_s": self.interval,
            "refresh_s": round(time.monotonic() - started, 3),
            "status": status,
            "deployments": [self._row(r) for r in results],
            "history": {k: list(v) for k, v in self.history.items()},
            "canaries": self._read_canaries(results),
        }
        snapshot = self._publish(status, {**dashboard, **self._records})
        if self._records_at is None or started - self._records_at >= self.records_every:
            # After the statuses are out: the page shows them without waiting for these.
            self._records = self._read_records(results)
            self._records_at = started
            snapshot = self._publish(status, {**dashboard, **self._records})
        return snapshot

    def _publish(self, status: dict[str, Any], dashboard: dict[str, Any]) -> Snapshot:
        with self._lock:
            seq = self._latest.seq + 1 if self._latest else 1
            self._latest = Snapshot(seq, status, versioned(dashboard))
            snapshot = self._latest
        self._notify()
        return snapshot

    def _remember(self, results: FleetResult[RunStatus], now: float) -> None:
        for result in results:
            metrics = result.value.metrics if result.value else None
            if result.value is None or result.value.metrics_note is None:
                continue
            points = self.history.setdefault(result.name, deque(maxlen=HISTORY_POINTS))
            value = metrics.get("gen_throughput") if metrics else None
            points.append((round(now, 3), None if value is None else float(value)))

    def _row(self, result: HostResult[RunStatus]) -> dict[str, Any]:
        """One deployment as the page lists it (the status document's facts, and more)."""
        host = result.host
        group = group_of(host)
        row: dict[str, Any] = {
            "target": result.name,
            "host": host.name,
            "deployment": host.deployment,
            "groups": [g for g, names in self.groups.items() if host.name in names],
            "multi_node": f"{group[0]} ({', '.join(group[1])})" if group else None,
            "ok": not result.failed,  # read; whether the run is well is its status's state
            "error": result.error,
            "hint": result.hint,
        }
        status = result.value
        if status is None:
            return row
        run = status.run
        row.update(
            {
                "template": run["template"] if run else None,
                "threshold": run["threshold"] if run else None,
                "crashes": [c.to_json() for c in status.crashes] if status.crashed else [],
                "tail": status.tail,
            }
        )
        return row

    def _read_canaries(self, results: FleetResult[RunStatus]) -> dict[str, CanaryRecord]:
        """Each router's newest kept canary (routers that answered this round)."""
        routers = [r.host for r in results if r.value is not None and is_router_run(r.value.run)]
        if not routers:
            return {}
        found = find_canaries(self.fleet, routers, None)
        return {r.name: r.value.record for r in found if r.value and r.value.record}

    def _read_records(self, results: FleetResult[RunStatus]) -> Records:
        """Patch audits, each deployment's newest tune and its current run's bench sweeps,
        of the hosts that answered this round (one that did not would stall it)."""
        answered = [r.host for r in results if not r.failed]
        hosts = list({h.name: h for h in answered}.values())
        audits = self.fleet.run(
            lambda host, conn: audit_host(host, conn, self.patch_sets, ()), hosts
        )
        tunes = find_tunes(self.fleet, None, answered)
        runs = {r.name: r.value.run["id"] for r in results if r.value and r.value.run}
        bench = self.fleet.run(
            lambda host, conn: _bench_of(host, conn, runs.get(host.label)),
            [h for h in answered if h.label in runs],
        )
        return {
            "audit": hosts_document(audits, _audit_entry),
            "tunes": {r.name: r.value.record for r in tunes if r.value and r.value.record},
            "bench": {r.name: r.value for r in bench if r.value},
        }


def _audit_entry(report: AuditReport) -> dict[str, Any]:
    return {**audit_json(report), "expected": list(report.expected)}


def _bench_of(host: Host, conn: Connection, run: str | None) -> list[dict[str, Any]]:
    """The bench sweeps kept for the deployment's current run, oldest first."""
    if run is None:
        return []
    args = BenchResultsArgs(state_dir=host.settings.state_dir, runs=[run])
    return agent.call(host, conn, agent.BENCH_RESULTS, args)["results"].get(run, [])
