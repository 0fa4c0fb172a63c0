"""Live output: sinks for the events operations emit, and `top`'s screen.

Each sink takes every event and shows the ones it knows: the progress line shows waits,
the log printer shows log lines and crashes, `watch`'s printer shows supervision, and
`JsonLines` writes every event as one JSON object per line.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from deployctl import events as ev
from deployctl.errors import DeployctlError, explain
from deployctl.present.documents import event_json, status_document
from deployctl.present.terminal import (
    CRASH_MARK,
    RED,
    RESET,
    console,
    duration_text,
    escaped,
    interval_text,
    print_bug,
    print_error,
    print_event_text,
    use_color,
)
from deployctl.present.views import METRIC_COLUMNS, metric_rows
from deployctl.schema import versioned
from deployctl.text import counted

if TYPE_CHECKING:
    from deployctl.crash.model import CrashReport
    from deployctl.fanout import FleetResult
    from deployctl.ops.runs import RunStatus


class _Stdout:
    """Whole writes to stdout from many threads, flushed; a reader that left ends them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = False

    def write(self, text: str) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                sys.stdout.write(text)
                sys.stdout.flush()  # the output may be piped: each line must leave at once
            except BrokenPipeError:
                # The reader left (`| head`): stop, and keep exit from complaining.
                self.closed = True
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())


class Progress:
    """A live line per target on stderr while waiting (only on a terminal)."""

    closed = False

    def __init__(self, enabled: bool = True, steps_when_piped: bool = False) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        # A long command (tune) still says what it does, one line a step, into a pipe or log.
        self.piped_steps = enabled and steps_when_piped and not self.enabled
        self.lines: dict[str, str] = {}
        self.phases: dict[str, str] = {}  # target → the tune phase its bench levels belong to
        self._live: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.live import Live

            self._live = Live(console=console(stderr=True), refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def emit(self, event: ev.Event) -> None:
        """Show a target's elapsed wait and what it is doing."""
        if isinstance(event, ev.TuneStep):
            self._tune_step(event)
        elif isinstance(event, ev.RolloutStep):
            self._rollout_step(event)
        elif isinstance(event, ev.CanaryProgress):
            self._step(event.target, event.elapsed_s, canary_progress_text(event))
        elif isinstance(event, ev.RaceProgress):
            self._step(event.target, event.elapsed_s, race_progress_text(event))
        if self._live is None:
            return
        if isinstance(event, ev.Waiting):
            self._show(event.target, event.elapsed, event.last_line)
        elif isinstance(event, ev.ConnectionLost):
            self._show(
                event.target, event.elapsed, f"connection lost ({event.error}); reconnecting"
            )
        elif isinstance(event, ev.Reconnected):
            self._show(event.target, event.elapsed, "reconnected")
        elif isinstance(event, ev.BenchLevelStarted):
            phase = self.phases.get(event.target, "")
            self._show(event.target, event.elapsed, f"{phase}concurrency {event.concurrency}…")

    def _rollout_step(self, event: ev.RolloutStep) -> None:
        if not event.target:  # Ctrl-C: the units in hand finish (or go back), no other starts
            sys.stderr.write("interrupted: finishing the units in hand, then stopping\n")
        elif self._live is not None:
            self._show(event.target, event.elapsed, event.step)
        elif self.piped_steps:
            sys.stderr.write(f"{event.target}: {event.step}\n")

    def _step(self, target: str, elapsed: float, text: str) -> None:
        if self._live is not None:
            self._show(target, elapsed, text)
        elif self.piped_steps:
            sys.stderr.write(f"{target}: {text}\n")

    def _tune_step(self, event: ev.TuneStep) -> None:
        if not event.target:  # Ctrl-C: every deployment stops at its next safe point
            sys.stderr.write("interrupted: stopping after the current step, then putting back\n")
            return
        levels = f" concurrency {','.join(map(str, event.levels))}" if event.levels else ""
        eta = f" · about {duration_text(event.eta)} left" if event.eta else ""
        text = f"{event.phase}: {event.step}{levels}{eta}"
        self.phases[event.target] = f"{event.phase}: "
        if self._live is not None:
            self._show(event.target, event.elapsed, text)
        elif self.piped_steps:
            sys.stderr.write(f"{event.target}: {text}\n")

    def _show(self, target: str, elapsed: float, text: str) -> None:
        from rich.text import Text

        self.lines[target] = f"{target}  {elapsed:6.1f}s  {escaped(text)[-120:]}"
        self._live.update(Text("\n".join(self.lines.values())))

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)


