"""Run one operation on many hosts in parallel; one failing host never stops the others."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from deployctl.connection import Connection, ConnectOptions, open_connection
from deployctl.errors import DeployctlError
from deployctl.inventory import Host

T = TypeVar("T")
DEFAULT_FORKS = 16


@dataclass(frozen=True)
class HostResult(Generic[T]):
    """One host's outcome: a value, or the error that stopped it there."""

    host: Host
    value: T | None = None
    error: str | None = None
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def name(self) -> str:
        return self.host.name


class Fleet:
    """The selected hosts and one reusable connection per host for this invocation."""

    def __init__(
        self, hosts: Iterable[Host], options: ConnectOptions, forks: int = DEFAULT_FORKS
    ) -> None:
        self.hosts = list(hosts)
        self.options = options
        self.forks = max(1, forks)
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()

    def connection(self, host: Host) -> Connection:
        """Return the host's connection, opened on first use and reused afterwards."""
        with self._lock:
            if host.name not in self._connections:
                self._connections[host.name] = open_connection(host, self.options)
            return self._connections[host.name]

    def round_trips(self) -> dict[str, int]:
        """Return how many remote round trips each host has cost so far."""
        return {name: conn.round_trips for name, conn in self._connections.items()}

    def run(
        self,
        operation: Callable[[Host, Connection], T],
        hosts: Iterable[Host] | None = None,
    ) -> list[HostResult[T]]:
        """Run `operation` on each host in parallel; return results in host order."""
        targets = list(self.hosts if hosts is None else hosts)

        def one(host: Host) -> HostResult[T]:
            try:
                return HostResult(host, value=operation(host, self.connection(host)))
            except DeployctlError as exc:
                return HostResult(host, error=exc.message, hint=exc.hint)
            except Exception as exc:  # a bug or surprise on one host must not stop the rest
                return HostResult(host, error=f"{type(exc).__name__}: {exc}")

        if len(targets) <= 1:
            return [one(host) for host in targets]
        with ThreadPoolExecutor(max_workers=min(self.forks, len(targets))) as pool:
            return list(pool.map(one, targets))

    def close(self) -> None:
        """Close every connection opened."""
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
