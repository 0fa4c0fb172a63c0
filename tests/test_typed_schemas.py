"""The typed documents (deployctl/present/shapes/) and their shipped schemas are one
declaration: each typed shape's `$defs` entry in every file that ships it is what the generator
(tools/typed_schema.py) makes of its TypedDict, and the documents built from results validate.

No `from __future__ import annotations` here: the sample TypedDicts below have NotRequired keys.
"""

import dataclasses
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, TypedDict, get_args

import pytest
from jsonschema import Draft202012Validator

from deployctl.choices import PdRole
from deployctl.crash.model import CrashReport
from deployctl.errors import ConnectError, UsageError
from deployctl.events import Event, LogLine
from deployctl.facts import Gpu, GpuProcess
from deployctl.fanout import FleetResult, HostResult
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops import runs
from deployctl.ops.bench import BenchResult, Comparison, Suggestion
from deployctl.ops.canary import Decision
from deployctl.ops.gpus import GpuReport
from deployctl.ops.init import InitReport
from deployctl.ops.patch import (
    ActionKind,
    AuditReport,
    FileState,
    PatchAction,
    PatchState,
    SetState,
)
from deployctl.ops.rollout import UnitOutcome, UnitResult
from deployctl.ops.router import ListedWorker, Registration, RouterState, SyncResult, WorkerKind
from deployctl.patchset import load_patch_set
from deployctl.present import documents, shapes
from deployctl.project import SHIPPED_DATA
from deployctl.remote.measures import LiveSample, TuneRecord
from deployctl.remote.protocol import Placement
from tests.json_contract import SCHEMAS
from tests.test_canary import judged
from tests.test_init import host_of, survey_of
from tests.test_present import RUN, launched
from tests.test_rollout_schema import report as rollout_report
from tests.test_tune import level
from tests.test_tune_live import crossover_report, interval_of, live_record
from tools import contract
from tools.typed_schema import TypedSchemas


def shipped() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in SCHEMAS.glob("*.json")}


def disagreements(typed: TypedSchemas) -> list[str]:
    """Each (definition, file) whose shipped schema is not what the type generates."""
    files = shipped()
    found = []
    for name, schema in typed.definitions().items():
        for command, whole in files.items():
            if name in whole.get("$defs", {}) and whole["$defs"][name] != schema:
                found.append(f"{name} in {command}.json")
    return found


def test_each_typed_shape_is_shipped_as_its_type_generates_it() -> None:
    assert not disagreements(contract.TYPED), "run python -m tools.contract --write"
    defs = {name for whole in shipped().values() for name in whole.get("$defs", {})}
    assert set(contract.TYPED.named) <= defs  # each is shipped somewhere
    for name in contract.TYPED.named:
        assert contract.DEFINITIONS[name] == contract.TYPED.definitions()[name]


class WiderRegistration(shapes.Registration):
    drained: bool


class WiderStop(shapes.StopFields):
    drained: bool


class WiderStopDocument(TypedDict):
    hosts: dict[str, shapes.HostEntry[WiderStop]]


class NarrowerUnit(shapes.MultiNodeUnit):
    state: Literal[runs.UnitState.READY]  # type: ignore[misc]  # narrowed, as a mistake would


def test_a_type_that_differs_from_its_shipped_schema_is_found() -> None:
    # A key added to the type (or a value's type changed) and not regenerated.
    typed = contract.TYPED
    named = {**typed.named, "registration": WiderRegistration}
    wider = TypedSchemas(named, typed.keywords, typed.patterns, typed.given)
    assert set(disagreements(wider)) >= {"registration in stop.json", "registration in launch.json"}
    keywords = {**typed.keywords, "job": {}}  # additionalProperties dropped
    looser = TypedSchemas(typed.named, keywords, typed.patterns, typed.given)
    assert "job in status.json" in disagreements(looser)


def test_a_documents_fields_that_differ_from_its_shipped_entries_are_found() -> None:
    # A per-host document's fields: its outcome (`stopOutcome`) is generated from them, and
    # its host and deployment entries are named from the same type.
    typed = contract.TYPED
    named = {
        **typed.named,
        "stop": WiderStopDocument,
        **contract.per_host("stop", WiderStop),
        "stopped": shapes.Entry[shapes.StopFields],  # launch --replace's stop, named apart
    }
    found = disagreements(TypedSchemas(named, typed.keywords, typed.patterns, typed.given))
    assert "stopOutcome in stop.json" in found
    # An enum's values are the schema's: a state left out is found.
    named = {**typed.named, "multiNodeUnit": NarrowerUnit}
    found = disagreements(TypedSchemas(named, typed.keywords, typed.patterns, typed.given))
    assert {"multiNodeUnit in status.json", "multiNodeUnit in top.json"} <= set(found)
    # An entry named apart from its fields' outcome is refused.
    named = {**typed.named, "stopOutcome": shapes.Entry[WiderStop]}
    with pytest.raises(TypeError, match="stop: its entries are not those of StopFields"):
        TypedSchemas(named, typed.keywords, typed.patterns, typed.given).definitions()


