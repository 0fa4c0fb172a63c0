"""Run one operation on many hosts in parallel; one failing host never stops the others."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from deployctl import DEFAULT_FORKS, interrupts
from deployctl.connection import Connection, ConnectOptions, open_connection
from deployctl.errors import (
    CommandTimeoutError,
    ConnectError,
    DeployctlError,
    InventoryError,
    error_code,
    explain,
)
from deployctl.inventory import Host

T = TypeVar("T")

# A long-lived loop (top, watch) tries an unreachable host again after 1 s, then twice as
# long each time, up to a minute, instead of paying a connect timeout every round.
POLL_RETRY_FIRST = 1.0
POLL_RETRY_MAX = 60.0
# A follow (`logs -f`) or a launch's wait that loses its connection tries again sooner: after
# its first wait, doubling up to this.
RECONNECT_BACKOFF_MAX = 15.0


def next_backoff(previous: float, first: float, cap: float) -> float:
    """The wait before the next retry: `first`, then twice the previous wait, up to `cap`."""
    return min(cap, 2 * previous or first)


@dataclass(frozen=True)
class HostResult(Generic[T]):
    """One host's outcome: a value, or the exception that stopped it there."""

    host: Host
    value: T | None = None
    exception: BaseException | None = None

    @property
    def name(self) -> str:
        """The host, or `host/deployment` for one of a host's deployments."""
        return self.host.label

    @property
    def failed(self) -> bool:
        """The operation raised on this host (its value's own verdict aside)."""
        return self.exception is not None

    @property
    def ok(self) -> bool:
        """The operation finished here and its value, if it judges itself, is good."""
        if self.exception is not None:
            return False
        return bool(getattr(self.value, "ok", True))

    @property
    def error(self) -> str | None:
        """The failure in one line for people; None when the host succeeded."""
        return None if self.exception is None else explain(self.exception)[0]

    @property
    def hint(self) -> str | None:
        return None if self.exception is None else explain(self.exception)[1]

    @property
    def code(self) -> str | None:
        """The failure's stable code (see errors.py); None when the host succeeded."""
        return None if self.exception is None else error_code(self.exception)

    @property
    def is_bug(self) -> bool:
        """The failure is not one deployctl explains: a bug, whose traceback must be kept."""
        return self.exception is not None and not isinstance(self.exception, DeployctlError)


class FleetResult(Generic[T]):
    """Every selected host's result, in inventory order."""

    def __init__(self, results: Iterable[HostResult[T]]) -> None:
        self.results = list(results)

    def __iter__(self) -> Iterator[HostResult[T]]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> HostResult[T]:
        return self.results[index]

    @property
    def succeeded(self) -> dict[str, T]:
        """Host name (or host/deployment) → value, where the operation finished."""
        return {r.name: r.value for r in self.results if r.value is not None and not r.failed}

    @property
    def failed(self) -> dict[str, BaseException]:
        """Host name → the exception that stopped the operation there."""
        return {r.name: r.exception for r in self.results if r.exception is not None}

    @property
    def ok(self) -> bool:
        """Every host finished and every value that judges itself is good."""
        return all(r.ok for r in self.results)


def attempt(host: Host, operation: Callable[[], T]) -> HostResult[T]:
    """Run `operation` for one host and keep its value or its exception."""
    try:
        return HostResult(host, value=operation())
    except Exception as exc:  # a bug or surprise on one host must not stop the rest
        return HostResult(host, exception=exc)


def _still_waiting(host: Host, within: float) -> HostResult[Any]:
    return HostResult(
        host,
        exception=CommandTimeoutError(
            f"{host.label}: no answer within {within:g}s (its last call is still running)"
        ),
    )


def _no_inventory(pattern: str) -> list[Host]:
    raise InventoryError(f"no inventory to find {pattern!r} in")


