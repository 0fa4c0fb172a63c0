"""Stray runs: runs alive on a selected host that no selected deployment names."""

from __future__ import annotations

from dataclasses import dataclass

from deployctl import agent
from deployctl.connection import Connection
from deployctl.fanout import Fleet
from deployctl.inventory import Host
from deployctl.remote.protocol import RunsArgs


@dataclass(frozen=True)
class Stray:
    """A run alive on a selected host that no selected deployment names."""

    host: Host  # the host, with the run's deployment
    run: str
    origin: str | None  # the inventory that launched it (None: not recorded)
    ours: bool  # launched from this very inventory: its leftover, provably


def stray_runs(fleet: Fleet) -> list[Stray]:
    """Runs alive on the fleet's hosts that no selected deployment names: the host's single
    server from before it had `deployments`, a deployment that left the inventory, or a run
    another inventory (another project or checkout sharing the host) launched. Only the
    ones this inventory launched are its own. A host that cannot be asked adds none (its own
    stop reports why)."""
    known = {(h.name, h.deployment) for h in fleet.hosts}
    hosts = list({h.name: h for h in fleet.hosts}.values())

    def strays(host: Host, conn: Connection) -> list[Stray]:
        args: RunsArgs = {"state_dir": host.settings.state_dir}
        runs = agent.call(host, conn, agent.RUNS, args)["live_runs"]
        return [
            Stray(
                Host(host.name, host.vars, run["deployment"]),
                run["id"],
                run.get("origin"),
                bool(fleet.origin) and run.get("origin") == fleet.origin,
            )
            for run in runs
            if (host.name, run["deployment"]) not in known
        ]

    return [stray for result in fleet.run(strays, hosts) for stray in result.value or []]
