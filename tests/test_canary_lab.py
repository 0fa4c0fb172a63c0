"""`deployctl canary` over real sshd hosts: two stand-in replicas behind the real router
(sglang-router 0.3.2), an open-loop Poisson load through it, the candidate's configuration a
model folder whose stand-in knobs make it slower, crash, or not differ."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from tests.canary_load import PoissonLoad
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, free_port, sh
from tests.test_lifecycle import prepare
from tests.test_router import real_router, router_vars, run_json

pytestmark = pytest.mark.lab

# 64 tokens at about 10 ms a step: a request lasts about a second, and 28 arrivals a second
# keep the two replicas at batches around 14 each: half the intervals at 16 and above.
KNOBS = {"startup_s": 0.05, "step_ms": 10.0, "per_req_ms": 0.5, "drain_s": 0.3}
RATE, TOKENS = 28.0, 64


def canary_fleet(lab: SSHLab, tmp_path: Path, candidate: dict[str, Any]) -> tuple[Path, int]:
    """alpha: the real router and replicas r1, r2 of the stand-in (model folder `model`);
    the folder `model-new` holds the candidate's knobs. The router's port."""
    alpha = lab.hosts["alpha"]
    variables = {**prepare(alpha, tp=1, **KNOBS), "template": "baseline"}
    new = alpha.home / "model-new"
    new.mkdir(exist_ok=True)
    (new / "standin.json").write_text(json.dumps({**KNOBS, **candidate}))
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", new)
    return router_fleet(lab, tmp_path, variables)


def router_fleet(
    lab: SSHLab,
    tmp_path: Path,
    variables: dict[str, Any],
    replicas: int = 2,
    replica_vars: dict[str, Any] | None = None,
    router_settings: dict[str, Any] | None = None,
) -> tuple[Path, int]:
    """alpha with `variables`: the real router (round robin, unless `router_settings` say
    otherwise) and replicas r1, r2, … behind it on GPUs 0, 1, … (each also with
    `replica_vars`). The inventory and the router's port."""
    alpha = lab.hosts["alpha"]
    router = {
        **router_vars(alpha.address, real_router()), "router_policy": "round_robin",
        **(router_settings or {}),
    }  # fmt: skip
    table: dict[str, Any] = {"router": router}
    for i in range(1, replicas + 1):
        table[f"r{i}"] = {
            "gpus": [i - 1],
            "port": free_port(alpha.address),
            "router": "alpha/router",
            **(replica_vars or {}),
        }
    variables["deployments"] = table
    alpha.set_gpus("live", replicas)
    return lab.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables}), router["port"]


def to_new_model(inv: Path, lab: SSHLab) -> None:
    """The inventory's configuration for every replica: the candidate's model folder."""
    document = yaml.safe_load(inv.read_text())
    for name, variables in document["all"]["hosts"]["alpha"]["deployments"].items():
        if name != "router":
            variables["model_path"] = str(lab.hosts["alpha"].home / "model-new")
    inv.write_text(yaml.safe_dump(document, sort_keys=False))


def runs(cli: CLI, inv: Path) -> dict[str, str]:
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    assert code == 0, err
    return {d: e["run"] for d, e in doc["hosts"]["alpha"]["deployments"].items()}