class Fleet:
    """The selected hosts and one reusable connection per host for this invocation."""

    def __init__(
        self,
        hosts: Iterable[Host],
        options: ConnectOptions,
        forks: int = DEFAULT_FORKS,
        origin: str = "",
        select: Callable[[str], list[Host]] | None = None,
    ) -> None:
        self.hosts = list(hosts)
        self.options = options
        self.forks = max(1, forks)
        # The inventory the hosts come from (Inventory.origin): runs started here record it.
        self.origin = origin
        # The inventory's hosts by pattern (Inventory.select), for hosts a command reaches
        # besides the selected ones: a worker's router.
        self.select: Callable[[str], list[Host]] = select or _no_inventory
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()
        # label -> (when to try again, the wait, the failure that stands meanwhile)
        self._waiting: dict[str, tuple[float, float, HostResult[Any]]] = {}
        # Front ends that poll keep one agent process per host (agent.KeptAgent).
        self.keeps_agents = False
        # label -> a poll's call still running on that host after its round went on
        self._unanswered: dict[str, Future[HostResult[Any]]] = {}
        self._polled = False  # a first round was made
        self._poll_pool: ThreadPoolExecutor | None = None

    def keep_agents(self) -> None:
        """Let each host's reading calls go through one kept agent process (top, watch, the
        dashboard: see agent.KeptAgent) instead of a Python process per call."""
        with self._lock:
            self.keeps_agents = True
            for conn in self._connections.values():
                conn.keeps_agent = True

    def connection(self, host: Host) -> Connection:
        """Return the host's connection, opened on first use and reused afterwards."""
        with self._lock:
            if host.name not in self._connections:
                conn = open_connection(host, self.options)
                if self.keeps_agents:
                    conn.keeps_agent = True
                self._connections[host.name] = conn
            return self._connections[host.name]

    def round_trips(self) -> dict[str, int]:
        """Return how many remote round trips each host has cost so far."""
        return {name: conn.round_trips for name, conn in self._connections.items()}

    def run(
        self,
        operation: Callable[[Host, Connection], T],
        hosts: Iterable[Host] | None = None,
    ) -> FleetResult[T]:
        """Run `operation` on each host in parallel; return results in host order."""
        targets = list(self.hosts if hosts is None else hosts)

        def one(host: Host) -> HostResult[T]:
            return attempt(host, lambda: operation(host, self.connection(host)))

        if len(targets) <= 1:
            return FleetResult(one(host) for host in targets)
        for host in targets[: self.forks]:  # the first batch's sshds start meanwhile
            self.connection(host).dial()
        pool = ThreadPoolExecutor(max_workers=min(self.forks, len(targets)))
        try:
            futures = [pool.submit(one, host) for host in targets]
            interrupts.wait_all(futures)
            return FleetResult(future.result() for future in futures)
        finally:
            # On Ctrl-C, do not wait for hosts still at work (a launch waits up to --timeout):
            # the command ends now, and what those hosts were doing goes on there.
            pool.shutdown(wait=False, cancel_futures=True)

    def poll(
        self,
        operation: Callable[[Host, Connection], T],
        clock: Callable[[], float] = time.monotonic,
        answer_within: float | None = None,
    ) -> FleetResult[T]:
        """One round of a long-lived loop: `run` on every host, except that a host whose
        connection failed is tried again only after a backoff; until then its last failure
        stands for it.

        `answer_within`: after the first round (which waits for every host: connections and
        agents are set up then), a round ends after that long; a host still at work (a
        wedged nvidia-smi, a hung file system) is shown as not answering while its call goes
        on (until its own timeout), and the answer it gives late stands for the next round."""
        now = clock()
        late: dict[str, HostResult[T]] = {}
        for label, future in list(self._unanswered.items()):
            if future.done():
                late[label] = future.result()
                del self._unanswered[label]
        still = set(self._unanswered)
        busy = still | set(late)  # computed once: a round at 256 hosts reads it 256 times
        due = [
            h
            for h in self.hosts
            if self._waiting.get(h.label, (0.0,))[0] <= now and h.label not in busy
        ]
        if answer_within is None or not self._polled:
            fresh = {r.name: r for r in self.run(operation, due)}
        else:
            fresh, unanswered = self._run_within(operation, due, answer_within)
            still |= unanswered
        self._polled = True
        fresh.update(late)
        results: list[HostResult[T]] = []
        for host in self.hosts:
            result = fresh.get(host.label)
            if host.label in still:
                results.append(_still_waiting(host, answer_within or 0))
                continue
            if result is None:  # still waiting out its backoff
                results.append(self._waiting[host.label][2])
                continue
            if isinstance(result.exception, (ConnectError, CommandTimeoutError)):
                _, wait, _ = self._waiting.get(host.label, (0.0, 0.0, result))
                wait = next_backoff(wait, POLL_RETRY_FIRST, POLL_RETRY_MAX)
                self._waiting[host.label] = (now + wait, wait, result)
            else:
                self._waiting.pop(host.label, None)
            results.append(result)
        return FleetResult(results)

    def _run_within(
        self, operation: Callable[[Host, Connection], T], hosts: list[Host], within: float
    ) -> tuple[dict[str, HostResult[T]], set[str]]:
        """`operation` on each host, in a pool kept across rounds: the results that came
        within `within` seconds a call, and the hosts whose calls still run (kept in
        `_unanswered` until a later round takes their answer). The deployments of one
        machine share its connection, whose kept agent answers one call at a time: the
        round waits `within` for each call queued on the busiest machine."""
        if self._poll_pool is None:
            self._poll_pool = ThreadPoolExecutor(max_workers=self.forks)

        def one(host: Host) -> HostResult[T]:
            return attempt(host, lambda: operation(host, self.connection(host)))

        started = {host.label: self._poll_pool.submit(one, host) for host in hosts}
        queued = Counter(host.name for host in hosts)
        wait(started.values(), timeout=within * max(queued.values(), default=1))
        answered = {label: f.result() for label, f in started.items() if f.done()}
        unanswered = {label: f for label, f in started.items() if label not in answered}
        self._unanswered.update(unanswered)
        return answered, set(unanswered)

    def close(self) -> None:
        """Close every connection opened."""
        if self._poll_pool is not None:  # no new call; one still at work fails with its connection
            self._poll_pool.shutdown(wait=False, cancel_futures=True)
            self._poll_pool = None
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
