"""The versioned --json contract: a schema shipped per command, and documents that match it.

Every CLI run in the tests checks its --json output (see json_contract.py); these tests check
the schemas themselves and the documents of commands that need no sshd host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer.main
from jsonschema import Draft202012Validator

from deployctl.cli import app
from deployctl.schema import SCHEMA_VERSION
from tests.conftest import CLI
from tests.json_contract import (
    ALWAYS_JSON,
    SCHEMAS,
    VARIANTS,
    check_agreement,
    check_document,
    check_output,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "inventories" / "example.yml"
LOGS = REPO / "tests" / "data" / "logs"


def json_commands() -> set[str]:
    """Every command that takes --json, named as its schema file is (`patch-list`, …)."""
    found: set[str] = set()

    def walk(group: Any, prefix: str) -> None:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a group: `patch`
                walk(command, f"{prefix}{name}-")
            elif any("--json" in param.opts for param in command.params):
                found.add(prefix + name)

    walk(typer.main.get_command(app), "")
    return found


def shipped() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in SCHEMAS.glob("*.json")}


def test_every_command_that_takes_json_has_a_schema() -> None:
    commands = json_commands()
    assert {"hosts", "patch-list", "status", "top", "bench"} <= commands  # the walk sees them
    assert sorted(commands - set(shipped())) == []
    # And no schema is left over from a command that went away.
    assert sorted(set(shipped()) - commands - ALWAYS_JSON) == []


@pytest.mark.parametrize("name", sorted(shipped()))
def test_each_schema_is_a_valid_draft_2020_12_schema(name: str) -> None:
    schema = shipped()[name]
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    if name in ALWAYS_JSON:
        return  # not our format: Prometheus reads it
    # The version is required, and any version ≥ 1 is accepted: a reader checks it itself.
    assert "schema" in schema["required"]
    assert schema["$defs"]["schemaVersion"] == {
        "description": schema["$defs"]["schemaVersion"]["description"],
        "type": "integer",
        "minimum": 1,
    }
    assert "additionalProperties" not in schema  # a key added is not a breaking change
    for variant in VARIANTS.get(name, {}).values():
        assert variant in schema["$defs"], variant


def test_the_schemas_ship_in_the_package() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'deployctl = ["data/**/*"]' in pyproject
    assert SCHEMAS == REPO / "deployctl" / "data" / "schemas"


# ---- documents of commands that need no sshd host --------------------------------------------


def document(cli: CLI, *args: str) -> dict[str, Any]:
    """Run a command with --json (the runner checks it against its schema) and parse it."""
    result = cli(*args, "--json")
    assert result.returncode in (0, 1), result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    assert doc["schema"] == SCHEMA_VERSION and next(iter(doc)) == "schema"
    return doc


def test_inventory_documents_match_their_schemas(cli: CLI) -> None:
    hosts = document(cli, "hosts", "-i", str(EXAMPLE))
    assert hosts["hosts"]["h200-a01"]["port"] == 22
    graph = document(cli, "hosts", "-i", str(EXAMPLE), "--graph")
    assert "h200-a01" in graph["groups"]["h200"]["hosts"]
    rendered = document(cli, "render", "-i", str(EXAMPLE), "-H", "h200-a01")
    assert rendered["hosts"]["h200-a01"]["ok"] is True
    # A host that fails to render keeps the shape: ok, error, code, hint.
    failed = document(cli, "render", "-i", str(EXAMPLE), "-H", "h200-a01", "-t", "nope")
    assert failed["hosts"]["h200-a01"]["code"] == "template"
    assert document(cli, "patch", "list")["patches"]


def test_crash_file_documents_match_their_schema(cli: CLI) -> None:
    doc = document(cli, "crash", "--file", str(LOGS / "tp8_spec_shape_mismatch.log"))
    assert doc["crashes"] and doc["crashes"][0]["ranks"]
    assert document(cli, "crash", "--file", str(LOGS / "healthy_ready.log"))["crashes"] == []


def kept_sweep(run: str, throughputs: dict[int, float]) -> dict[str, Any]:
    spread = {"p50": 1.0, "p99": 2.0}
    levels = [
        {"concurrency": c, "prompts": 2 * c, "completed": 2 * c, "failed": 0, "errors": [],
         "duration_s": 1.0, "output_tokens": 120 * c, "output_tokens_per_s": tps,
         "requests_per_s": 2.0, "ttft_ms": spread, "itl_ms": spread, "e2e_ms": spread}
        for c, tps in throughputs.items()
    ]  # fmt: skip
    return {"run": run, "deployment": None, "params": {"tool": "builtin"}, "levels": levels}


@pytest.mark.heavy
def test_documents_of_a_local_host_match_their_schemas(cli: CLI, tmp_path: Path) -> None:
    """bench --compare and --suggest-threshold read kept sweeps: here on this machine."""
    state = tmp_path / "state"
    sweeps = {"base_v1": {1: 50.0, 4: 180.0, 16: 600.0, 64: 900.0},
              "spec_v1": {1: 140.0, 4: 400.0, 16: 500.0, 64: 900.0}}  # fmt: skip
    for run, throughputs in sweeps.items():
        folder = state / "runs" / f"{run}.bench"
        folder.mkdir(parents=True)
        sweep = kept_sweep(run, throughputs)
        if run == "spec_v1":  # its own threshold: above 32 its curve is the baseline's
            sweep |= {"threshold": 32, "command": "sglang serve --speculative-algorithm EAGLE3"}
        (folder / "1.json").write_text(json.dumps(sweep))
    inv = tmp_path / "inv.yml"
    inv.write_text(
        f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      state_dir: {state}\n"
    )
    suggestion = document(cli, "bench", "-i", str(inv), "--suggest-threshold", "base_v1", "spec_v1")
    assert suggestion["threshold"] == 4 and suggestion["between"] == [4, 16]
    assert suggestion["speculative_threshold"] == 32 and suggestion["crossover_unresolved"]
    assert [level["wins"] for level in suggestion["levels"]] == [True, True, False, None]
    compared = document(cli, "bench", "-i", str(inv), "--compare", "base_v1,gone_v1")
    assert list(compared["runs"]) == ["base_v1"] and compared["missing"] == ["gone_v1"]
    # A host without a run still has a status document, and restart says it restarted none.
    status = document(cli, "status", "-i", str(inv))
    assert status["hosts"]["localhost"]["run"] is None
    restarted = document(cli, "restart", "-i", str(inv))
    assert restarted["restarted"] == [] and restarted["hosts"]["localhost"]["ok"]


def test_metrics_targets_stay_a_bare_prometheus_list(cli: CLI) -> None:
    result = cli("metrics-targets", "-i", str(EXAMPLE))  # checked against its schema too
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    assert isinstance(entries, list) and entries[0]["targets"]
    refused = cli("metrics-targets", "-i", str(EXAMPLE), "--json")
    assert refused.returncode == 2 and "--json" in refused.stderr


# ---- the checker can fail --------------------------------------------------------------------


STOPPED = {"ok": True, "error": None, "code": None, "run": None, "ended": [], "killed": [],
           "gpus_clean": True, "note": "", "shutdown": None, "shutdown_s": None}  # fmt: skip


def without(entry: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != key}


def test_a_document_missing_a_required_key_fails() -> None:
    good = {"schema": 1, "hosts": {"alpha": STOPPED}}
    check_document(["stop", "--json"], good)
    for broken, where in (
        ({"hosts": {"alpha": STOPPED}}, "'schema' is a required property"),
        ({"schema": 1, "hosts": {"alpha": {**STOPPED, "gpus_clean": "yes"}}}, "gpus_clean"),
        ({"schema": 1, "hosts": {"alpha": without(STOPPED, "ended")}}, "'ended' is a required"),
        ({"schema": 0, "hosts": {}}, "less than the minimum of 1"),
    ):
        with pytest.raises(
            AssertionError, match=r"document breaks data/schemas/stop\.json"
        ) as failed:
            check_document(["stop", "--json"], broken)
        assert where in str(failed.value)
    # A failed host needs none of the fields; a later schema version is accepted.
    down = {"ok": False, "error": "alpha: unreachable", "code": "connect", "hint": "check it"}
    check_document(["stop", "--json"], {"schema": 2, "hosts": {"alpha": down}})


def test_ok_error_and_code_must_agree_with_each_other_and_the_exit_status() -> None:
    down = {"ok": False, "error": "alpha: unreachable", "code": "connect"}
    check_output(["stop", "--json"], 1, json.dumps({"schema": 1, "hosts": {"alpha": down}}))
    check_output(["stop", "--json"], 0, json.dumps({"schema": 1, "hosts": {"alpha": STOPPED}}))
    for returncode, entry, why in (
        (1, {**down, "error": None, "code": None}, "failed without why"),
        (1, {**down, "code": None}, "failed without why"),
        (0, down, "exit 0 with a failed entry"),
        (0, {**STOPPED, "error": "stale"}, "ok with"),
    ):
        with pytest.raises(AssertionError, match=why):
            check_output(
                ["stop", "--json"],
                returncode,
                json.dumps({"schema": 1, "hosts": {"alpha": {**STOPPED, **entry}}}),
            )
    whole = {"schema": 1, "ok": True, "error": None, "code": None}
    with pytest.raises(AssertionError, match="ok=True, exit 1"):
        check_agreement(["tune", "--report", "--json"], 1, whole)


@pytest.mark.heavy
def test_a_refused_dry_run_says_why_in_json(cli: CLI, tmp_path: Path) -> None:
    """A preflight refusal is the host's failure: `ok` false with the problem and its code."""
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      state_dir: {tmp_path / 'state'}\n      log_dir: {tmp_path / 'logs'}\n"
        f"      model_path: {tmp_path / 'no-such-model'}\n"
    )
    result = cli("launch", "-i", str(inv), "--dry-run", "--json")  # agreement checked too
    assert result.returncode == 1, result.stderr
    entry = json.loads(result.stdout)["hosts"]["localhost"]
    assert entry["ok"] is False and entry["code"] == "preflight"
    assert entry["error"].startswith(entry["preflight"]["problems"][0])
    assert "no-such-model does not exist" in " ".join(entry["preflight"]["problems"])