# ---- the generator -----------------------------------------------------------------------


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Inner(TypedDict):
    """An inner object."""

    n: int


class Named(TypedDict):
    x: float


class Sample(TypedDict):
    """A sample of every construct.
    Its docstring is one line."""

    text: str
    count: Annotated[int, "How many.", {"minimum": 1}]
    ratio: float | None
    flag: bool
    maybe_flag: bool | None
    items: list[int] | None
    color: Color
    maybe_color: Color | None
    kind: Literal["a", "b"]
    ok: Literal[False]
    inner: Inner
    named: Named | None
    names: dict[str, list[Named]]
    free: dict[str, Any]
    later: NotRequired[Annotated[str, "Only sometimes."]]


def test_the_generator_maps_each_construct() -> None:
    schema = TypedSchemas({"named": Named}).definition(Sample, additionalProperties=False)
    assert schema == {
        "type": "object",
        "description": "A sample of every construct. Its docstring is one line.",
        "required": [
            "text", "count", "ratio", "flag", "maybe_flag", "items", "color", "maybe_color",
            "kind", "ok", "inner", "named", "names", "free",
        ],
        "properties": {
            "text": {"type": "string"},
            "count": {"type": "integer", "description": "How many.", "minimum": 1},
            "ratio": {"type": ["number", "null"]},
            "flag": {"type": "boolean"},
            "maybe_flag": {"type": ["boolean", "null"]},
            "items": {"type": ["array", "null"], "items": {"type": "integer"}},
            "color": {"enum": ["red", "blue"]},
            "maybe_color": {"enum": ["red", "blue", None]},
            "kind": {"enum": ["a", "b"]},
            "ok": {"const": False},
            "inner": {
                "type": "object",
                "description": "An inner object.",
                "required": ["n"],
                "properties": {"n": {"type": "integer"}},
            },
            "named": {"anyOf": [{"$ref": "#/$defs/named"}, {"type": "null"}]},
            "names": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": {"$ref": "#/$defs/named"}},
            },
            "free": {"type": "object"},
            "later": {"type": "string", "description": "Only sometimes."},
        },
        "additionalProperties": False,
    }  # fmt: skip
    Draft202012Validator.check_schema(schema)


def test_the_generator_refuses_what_it_cannot_say() -> None:
    class Keyed(TypedDict):
        by_number: dict[int, str]

    class Odd(TypedDict):
        value: complex

    with pytest.raises(TypeError, match="keys are strings"):
        TypedSchemas({}).definition(Keyed)
    with pytest.raises(TypeError, match="no JSON Schema"):
        TypedSchemas({}).definition(Odd)
    with pytest.raises(TypeError, match="not a TypedDict"):
        TypedSchemas({}).definition(dict)
    with pytest.raises(TypeError, match="not declared"):
        TypedSchemas({"named": Named}, keywords={"other": {}})


def test_a_not_required_key_read_as_required_is_refused() -> None:
    # Under `from __future__ import annotations` Python 3.11 counts a NotRequired key as
    # required: the generator says so rather than ship a wrong `required`.
    namespace: dict[str, Any] = {"__name__": __name__}
    exec(
        "from __future__ import annotations\n"
        "from typing import NotRequired, TypedDict\n"
        "class Late(TypedDict):\n"
        "    x: NotRequired[int]\n",
        namespace,
    )
    late = namespace["Late"]
    if "x" in late.__required_keys__:
        with pytest.raises(TypeError, match="NotRequired but required"):
            TypedSchemas({}).definition(late)
    else:  # a Python that reads it right: the key is not required
        assert "x" not in TypedSchemas({}).definition(late).get("required", [])


# ---- the typed documents, built from results, validate -----------------------------------


def shape_check(command: str, name: str) -> Draft202012Validator:
    schema = shipped()[command]
    return Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": schema["$defs"]})


def valid(command: str, name: str, document: Any) -> None:
    # As printed: enums are their values.
    errors = list(shape_check(command, name).iter_errors(json.loads(json.dumps(document))))
    assert not errors, [e.message for e in errors]


