"""A fleet whose replicas are read from scripts on a clock of its own: what the judging loops
of canary and `tune --live` read, in virtual time (their `clock` is the fleet's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from deployctl.fanout import HostResult
from deployctl.inventory import Host
from deployctl.metrics import Counts
from deployctl.ops.canary import Read


class ScriptedFleet:
    """Round i reads each replica's script at i, `step` seconds after the round before on
    the fleet's clock (round 0 at `start`), and finds the router answering. Each round moves
    the clock on by one interval, so a window's rounds at that interval never wait but the
    first."""

    def __init__(
        self,
        step: float,
        replicas: Sequence[tuple[Host, Callable[[int], Counts]]],
        router: Host,
        start: float = 0.0,
    ) -> None:
        self.step, self.replicas, self.router, self.start = step, replicas, router, start
        self.rounds = 0
        self.now = start
        self.keeps_agents = False  # set as a real fleet's: its reads go through kept agents

    def clock(self) -> float:
        return self.now

    def keep_agents(self) -> None:
        self.keeps_agents = True

    def run(self, read: Any, hosts: Any) -> list[HostResult[Read]]:
        self.now = self.start + self.step * self.rounds
        i, self.rounds = self.rounds, self.rounds + 1
        answered = HostResult(self.router, Read(self.now, None, True))
        return [
            *(HostResult(h, Read(self.now, script(i), True)) for h, script in self.replicas),
            answered,
        ]