def test_a_flag_narrows_the_document_to_its_variant() -> None:
    graph = {"schema": 1, "groups": {"all": {"children": [], "hosts": ["alpha"]}}}
    check_document(["hosts", "--graph", "--json"], graph)
    with pytest.raises(AssertionError, match="'hosts' is a required property"):
        check_document(["hosts", "--json"], graph)


def test_json_lines_are_checked_line_by_line() -> None:
    good = json.dumps({"schema": 1, "hosts": {}})
    check_output(["top", "--json"], 0, f"{good}\n{good}\n")
    with pytest.raises(AssertionError, match="'schema' is a required property"):
        check_output(["top", "--json"], 0, f"{good}\n{json.dumps({'hosts': {}})}\n")
    # `top --once` prints one (indented) document.
    check_output(["top", "--once", "--json"], 0, json.dumps({"schema": 1, "hosts": {}}, indent=2))


@pytest.mark.parametrize("name", sorted(set(shipped()) - ALWAYS_JSON))
def test_a_command_that_failed_as_a_whole_has_a_valid_document(name: str) -> None:
    failed = {"schema": 1, "ok": False, "error": "no such inventory", "code": "inventory"}
    check_document([name, "--json"], {**failed, "hint": None})
    with pytest.raises(AssertionError):
        check_document([name, "--json"], {**failed, "ok": True, "hint": None})