def test_the_typed_documents_validate_against_their_schemas() -> None:
    valid("stop", "failure", documents.failure_document(UsageError("no such inventory")))
    valid("stop", "registration", documents.registration_json(Registration("a/w", "r", "u", True)))
    valid("launch", "registration", documents.registration_json(Registration("a/w", "r", "u", False, "down")))  # fmt: skip
    job: Placement = {"id": "42", "state": "RUNNING", "reason": "", "nodes": ["n1"],
                      "head": "10.0.0.1", "time_left": None, "exit_code": ""}  # fmt: skip
    valid("status", "job", documents.job_json(job))
    crash = CrashReport("E", "boom", None, None, None, ("TP0",), 3, "sig", "T", "hint")
    valid("crash", "crashReport", crash.to_json())
    suggestion = Suggestion("base", "spec", [(1, 10.0, 20.0), (8, 80.0, 60.0)], 1, (1, 8))
    valid("bench", "suggestion", documents.suggestion_document(suggestion))
    sets = [load_patch_set(p) for p in sorted((SHIPPED_DATA / "patches").iterdir()) if p.is_dir()]
    assert sets
    valid("patch-list", "patchList", documents.patch_list_document(sets))
    state = SetState(PatchState.PARTLY, "1.0.0", "1.0.0", "a.py", True,
                     {"a.py": FileState.APPLIED, "b.py": FileState.MISSING})  # fmt: skip
    audit = documents.audit_json(AuditReport("0.5.0", {"set": state}, ("set",)))
    valid("patch-audit", "auditOutcome", {"ok": True, "error": None, "code": None, **audit})
    valid("rollout", "rollout", documents.rollout_document(rollout_report()))
    valid("rollout", "rollout", documents.rollout_document(rollout_report(dry_run=True)))


def test_the_per_host_documents_built_from_results_validate() -> None:
    alpha, bravo = Host("alpha", dict(DEFAULT_VARS)), Host("bravo", dict(DEFAULT_VARS))
    lost = ConnectError("bravo: the SSH connection was lost")
    looked = runs.RunStatus(RUN, alive=True, health=200, metrics_note="not asked")
    status = documents.status_document(
        FleetResult([HostResult(alpha, looked), HostResult(bravo, exception=lost)])
    )
    assert status["hosts"]["alpha"]["state"] == "ready"
    valid("status", "status", status)
    nodes = [
        HostResult(Host(name, dict(DEFAULT_VARS), "kimi"), runs.RunStatus(RUN, alive=up))
        for name, up in (("alpha", True), ("bravo", False))
    ]
    whole = documents.unit_json(runs.Unit("kimi", nodes))
    assert whole["state"] == "degraded"
    valid("status", "multiNodeUnit", whole)
    stop = runs.StopResult("baseline_v1", [42], [], True, shutdown="drained", shutdown_s=1.0)
    valid("stop", "stop", documents.hosts_document(FleetResult([HostResult(alpha, stop)]), documents.stop_json))  # fmt: skip
    gpus = GpuReport([Gpu(0, "GPU-0", "H200", 9000, 143000, 12)],
                     [GpuProcess(42, "python3", 9000, "GPU-0")], 1000, {42: "baseline_v1"})  # fmt: skip
    valid("gpus", "gpus", documents.per_host(documents.gpus_json)(FleetResult([HostResult(alpha, gpus)])))  # fmt: skip
    for state in runs.RunState:
        valid("launch", "launch", documents.launch_document(launched(state)))
    applied = PatchAction("set", "1.0.0", ActionKind.APPLIED, ["a.py"])
    actions = documents.per_host(documents.patch_actions_json)(FleetResult([HostResult(alpha, [applied])]))  # fmt: skip
    valid("patch-apply", "patchActions", actions)
    listed = [ListedWorker("http://10.0.0.2:30000", True, 0, "alpha/w", kind=WorkerKind(PdRole.PREFILL, 8998))]  # fmt: skip
    state = RouterState("r", "workers", listed, unknown={"http://u": "beta/w"}, pd=True)
    failed = Registration("alpha/w", "r", "http://10.0.0.3:30000", True, "refused")
    synced = SyncResult(state, [failed], kept=["http://u"])
    sync = documents.per_host(documents.sync_json)(FleetResult([HostResult(alpha, synced)]))
    assert sync["hosts"]["alpha"]["ok"] is False and sync["hosts"]["alpha"]["code"] == "error"
    assert sync["hosts"]["alpha"]["before"]["missing_roles"] == ["decode"]
    valid("router-sync", "sync", sync)
    sweep = {"deployment": None, "run": "baseline_v1", "levels": [level(1, 50.0), level(8, 300.0)]}
    benched = FleetResult([HostResult(alpha, BenchResult(sweep, "bench/1.json")), HostResult(bravo, exception=lost)])  # fmt: skip
    valid("bench", "sweep", documents.bench_document(benched))
    compared = Comparison({"baseline_v1": {**sweep, "at": 1.0}}, ["gone_v2"], {"bravo": lost})
    valid("bench", "comparison", documents.comparison_document(compared))
    lost = ConnectError("gpu2: the SSH connection was lost")
    surveyed = FleetResult([HostResult(host_of("gpu1"), survey_of()), HostResult(host_of("gpu2"), exception=lost)])  # fmt: skip
    init = documents.init_document(InitReport(surveyed, "all: {}\n", Path("inventory.yml")))
    assert init["hosts"]["gpu1"]["ok"] and not init["hosts"]["gpu2"]["ok"]
    valid("init", "init", init)


