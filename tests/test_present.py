"""Presentation shows every state a run or unit can be in from the state itself: a state
added to an enum reaches tables and JSON with no other edit."""

from __future__ import annotations

import json
import time
from enum import StrEnum
from typing import Any

import pytest

from deployctl.events import WaitEnded, Watching
from deployctl.fanout import FleetResult, HostResult
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops import runs
from deployctl.ops.plan import Plan
from deployctl.ops.preflight import Preflight
from deployctl.ops.runs import LaunchReport, Outcome, RunState, RunStatus, UnitState
from deployctl.present import documents, views
from deployctl.present.live import watch_text
from deployctl.remote.protocol import RunRecord
from deployctl.render import RenderedCommand
from tests.json_contract import check_output

HOST = Host("alpha", dict(DEFAULT_VARS))
RUN: RunRecord = {
    "template": "baseline", "threshold": None, "command": "python3 -m sglang.launch_server",
    "port": 30000, "bind_host": "127.0.0.1", "tp": 1, "patches": {}, "deployctl_version": "t",
    "started_by": "t", "restart_of": None, "id": "baseline_v1", "log": "/l/baseline_v1.log",
    "pid": 4242, "pgid": 4242, "sid": 4242, "started_at": time.time() - 5, "status": "running",
}  # fmt: skip
# RunState with one more member, as a later change would add it.
Extended = StrEnum("Extended", {**{m.name: m.value for m in RunState}, "PAUSED": "paused"})  # type: ignore[misc]


def launched(state: Any) -> LaunchReport:
    rendered = RenderedCommand("baseline", None, ["python3", "-m", "sglang.launch_server"])
    preflight = Preflight(Plan(HOST, rendered, []), next_log="/l/baseline_v1.log")
    outcome = Outcome(RUN, state, 1.5)
    return LaunchReport(
        FleetResult([HostResult(HOST, preflight)]),
        FleetResult([HostResult(HOST, outcome)]),
        refused=False,
    )


