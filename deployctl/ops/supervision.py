"""watch's supervision policies. Each decides from one round's statuses and its own memory
and returns what to say and do, acting on nothing: the watch loop (ops/watch.py) acts. What
the deployment is chooses them: every unit is restarted when it crashes (CrashRestarts), a
prefill/decode pair's decode is also watched through its prefill (PdPairs), and with
--renew-before a run whose launcher grants it a time limit is renewed (RenewBeforeLimit)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from deployctl import events as ev
from deployctl.choices import PdRole
from deployctl.disaggregation import PrefillLoss, TransferWatch
from deployctl.errors import UsageError
from deployctl.inventory import Host
from deployctl.launchers import launcher_for, launcher_of
from deployctl.ops.runs import RunStatus, Unit, UnitState

# ---- a crashed unit is restarted, with backoff, until a crash loop -------------------------

# The longest wait before a unit that crashed again is restarted again.
MAX_BACKOFF = 300.0


@dataclass
class CrashRestarts:
    """Restart a crashed unit, waiting `interval` doubled at each restart (MAX_BACKOFF at
    most) before the next; give up on it at a crash loop: more than `max_restarts` crashes
    within `window` seconds, or the same crash twice in a row (a death says nothing of why,
    so two deaths are no loop)."""

    max_restarts: int
    window: float
    interval: float
    crashes: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # (when, signature)
    next_try: dict[str, float] = field(default_factory=dict)
    given_up: set[str] = field(default_factory=set)

    def due(self, unit: Unit, now: float) -> bool:
        """A crashed unit not given up on, past its backoff."""
        name = unit.name
        return name not in self.given_up and unit.crashed and now >= self.next_try.get(name, 0)

    def decide(self, unit: Unit, now: float) -> ev.Restarting | ev.CrashLoop | None:
        """Restart a due unit, or give up on it; None when a node could not be read (its error
        is shown as the host's)."""
        if not unit.restartable:
            return None
        name, signature = unit.name, unit.crash_signature()
        recent = [(t, s) for t, s in self.crashes.get(name, []) if now - t <= self.window]
        recent.append((now, signature))
        self.crashes[name] = recent
        run = unit_run(unit)
        repeated = len(recent) >= 2 and recent[-2][1] == signature and signature != "died"
        if len(recent) > self.max_restarts or repeated:
            self.given_up.add(name)
            return ev.CrashLoop(
                target=name, run=run, signature=signature, repeated=repeated,
                crashes=len(recent), window_s=self.window,
            )  # fmt: skip
        down = unit.down if len(unit.nodes) > 1 else []
        return ev.Restarting(
            target=name, run=run, signature=signature, attempt=len(recent), down=down
        )

    def relaunched(self, restarting: ev.Restarting, now: float) -> None:
        """The unit was relaunched: its next restart waits out its backoff."""
        backoff = self.interval * 2 ** (restarting.attempt - 1)
        self.next_try[restarting.target] = now + min(MAX_BACKOFF, backoff)

    def gave_up_on_all(self, units: Sequence[Unit]) -> bool:
        watched = {unit.name for unit in units}
        return bool(watched) and watched <= self.given_up


def unit_run(unit: Unit) -> str:
    """The unit's run, by its first node's record ("" when that is unread)."""
    status = unit.nodes[0].value
    return status.run["id"] if status is not None and status.run else ""


# ---- a prefill/decode pair: a prefill's death is not a decode's crash ----------------------

# How long after a prefill of its router was last seen down a decode's failing health is
# blamed on the prefill (sglang#12779), and how long a decode's requests may wait for KV with
# no token out before watch reports a stuck transfer.
PD_WINDOW = 60.0
STUCK_AFTER = 60.0


# A unit's side of a prefill/decode pair and its router's label (None: neither).
PdSide = tuple[PdRole | None, str | None]


def held_decode(
    unit: Unit, side: PdSide, now: float, losses: PrefillLoss
) -> tuple[str, float] | None:
    """The prefill a crashed decode's failure is blamed on (and how long ago it was down), so
    the decode is not restarted; None to restart it as any crashed unit. A decode whose
    process died is restarted: that is its own failure."""
    role, router = side
    if role is not PdRole.DECODE or not all(n.value and n.value.alive for n in unit.nodes):
        return None
    return losses.blames(router, now)


@dataclass(frozen=True)
class Hold:
    """A crashed decode left alone this round: its prefill's death is to blame. `first`: the
    hold's first round, the only one that says it."""

    event: ev.DecodeHeld
    first: bool


@dataclass
class PdPairs:
    """Of a prefill/decode pair: note each prefill seen down, hold (do not restart) a decode
    whose health fails within the window of that, and report a decode whose transfers are
    stuck. A unit of no pair is none of its business."""

    losses: PrefillLoss
    transfers: TransferWatch
    held: set[str] = field(default_factory=set)  # decodes held since their prefill was down

    def observe(self, unit: Unit, side: PdSide, now: float) -> ev.StuckTransfer | None:
        """Every unit of the round, before any is restarted: a prefill's death is noted before
        the decodes it fails are judged."""
        role, router = side
        if role is PdRole.PREFILL and router is not None and unit.state is not UnitState.READY:
            self.losses.down(router, unit.name, now)
        status = unit.nodes[0].value
        if role is not PdRole.DECODE or status is None or not status.ready or not status.metrics:
            return None
        metrics = status.metrics
        waiting = int(
            (metrics.get("num_running_reqs") or 0)
            + (metrics.get("num_decode_transfer_queue_reqs") or 0)
        )
        stuck = self.transfers.look(
            unit.name,
            now,
            waiting,
            metrics.get("generation_tokens_total"),
            metrics.get("gen_throughput"),
        )
        if stuck is None:
            return None
        return ev.StuckTransfer(
            target=unit.name, run=unit_run(unit), waiting=waiting, stuck_s=stuck
        )

    def hold(self, unit: Unit, side: PdSide, now: float) -> Hold | None:
        """A crashed unit held rather than restarted; None: restart it as any crashed unit."""
        blamed = held_decode(unit, side, now, self.losses)
        if blamed is None:
            self.held.discard(unit.name)
            return None
        first = unit.name not in self.held
        self.held.add(unit.name)
        prefill, down_s = blamed
        event = ev.DecodeHeld(
            target=unit.name, run=unit_run(unit), prefill=prefill, down_s=down_s,
            window_s=self.losses.window,
        )  # fmt: skip
        return Hold(event, first)


# ---- a job is renewed before its time limit ------------------------------------------------


@dataclass
class RenewBeforeLimit:
    """Renew a run whose launcher grants it a time limit (a Slurm job) `window` seconds before
    that limit. Each job is renewed once; a successor that is within the window as soon as it
    serves (its whole limit is not longer than the window: a partition's cap, `slurm_extra`'s
    --time) is not renewed again, which would renew it at every round without end."""

    window: float
    done: set[str] = field(default_factory=set)  # jobs whose time limit was dealt with
    far: set[str] = field(default_factory=set)  # jobs seen with more than the window left
    successors: set[str] = field(default_factory=set)  # runs this watch submitted

    def look(
        self, target: str, status: RunStatus, renewing: bool
    ) -> ev.TimeLimitNear | ev.Renewed | None:
        """One run's time limit this round: near it once within the window (to be renewed
        when `renewing`: it has a router), a refused renewal for a successor whose limit is
        within the window from its start, else None."""
        run = status.run
        lease = launcher_of(run).lease(status.placement)
        if lease is None or run is None:
            return None
        job, left = lease.id, lease.time_left
        if left > self.window:
            self.far.add(job)
            return None
        if job in self.done or not status.ready:
            return None
        self.done.add(job)
        if run["id"] in self.successors and job not in self.far:
            return ev.Renewed(
                target=target, old_run=run["id"], new_run=None, state="refused",
                error=f"job {job} had {left:.0f}s left as soon as it served, within "
                f"--renew-before {self.window:g}s: its time limit is not longer than "
                "the window, so it is not renewed again",
            )  # fmt: skip
        return ev.TimeLimitNear(
            target=target, run=run["id"], job=job, time_left_s=left, renewing=renewing
        )

    def submitted(self, new_run: str | None) -> None:
        """A successor this watch started: its own limit is judged as a successor's."""
        if new_run is not None:
            self.successors.add(new_run)


def check_renew_window(hosts: Sequence[Host], window: float) -> None:
    """Refuse a window that is not shorter than a Slurm deployment's time limit (slurm_time),
    before anything is touched."""
    for host in hosts:
        found = launcher_for(host.settings).time_limit(host.settings)
        if found is None:
            continue
        text, limit = found
        if window >= limit:
            raise UsageError(
                f"--renew-before {window:g}s is not shorter than {host.label}'s time limit "
                f"(slurm_time {text}: {limit:g}s): each successor would be renewed as soon "
                "as it serves, without end",
                hint=f"renew within the limit, e.g. --renew-before {max(1.0, limit / 4):g}s",
            )