def event_keys(event: type[Event]) -> list[str]:
    """The keys documents.event_json gives an event: its kind, then its fields (an exception
    as its error, code and hint)."""
    keys = ["event"]
    for item in dataclasses.fields(event):
        keys += ["error", "code", "hint"] if item.name == "exception" else [item.name]
    return keys


@pytest.mark.parametrize("event", shapes.EVENT_SHAPES, ids=lambda e: e.__name__)
def test_each_events_type_has_the_keys_and_kind_its_document_has(event: type[Event]) -> None:
    typed = shapes.EVENT_SHAPES[event]
    assert sorted(typed.__annotations__) == sorted(event_keys(event))
    assert get_args(typed.__annotations__["event"]) == (event.kind,)


def test_an_events_field_that_its_type_lacks_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True)
    class Louder(LogLine):
        volume: int = 0

    assert sorted(event_keys(Louder)) != sorted(shapes.EventLogLine.__annotations__)
    # The check above, run on an event whose dataclass gained a field its type lacks, fails.
    monkeypatch.setitem(shapes.EVENT_SHAPES, Louder, shapes.EventLogLine)
    with pytest.raises(AssertionError):
        test_each_events_type_has_the_keys_and_kind_its_document_has(Louder)


@pytest.mark.parametrize("decision", [*Decision, None], ids=str)
def test_a_canarys_document_validates_and_its_words_are_the_types(
    decision: Decision | None,
) -> None:
    report = judged(decision)
    report.actions = [UnitResult("r1", UnitOutcome.REPLACED)]
    document = documents.canary_document(report)
    valid("canary", "canary", document)
    assert document["steps"][0]["step"] == ("promotion" if decision is Decision.PROMOTED else "rollback")  # fmt: skip
    assert list(shape_check("canary", "canary").iter_errors({**json.loads(json.dumps(document)), "state": "paused"}))  # fmt: skip


def test_a_live_window_and_a_kept_one_validate() -> None:
    report = crossover_report(interval_of(16, None, None))
    document = documents.tune_live_document(report)
    assert document["inventory_verdict"] == "too high"
    valid("tune", "tuneLive", document)
    samples = [LiveSample(side=side, running=1.5, value=100.0, requests=3, source=side)
               for _ in range(10) for side in ("plain", "speculative")]  # fmt: skip
    valid("tune", "liveRecord", documents.live_record_json(live_record(samples=samples)))
    ended = live_record(samples=samples, state="done", decision="reported", sizes=[1, 2, 4],
                        end_look={"always_valid": True, "error_share": 1.0})  # fmt: skip
    shown = documents.live_record_json(ended)
    assert shown["end_look"] == {"always_valid": True, "error_share": 1.0}
    valid("tune", "liveRecord", shown)


def test_a_port_report_and_a_note_validate() -> None:
    from deployctl.ops.port import HunkOutcome, PortReport

    hunks = [HunkOutcome("a.diff", "a.py", 1, "exact"), HunkOutcome("a.diff", "b.py", 2, "failed", "@@")]  # fmt: skip
    report = PortReport("spec-disable", "0.5.0", "0.5.1", "src", "out", hunks, {"v.sh": "passed"})
    assert report.to_json()["ok"] is False
    valid("patch-port", "port", report.to_json())
    valid("dashboard", "note", documents.note_document("wrote a new token"))


class WiderTuneRecord(shapes.TuneRecordShape):
    cost: float


def test_a_kept_records_type_must_name_the_protocols_keys() -> None:
    # A record is shown as its host keeps it: its document's type and the protocol's agree.
    contract.same_keys(shapes.TuneRecordShape, TuneRecord)
    with pytest.raises(TypeError, match="WiderTuneRecord and the protocol's TuneRecord differ"):
        contract.same_keys(WiderTuneRecord, TuneRecord)


def test_an_enum_value_outside_the_type_breaks_the_schema() -> None:
    state = SetState(PatchState.APPLIED, "1.0.0", "1.0.0")
    document: dict[str, Any] = {**documents.set_state_json(state)}
    valid("patch-audit", "setState", document)
    assert list(shape_check("patch-audit", "setState").iter_errors({**document, "state": "gone"}))
    unit: dict[str, Any] = {**documents.rollout_document(rollout_report())["units"][0]}
    assert list(shape_check("rollout", "rolloutUnit").iter_errors({**unit, "outcome": "done"}))