def canary_progress_text(event: ev.CanaryProgress) -> str:
    """`12 matched samples (bucket 8: 6/5, 16: 4/4) · candidate/control 1.03 [0.99, 1.07]`."""
    buckets = ", ".join(
        f"{b}: {c}/{d}" for b, (c, d) in sorted(event.buckets.items(), key=lambda i: int(i[0]))
    )
    text = f"{event.samples} matched samples" + (f" (bucket {buckets})" if buckets else "")
    if event.estimate is not None:
        interval = interval_text(event.low, event.high)
        text += f" · candidate/control {event.estimate:.3f}{interval}"
    return text


def race_progress_text(event: ev.RaceProgress) -> str:
    """`racing threshold/adaptive/off: 30 samples (bucket 4: 6/5/6, 16: 4/4/5)`."""
    buckets = ", ".join(
        f"{b}: {'/'.join(map(str, n))}"
        for b, n in sorted(event.buckets.items(), key=lambda i: int(i[0]))
    )
    samples = sum(sum(n) for n in event.buckets.values())
    text = f"racing {'/'.join(event.policies)}: {samples} samples"
    return text + (f" (bucket {buckets})" if buckets else "")


class LogPrinter:
    """Log lines on stdout from many threads, crash lines marked; notices on stderr."""

    def __init__(self, prefixed: bool) -> None:
        self.prefixed = prefixed
        self.color = sys.stdout.isatty() and use_color()
        self._out = _Stdout()

    @property
    def closed(self) -> bool:
        return self._out.closed

    def emit(self, event: ev.Event) -> None:
        if isinstance(event, ev.LogLine):
            self.line(event.target, event.line, event.crash)
        elif isinstance(event, ev.LogCrash):
            self.crash(event.target, event.report)
        elif isinstance(event, ev.HostFailed):
            # A bug's traceback is kept when `logs` ends.
            print_error(*explain(event.exception), host=event.target)
        elif isinstance(event, ev.ConnectionLost):
            self.notice(event.target, f"connection lost ({event.error}); reconnecting")
        elif isinstance(event, ev.Reconnected):
            self.notice(event.target, "reconnected")

    def line(self, host: str, text: str, crash: bool = False) -> None:
        prefix = f"{host} | " if self.prefixed else ""
        text = escaped(text)
        if crash:
            # The mark stays in piped output too, so scripts (and grep) can find crash lines.
            text = f"{RED}{CRASH_MARK}{text}{RESET}" if self.color else CRASH_MARK + text
        self._out.write(prefix + text + "\n")

    def crash(self, host: str, report: CrashReport) -> None:
        prefix = f"{host} | " if self.prefixed else ""
        where = f" at {report.file}:{report.line}" if report.file else ""
        from deployctl.crash.model import format_ranks

        ranks = f" (ranks {format_ranks(report.ranks)})" if report.ranks else ""
        text = escaped(f"{prefix}{CRASH_MARK}CRASH: {report.summary()}{where}{ranks}") + "\n"
        text += escaped(f"{prefix}{CRASH_MARK}hint: {report.hint}") + "\n"
        self._out.write(f"{RED}{text}{RESET}" if self.color else text)

    def notice(self, host: str, text: str) -> None:
        with self._out.lock:  # on stderr, so piped log lines stay the log's own
            print(f"{host}: {text}", file=sys.stderr, flush=True)


class JsonLines:
    """Every event as one JSON object per line on stdout (`watch --json`, `logs -f --json`)."""

    def __init__(self) -> None:
        self._out = _Stdout()

    @property
    def closed(self) -> bool:
        return self._out.closed

    def emit(self, event: ev.Event) -> None:
        self._out.write(json.dumps(versioned(event_json(event)), default=str) + "\n")


class BugKeeper:
    """Keeps the traceback of a bug an event carries, once per target and kind of bug."""

    def __init__(self) -> None:
        self.kept: set[tuple[str, type[BaseException]]] = set()

    def keep(self, target: str, exc: BaseException | None) -> None:
        if exc is None or isinstance(exc, DeployctlError) or (target, type(exc)) in self.kept:
            return
        self.kept.add((target, type(exc)))
        print_bug([(target, exc)])


class WatchPrinter:
    """`watch`'s events as timestamped lines."""

    closed = False

    def __init__(self) -> None:
        self.bugs = BugKeeper()

    def emit(self, event: ev.Event) -> None:
        text = watch_text(event)
        if text is None:
            return
        print_event_text(f"{event.target}: {text}" if event.target else text)
        if isinstance(event, ev.HostFailed | ev.StopFailed):
            self.bugs.keep(event.target, event.exception)