@pytest.mark.parametrize("state", [*RunState, Extended.PAUSED], ids=str)
def test_every_launch_outcome_state_shows_in_the_table_and_json(
    state: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    report = launched(state)
    document = views.LAUNCH.document(report)
    assert document["hosts"]["alpha"]["state"] == state.value
    views.render_result(views.LAUNCH, report, as_json=False)
    line = capsys.readouterr().out.splitlines()[0]
    head, said = line.split(" — ")
    assert head == "alpha: baseline_v1 pid 4242" and said, line
    if state is Extended.PAUSED:  # a state with no words of its own is named
        assert said == "paused after 1.5s", line


class Seen(RunStatus):
    """A status whose state is fixed, whatever its fields say."""

    def __init__(self, state: Any) -> None:
        super().__init__(RUN, alive=True, health=200)
        self._state = state

    @property
    def state(self) -> Any:
        return self._state


@pytest.mark.parametrize("state", [*RunState, Extended.PAUSED], ids=str)
def test_every_run_status_state_shows_in_the_status_table_and_json(
    state: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    results = FleetResult([HostResult(HOST, Seen(state))])
    assert documents.status_document(results)["hosts"]["alpha"]["state"] == state.value
    views.render_result(views.STATUS, results, as_json=False)
    row = next(line for line in capsys.readouterr().out.splitlines() if "baseline_v1" in line)
    assert f" {state.value} " in row, row


def test_the_status_state_follows_what_the_probe_saw() -> None:
    stopped: RunRecord = {**RUN, "status": "stopped"}
    assert RunStatus(RUN, alive=True, health=200).state is RunState.READY
    assert RunStatus(RUN, alive=True, health=503).state is RunState.STARTING
    assert RunStatus(RUN, alive=False).state is RunState.CRASHED  # dead while meant to run
    assert RunStatus(stopped, alive=False).state is RunState.STOPPED
    # Its stop signalled it and has 60 s left: gone, it is not recorded stopped yet.
    stopping: RunRecord = {**RUN, "stop_requested_at": time.time(), "stop_budget_s": 60.0}
    assert RunStatus(stopping, alive=False).state is RunState.STOPPED
    assert not RunStatus(stopping, alive=False).crashed
    assert RunStatus(stopping, alive=True, health=200).state is RunState.READY  # draining
    # A mark past its budget (and the clocks' skew) is a stop whose agent died: meant to run.
    stale: RunRecord = {**stopping, "stop_requested_at": time.time() - 121}
    assert RunStatus(stale, alive=False).state is RunState.CRASHED
    assert RunStatus(None).state is None


def test_a_unit_that_is_stopping_reads_as_it_is_until_it_is_gone() -> None:
    stopping: RunRecord = {**RUN, "stop_requested_at": time.time(), "stop_budget_s": 60.0}
    host = Host("alpha", dict(DEFAULT_VARS), "kimi")
    draining = runs.Unit("kimi", [HostResult(host, RunStatus(stopping, alive=True, health=200))])
    assert draining.state is UnitState.READY and not draining.down
    gone = runs.Unit("kimi", [HostResult(host, RunStatus(stopping, alive=False))])
    assert gone.state is UnitState.STOPPED and not gone.crashed


def test_terminal_states_are_the_ones_where_nothing_of_the_run_is_left() -> None:
    over = {s for s in RunState if s.is_terminal}
    assert over == {RunState.CRASHED, RunState.DIED, RunState.ABORTED, RunState.STOPPED}
    assert {s for s in UnitState if s.is_terminal} == {UnitState.CRASHED, UnitState.STOPPED}


def node(name: str, alive: bool) -> HostResult[RunStatus]:
    host = Host(name, dict(DEFAULT_VARS), "kimi")
    return HostResult(host, RunStatus(RUN, alive=alive, health=200 if alive else None))


@pytest.mark.parametrize(
    ("alive", "state", "shown"),
    [
        ((True, True), UnitState.READY, "ready"),
        ((True, False), UnitState.DEGRADED, "degraded: bravo down"),
        ((False, True), UnitState.CRASHED, "crashed: alpha down"),
    ],
)
def test_a_units_state_is_a_word_and_the_nodes_down_a_list(
    alive: tuple[bool, bool], state: UnitState, shown: str
) -> None:
    unit = runs.Unit("kimi", [node("alpha", alive[0]), node("bravo", alive[1])])
    assert unit.state is state
    document = documents.unit_json(unit)
    assert document["state"] == state.value
    assert document["down"] == [
        n for n, up in zip(("alpha", "bravo"), alive, strict=True) if not up
    ]
    assert views.unit_text(unit.state.value, unit.down, len(unit.nodes)) == shown


def test_event_documents_are_their_kind_and_fields() -> None:
    event = WaitEnded(target="alpha", run="baseline_v1", state=RunState.READY.value, elapsed=2.5)
    document = documents.event_json(event)
    assert document == {
        "event": "wait_ended",
        "target": "alpha",
        "at": event.at,
        "run": "baseline_v1",
        "state": "ready",
        "elapsed": 2.5,
    }
    assert json.loads(json.dumps(document)) == document
    assert watch_text(event) is None  # watch shows supervision, not every wait


def test_watch_says_what_it_supervises_once_its_first_look_is_in() -> None:
    many = Watching(target="", deployments=3, hosts=2, unreadable=1, interval_s=10.0)
    assert watch_text(many) == (
        "watching 3 deployments on 2 hosts (1 unreadable), every 10s; "
        "Ctrl-C ends (servers keep running)"
    )
    one = Watching(target="", deployments=1, hosts=1, unreadable=0, interval_s=0.5)
    assert watch_text(one) == (
        "watching 1 deployment on 1 host, every 0.5s; Ctrl-C ends (servers keep running)"
    )
    line = {"schema": 1, **documents.event_json(one)}
    check_output(["watch", "--json"], 0, json.dumps(line) + "\n")
    with pytest.raises(AssertionError, match=r"watch\.json"):
        check_output(["watch", "--json"], 0, json.dumps({**line, "unreadable": "0"}) + "\n")


def test_host_text_reaches_the_terminal_with_its_control_characters_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.present.terminal import escaped, print_table, tagged

    hostile = "a\x1b]0;title\x07b\x1b[2Jc\td\x9be\r"
    assert escaped(hostile) == "a\\x1b]0;title\\x07b\\x1b[2Jc\td\\x9be\\x0d"
    print_table(None, ["host", "crash / last line"], [["h1", hostile]])
    assert tagged("error", hostile, "h1") == "h1: error: a\\x1b]0;title\\x07b\\x1b[2Jc d\\x9be\n"
    out = capsys.readouterr().out
    assert "\\x1b]0;title\\x07" in out and "\x1b" not in out and "\x07" not in out


def test_a_stop_says_whether_the_run_drained_or_was_cut_in_the_table_and_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.ops.runs import StopResult
    from deployctl.schema import versioned
    from tests.json_contract import check_agreement, problem, validator

    bravo = Host("bravo", dict(DEFAULT_VARS))
    drained = StopResult("baseline_v1", [42, 43], [], True, shutdown="drained", shutdown_s=6.25)
    cut = StopResult("baseline_v2", [44], [44], True, shutdown="cut", shutdown_s=40.0)
    stops = FleetResult([HostResult(HOST, drained), HostResult(bravo, cut)])
    document = views.STOP.document(stops)
    assert document["hosts"]["alpha"]["shutdown"] == "drained"
    assert document["hosts"]["alpha"]["shutdown_s"] == 6.25
    assert (document["hosts"]["bravo"]["shutdown"], document["hosts"]["bravo"]["killed"]) == (
        "cut",
        [44],
    )
    assert problem(versioned(document), validator(["stop", "--json"])) is None
    check_agreement(["stop", "--json"], 0, versioned(document))
    views.render_result(views.STOP, stops, as_json=False)
    out = capsys.readouterr().out
    assert "drained in 6.2s" in out and "cut after 40.0s" in out


def test_launch_replace_shows_each_stop_and_what_a_failed_stop_kept_from_starting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A multi-node server whose node bravo could not be stopped: neither node starts (a lone
    rank never rejoins its group); alpha's stop held and says so; the document validates."""
    from deployctl.errors import ConnectError
    from deployctl.ops.runs import StopResult
    from deployctl.schema import versioned
    from tests.json_contract import check_agreement, problem, validator

    bravo = Host("bravo", dict(DEFAULT_VARS))
    stops = FleetResult(
        [
            HostResult(HOST, StopResult("baseline_v1", [4242], [], True)),
            HostResult(bravo, exception=ConnectError("bravo: the SSH connection was lost")),
        ]
    )
    report = LaunchReport(FleetResult([]), FleetResult([]), refused=False, stops=stops)
    assert not report.ok
    document = views.LAUNCH.document(report)
    alpha_entry, bravo_entry = document["hosts"]["alpha"], document["hosts"]["bravo"]
    assert alpha_entry["ok"] is False and alpha_entry["stopped"]["run"] == "baseline_v1"
    assert alpha_entry["error"] == "not started: another node of its server could not be stopped"
    assert bravo_entry["ok"] is False and bravo_entry["code"] == "connect"
    stop = bravo_entry["stopped"]
    assert (stop["ok"], stop["code"]) == (False, "connect")
    assert bravo_entry["error"] == f"could not stop its run: {stop['error']}"
    assert problem(versioned(document), validator(["launch", "--json"])) is None
    check_agreement(["launch", "--json"], 1, versioned(document))
    views.render_result(views.LAUNCH, report, as_json=False)
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "alpha: stopped baseline_v1 (pids 4242)"
    assert "alpha: error: not started: another node of its server could not be stopped" in err
    assert "bravo: error: could not stop its run: " in err

    # Refused after the stops held (GPUs not clean after them): they stay stopped, and say so.
    refused = launched(RunState.READY)
    refused.outcomes, refused.refused, refused.stops = FleetResult([]), True, stops
    checked = refused.preflights[0].value
    assert checked is not None
    checked.problems.append("GPUs are not clean")
    views.render_result(views.LAUNCH, refused, as_json=False)
    err = capsys.readouterr().err
    assert "nothing was started on any host (the runs stopped above stay stopped)" in err