def test_event_lines_are_checked_against_their_kind() -> None:
    restarting = {"schema": 1, "event": "restarting", "target": "alpha", "at": 1.5,
                  "run": "eagle3_v1", "signature": "died", "attempt": 1, "down": []}  # fmt: skip
    check_output(["watch", "--json"], 0, json.dumps(restarting) + "\n")
    with pytest.raises(AssertionError, match=r"watch\.json"):
        check_output(["watch", "--json"], 0, json.dumps(without(restarting, "attempt")) + "\n")
    line = {"schema": 1, "event": "log_line", "target": "a", "at": 2.0, "line": "x", "crash": False}
    check_output(["logs", "-f", "--json"], 0, json.dumps(line) + "\n")
    with pytest.raises(AssertionError, match=r"logs\.json"):
        check_output(["logs", "-f", "--json"], 0, json.dumps({**line, "crash": "no"}) + "\n")


def test_a_tune_of_a_host_with_deployments_matches_its_schema(cli: CLI, tmp_path: Path) -> None:
    """A host entry with only `deployments` has no outcome, error or code of its own."""
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.inventory import Host
    from deployctl.ops.tune import Outcome, TuneOptions, TuneReport, TuneResult
    from deployctl.present.documents import kept_json, per_host, tune_document

    options = TuneOptions([1, 4])
    results = []
    for name, outcome in (("chat", Outcome.INTERRUPTED), ("code", Outcome.FAILED)):
        result = TuneResult("alpha", name, "patch", options, outcome=outcome, note="stopped")
        results.append(HostResult(Host("alpha", {}, name), result))
    tuned = tune_document(TuneReport(FleetResult(results), interrupted=True))
    assert set(tuned["hosts"]["alpha"]) == {"ok", "deployments"}
    check_document(["tune", "--json"], {"schema": 1, **tuned})
    # The plan (--dry-run) and the kept records (--report) of such a host too.
    inv = tmp_path / "inv.yml"
    host = {"ansible_host": "127.0.0.1", "ansible_port": 9, "model_path": "/m",
            "draft_model_path": "/d", "deployments": {"chat": {"port": 30000},
                                                      "code": {"port": 30001}}}  # fmt: skip
    inv.write_text(json.dumps({"all": {"hosts": {"far": host}}}))
    planned = cli("tune", "-i", str(inv), "--dry-run", "--json")  # checked by the cli fixture
    assert planned.returncode == 0, planned.stderr
    assert set(json.loads(planned.stdout)["hosts"]["far"]) == {"ok", "deployments"}
    from deployctl.ops.tune import KeptTune

    kept = [
        HostResult(Host("alpha", {}, n), KeptTune("tune", None, [], [], 2))
        for n in ("chat", "code")
    ]
    reported = per_host(kept_json)(FleetResult(kept))
    assert reported["hosts"]["alpha"]["ok"] is False
    check_document(["tune", "--report", "--json"], {"schema": 1, **reported})