def canary_json(cli: CLI, inv: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    # The whole canary: a split, up to --max-duration of judging, a rollback or promotion.
    result = cli(
        "canary", "-i", str(inv), "--json", "--interval", "0.5", "--drain-timeout", "10",
        "--timeout", "60", *extra, timeout=480,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def judged(doc: dict[str, Any]) -> str:
    """The canary's measured margin, for a failing assertion."""
    return (
        f"{doc['decision']} ({doc['verdict']}): estimate {doc['estimate']} in [{doc['low']}, "
        f"{doc['high']}], max regression {doc['max_regression']}, {doc['samples']} samples "
        f"in {doc['elapsed_s']}s: {doc['reason']}; buckets {doc['buckets']}"
    )


def load_through(port: int, address: str, seed: int) -> PoissonLoad:
    return PoissonLoad(
        f"http://{address}:{port}", rate_per_s=RATE, max_in_flight=96, max_tokens=TOKENS,
        seed=seed, model="m",
    )  # fmt: skip


def test_a_candidate_15_percent_slower_at_batches_of_16_and_above_is_rolled_back(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # The rollback end to end; how small a regression is caught in how long is measured by
    # benchmarks/canary_lab.py (8 % here ended undecided in 240 s on a loaded 2-core
    # machine: estimate 1.062 in [1.026, 1.099] against the 5 % bound).
    slower = {"slowdown": {"factor": 1.15, "min_batch": 16}}
    inv, port = canary_fleet(hosts, tmp_path, slower)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    before = runs(cli, inv)
    to_new_model(inv, hosts)
    with load_through(port, hosts.hosts["alpha"].address, seed=1) as load:
        code, doc, err = canary_json(cli, inv, "--max-duration", "240")
    report = load.report()
    assert doc["decision"] == "rolled back" and doc["verdict"] == "regression", (
        f"{judged(doc)}; stderr: {err}"
    )
    assert code == 1 and doc["candidates"] == ["alpha/r1"] and doc["controls"] == ["alpha/r2"]
    assert doc["estimate"] is not None and doc["estimate"] > 1.0, judged(doc)
    assert any(b["bucket"] >= 16 and b["candidate_n"] for b in doc["buckets"]), doc["buckets"]
    after = runs(cli, inv)
    assert after["r2"] == before["r2"], (before, after)  # the control untouched
    assert after["r1"] not in (before["r1"], None)
    assert_back_on_the_old_model(cli, inv)
    assert report.failed == 0, report.errors[:3]
    # Kept on the router's host: found from a replica's name, as the run printed it.
    code, kept, err = run_json(cli, "canary", "-i", str(inv), "-d", "r1", "--report")
    found = kept["hosts"]["alpha"]["deployments"]["router"]
    assert code == 0 and found["numbers"] == [doc["canary"]], (found, err)
    record = found["record"]
    assert record["state"] == "done" and record["decision"] == "rolled back", record
    assert record["buckets"] == doc["buckets"] and record["samples"] == doc["samples"]
    steps = [(s["step"], s["unit"], s["outcome"]) for s in record["steps"]]
    assert steps == [("split", "alpha/r1", "replaced"), ("rollback", "alpha/r1", "replaced")]
    split, rollback = record["steps"]
    assert rollback["old_run"] == split["new_run"] and rollback["new_run"] == after["r1"]
    assert split["old_run"] == before["r1"]
    text = cli("canary", "-i", str(inv), "-d", "r1", "--report", str(doc["canary"]))
    assert "decision: rolled back" in text.stdout and "load bucket" in text.stdout, text.stdout
    missing = cli("canary", "-i", str(inv), "-d", "r1", "--report", "99")
    assert missing.returncode == 1 and "no canary 99 is kept here" in missing.stderr
    cli("stop", "-i", str(inv))


def test_a_candidate_three_times_slower_whose_load_never_meets_the_controls_is_rolled_back(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # Its requests stay so long that it holds many more of them than the control: no load
    # bucket is shared, and the verdict comes from the load itself (Little's law).
    inv, port = canary_fleet(hosts, tmp_path, {"slowdown": {"factor": 3.0, "min_batch": 1}})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    before = runs(cli, inv)
    to_new_model(inv, hosts)
    with load_through(port, hosts.hosts["alpha"].address, seed=5):
        code, doc, err = canary_json(cli, inv, "--max-duration", "120")
    assert doc["decision"] == "rolled back" and doc["verdict"] == "regression", (
        f"{judged(doc)}; stderr: {err}"
    )
    assert "running requests against the control's" in doc["reason"], judged(doc)
    assert doc["estimate"] is not None and doc["estimate"] > 1.5, f"bound 1.5: {judged(doc)}"
    assert code == 1 and runs(cli, inv)["r2"] == before["r2"]
    assert_back_on_the_old_model(cli, inv)
    cli("stop", "-i", str(inv))


def test_a_candidate_identical_to_the_control_is_never_rolled_back(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, port = canary_fleet(hosts, tmp_path, {})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    with load_through(port, hosts.hosts["alpha"].address, seed=2) as load:
        code, doc, err = canary_json(cli, inv, "--restart", "--max-duration", "60")
    assert doc["decision"] in ("promoted", "kept"), f"{judged(doc)}; stderr: {err}"
    assert doc["verdict"] in ("no_regression", "undecided"), judged(doc)
    assert code == 0, err
    assert load.report().failed == 0, load.report().errors[:3]
    cli("stop", "-i", str(inv))


def test_a_crashing_candidate_is_rolled_back_at_once(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, port = canary_fleet(hosts, tmp_path, {"crash": "after_ready", "crash_after_s": 8.0})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    before = runs(cli, inv)
    to_new_model(inv, hosts)
    code, planned, err = run_json(cli, "canary", "-i", str(inv), "--dry-run")
    assert code == 0 and planned["state"] == "planned" and planned["canary"] is None, err
    assert planned["candidates"] == ["alpha/r1"] and planned["controls"] == ["alpha/r2"]
    assert runs(cli, inv) == before  # a dry run changes nothing, keeps nothing
    missing = cli("canary", "-i", str(inv), "--report")
    assert missing.returncode == 1 and "no canary is kept here (kept: none)" in missing.stderr
    started = time.monotonic()
    with load_through(port, hosts.hosts["alpha"].address, seed=3):
        code, doc, err = canary_json(cli, inv, "--max-duration", "240")
    assert doc["decision"] == "rolled back" and code == 1, (doc, err)
    assert "alpha/r1 crashed" in doc["reason"], doc["reason"]
    took = time.monotonic() - started
    assert took < 120, f"took {took:.2f}s, bound 120s"
    after = runs(cli, inv)
    assert after["r2"] == before["r2"] and after["r1"] != before["r1"]
    assert_back_on_the_old_model(cli, inv)
    cli("stop", "-i", str(inv))


def test_ctrl_c_puts_the_canary_back(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv, port = canary_fleet(hosts, tmp_path, {})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    before = runs(cli, inv)
    to_new_model(inv, hosts)
    with load_through(port, hosts.hosts["alpha"].address, seed=4):
        # Text mode: the progress lines come on stderr, one a round, once the canary is judged.
        proc = cli.popen("canary", "-i", str(inv), "--interval", "0.5", "--max-duration", "300")
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=read_lines, args=(proc.stderr, lines), daemon=True).start()
        seen: list[str] = []
        while not any("matched samples" in line for line in seen):
            seen.append(lines.get(timeout=180))  # the split done: the canary is judged
        code, kept, err = run_json(cli, "canary", "-i", str(inv), "--report")
        running = kept["hosts"]["alpha"]["deployments"]["router"]["record"]
        assert code == 0 and running["state"] == "running", (running, err)
        assert running["decision"] is None and running["candidates"] == ["alpha/r1"]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    out, err = proc.stdout.read() if proc.stdout else "", "".join(seen)
    assert "decision: rolled back (interrupted)" in out, (out, err)
    assert proc.returncode != 0
    after = runs(cli, inv)
    assert after["r2"] == before["r2"] and after["r1"] != before["r1"], (before, after)
    assert_back_on_the_old_model(cli, inv)
    cli("stop", "-i", str(inv))


def test_a_canary_whose_router_dies_fails_naming_it_and_puts_the_canary_back(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """Killed while the canary is judged: no more traffic reaches the replicas, so the
    canary ends at once as failed (exit 1), naming the router, and r1 goes back on its
    previous run (serving; the router adds it back when it is launched again)."""
    inv, port = canary_fleet(hosts, tmp_path, {})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    before = runs(cli, inv)
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
    router_group = doc["hosts"]["alpha"]["deployments"]["router"]["pid"]
    with load_through(port, hosts.hosts["alpha"].address, seed=6):
        proc = cli.popen(
            "canary", "-i", str(inv), "--restart", "--interval", "0.5", "--max-duration", "300",
            "--drain-timeout", "10", "--timeout", "60",
        )  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=read_lines, args=(proc.stderr, lines), daemon=True).start()
        seen: list[str] = []
        while not any("matched samples" in line for line in seen):
            seen.append(lines.get(timeout=180))  # the split done: the canary is judged
        os.killpg(router_group, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=180)
    ended = time.monotonic() - killed
    out = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 1, (out, seen)
    assert "decision: failed (router alpha/router stopped answering: nothing answers on" in (out), (
        out
    )
    assert ended < 60, ended  # the rollback's own drain and start included
    code, kept, err = run_json(cli, "canary", "-i", str(inv), "--report")
    record = kept["hosts"]["alpha"]["deployments"]["router"]["record"]
    assert (record["state"], record["decision"]) == ("done", "failed"), record
    split, rollback = record["steps"]
    assert (rollback["step"], rollback["unit"], rollback["outcome"]) == (
        "rollback", "alpha/r1", "replaced"
    ), rollback  # fmt: skip
    assert rollback["error"].startswith("back on its previous run, not in its router: "), rollback
    code, status, _ = run_json(cli, "status", "-i", str(inv))
    after = status["hosts"]["alpha"]["deployments"]
    assert code == 1 and after["router"]["state"] != "ready", after["router"]  # it crashed
    assert after["r2"]["run"] == before["r2"], (before, after)  # the control untouched
    assert after["r1"]["run"] not in (before["r1"], split["new_run"]) and (
        after["r1"]["state"] == "ready"
    ), after["r1"]
    cli("stop", "-i", str(inv))


def read_lines(stream: IO[str] | None, into: queue.Queue[str]) -> None:
    for line in stream or ():
        into.put(line)


def assert_back_on_the_old_model(cli: CLI, inv: Path) -> None:
    """r1 serves its previous configuration again: a rollout would still change it, to the
    new model folder, as it would the control."""
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--dry-run")
    assert code == 0, err
    units = {u["unit"]: u for u in doc["units"]}
    for name in ("alpha/r1", "alpha/r2"):
        assert units[name]["changes"], units[name]
        assert any("model-new" in word for word in units[name]["command_diff"]), units[name]
    code, status, _ = run_json(cli, "status", "-i", str(inv), "-d", "r1")
    assert status["hosts"]["alpha"]["deployments"]["r1"]["state"] == "ready"