def watch_text(event: ev.Event) -> str | None:
    """What `watch` says of an event; None for the ones it does not show."""
    if isinstance(event, ev.HostFailed):
        return f"error: {explain(event.exception)[0]}"
    if isinstance(event, ev.Restarting):
        where = f" on {', '.join(event.down)}" if event.down else ""
        return (
            f"{event.run} crashed{where} ({event.signature}); restarting (attempt {event.attempt})"
        )
    if isinstance(event, ev.CrashLoop):
        why = (
            f"same crash twice ({event.signature})"
            if event.repeated
            else f"{event.crashes} crashes within {event.window_s:g}s"
        )
        return f"crash loop: {why}; not restarting {event.run}; last crash: {event.signature}"
    if isinstance(event, ev.DecodeHeld):
        return (
            f"{event.run} fails its health check, but its prefill {event.prefill} was down "
            f"{event.down_s:.0f}s ago: not restarting it (re-checked until {event.window_s:g}s "
            "after the prefill is back)"
        )
    if isinstance(event, ev.StuckTransfer):
        return (
            f"stuck transfer: {event.waiting} requests of {event.run} have waited for their KV "
            f"{event.stuck_s:.0f}s with no token out"
        )
    if isinstance(event, ev.StopFailed):
        return f"stop failed: {explain(event.exception)[0]}"
    if isinstance(event, ev.Replaced):
        return f"restarted as {event.new_run or '-'}: {event.state}"
    if isinstance(event, ev.TimeLimitNear):
        left = f"job {event.job} ({event.run}) reaches its time limit in {event.time_left_s:.0f}s"
        if event.renewing:
            return f"{left}: submitting its successor, swapped in at its router when it serves"
        at = time.strftime("%H:%M:%S", time.localtime(event.at + event.time_left_s))
        return (
            f"{left}, at {at}: it has no router, so it is down from then until its successor "
            "(restarted when the job ends) serves"
        )
    if isinstance(event, ev.Renewed):
        if event.error:
            return f"not renewed: {event.error}; {event.old_run} serves on until its limit"
        return f"renewed: {event.new_run} serves, {event.old_run} cancelled"
    if isinstance(event, ev.Watching):
        unreadable = f" ({event.unreadable} unreadable)" if event.unreadable else ""
        return (
            f"watching {counted(event.deployments, 'deployment')} on "
            f"{counted(event.hosts, 'host')}{unreadable}, every {event.interval_s:g}s; "
            "Ctrl-C ends (servers keep running)"
        )
    if isinstance(event, ev.WatchStopped) and event.gave_up:
        return "watch ends: every deployment it watches is in a crash loop"
    if isinstance(event, ev.WatchStopped):
        return "watch ended; servers left running"
    return None


class TopScreen:
    """`top`'s display: a table redrawn in place (or a JSON document per refresh), and the
    wait between refreshes, which ends the command when q is pressed."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._live: Any = None
        self._saved: Any = None

    def __enter__(self) -> TopScreen:
        if not self.as_json:
            from rich.live import Live

            self._live = Live(console=console(), auto_refresh=False)
            self._live.__enter__()
        if sys.stdin.isatty():
            import termios
            import tty

            self._saved = termios.tcgetattr(sys.stdin)
            tty.setcbreak(sys.stdin)  # one key at a time, no echo
        return self

    def show(self, results: FleetResult[RunStatus]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(versioned(status_document(results)), default=str) + "\n")
            sys.stdout.flush()
            return
        from rich import box
        from rich.table import Table
        from rich.text import Text

        table = Table(
            title=f"deployctl top  {time.strftime('%H:%M:%S')}  (q to quit)",
            box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
        )  # fmt: skip
        for column in METRIC_COLUMNS:
            table.add_column(column, overflow="fold")
        for row in metric_rows(results):
            table.add_row(*(Text(cell) for cell in row))
        self._live.update(table, refresh=True)

    def wait(self, seconds: float) -> None:
        """Sleep until the next refresh; q ends `top` as Ctrl-C does."""
        import select

        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._saved is None:
                time.sleep(left)
                return
            ready, _, _ = select.select([sys.stdin], [], [], left)
            if ready and sys.stdin.read(1) in ("q", "Q"):
                raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, self._saved)
        if self._live is not None:
            self._live.__exit__(None, None, None)
