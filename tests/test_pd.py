"""Prefill/decode pairs deployed by deployctl: stand-ins in PD mode over real sshd hosts,
behind the real sglang-router 0.3.2 in PD mode. Launch registers each worker by role,
status shows roles and the router's view, streamed requests go through the pairs."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CLI
from tests.sglang_wheel import SGLANG_VERSION, claim_version, install_on
from tests.slurm_cluster import NODE_ADDRESSES, SlurmCluster
from tests.sshd_hosts import STANDIN, SSHLab, free_port
from tests.streamed import WatchJson, kind_in, watch_events
from tests.test_faults import wait_until
from tests.test_lifecycle import prepare
from tests.test_rollout import Load
from tests.test_router import (
    real_router,
    remove_by_hand,
    router_vars,
    run_json,
    stream_through,
)

pytestmark = pytest.mark.lab

# SGLang's PD timeouts, short: a lost prefill shows within a second or two.
FAST_PD_ENV = {
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.3",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}


def pd_fleet(
    lab: SSHLab,
    tmp_path: Path,
    prefills: int,
    decodes: int,
    knobs: dict[str, Any] | None = None,
    **changes: dict[str, Any],
) -> tuple[Path, dict[str, dict[str, Any]]]:
    """alpha runs the router (PD mode) and prefill p0; the other servers alternate between
    bravo and alpha, each on a GPU of its own. `knobs`: the stand-ins'; `changes`: per
    deployment, over its variables."""
    alpha, bravo = lab.hosts["alpha"], lab.hosts["bravo"]
    tables: dict[str, dict[str, Any]] = {"alpha": {}, "bravo": {}}
    tables["alpha"]["router"] = {**router_vars(alpha.address, real_router()), "pd": True}
    names = [f"p{i}" for i in range(prefills)] + [f"d{i}" for i in range(decodes)]
    used = {"alpha": 0, "bravo": 0}
    for index, name in enumerate(names):
        host = "alpha" if index % 2 == 0 else "bravo"
        address = lab.hosts[host].address
        port = free_port(address)
        tables[host][name] = {
            "role": "prefill" if name.startswith("p") else "decode",
            "gpus": [used[host]],
            "port": port,
            # Lab hosts are loopback addresses: the URL says the router reaches them there.
            "worker_url": f"http://{address}:{port}",
            "router": "alpha/router",
            "env": FAST_PD_ENV,
            **({"bootstrap_port": free_port(address)} if name.startswith("p") else {}),
            **changes.get(name, {}),
        }
        used[host] += 1
    # One model folder for every server, as a fleet's shared model store (each host's user
    # writes its stand-in's start records there).
    model = lab.base / f"model-{tmp_path.name}"
    model.mkdir(mode=0o1777)
    model.chmod(0o1777)
    (model / "standin.json").write_text(json.dumps({"startup_s": 0.3, **(knobs or {})}))
    (model / "standin-argv.jsonl").touch(mode=0o666)
    (model / "standin-argv.jsonl").chmod(0o666)
    variables = {}
    for name, host in (("alpha", alpha), ("bravo", bravo)):
        variables[name] = {
            **prepare(host, tp=1),
            "template": "baseline",
            "model_path": str(model),
            "pd_timeout": 5,
            "deployments": tables[name],
        }
        host.set_gpus("live", max(used[name], 1))
    tmp_path.mkdir(exist_ok=True)
    inv = lab.inventory(tmp_path / "inv.yml", ["alpha", "bravo"], variables)
    found = {f"{h}/{d}": v for h, t in tables.items() for d, v in t.items()}
    for entry in found.values():
        entry.setdefault("model_path", str(model))
    return inv, found


def router_port(table: dict[str, dict[str, Any]]) -> int:
    return int(table["alpha/router"]["port"])


def test_a_1p2d_fleet_registers_by_role_and_serves_streamed_requests(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, table = pd_fleet(hosts, tmp_path, prefills=1, decodes=2)
    alpha = hosts.hosts["alpha"]
    code, launched, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    added = {r["worker"] for r in launched["registrations"] if r["ok"]}
    assert added == {"alpha/p0", "bravo/d0", "alpha/d1"}, launched["registrations"]

    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
    state = doc["hosts"]["alpha"]["deployments"]["router"]["router"]
    assert state["pd"] and state["missing_roles"] == [] and not state["drift"], state
    roles = {w["deployment"]: (w["role"], w["bootstrap_port"]) for w in state["workers"]}
    assert roles == {
        "alpha/p0": ("prefill", table["alpha/p0"]["bootstrap_port"]),
        "bravo/d0": ("decode", None),
        "alpha/d1": ("decode", None),
    }
    human = cli("status", "-i", str(inv), "-d", "router")
    assert "alpha/router: 3 workers (1 prefill, 2 decode), 3 of ours healthy" in human.stdout
    # A canary judges decodes against decodes: the prefill times no token (SGLang's prefills
    # observe no TTFT or ITL), so it is neither canary nor control.
    code, planned, err = run_json(cli, "canary", "-i", str(inv), "--restart", "--dry-run")
    assert code == 0, err
    assert sorted([*planned["candidates"], *planned["controls"]]) == ["alpha/d1", "bravo/d0"]
    assert list(planned["not_judged"]) == ["alpha/p0"], planned
    for _ in range(4):  # round robin: each decode gets its prefill's KV
        assert stream_through(alpha.address, router_port(table)).rstrip().endswith("[DONE]")
    for label in ("bravo/d0", "alpha/d1"):
        assert "[standin] received KV for bootstrap_room=" in log_text(launched, label), label

    # Listed in the wrong role (a hand edit, another tool): drift that router sync mends.
    d0 = table["bravo/d0"]["worker_url"]
    reregister(alpha.address, router_port(table), d0, {"worker_type": "prefill"})
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
    state = doc["hosts"]["alpha"]["deployments"]["router"]["router"]
    assert state["drift"] and state["miscast"] == {d0: "bravo/d0"}, state
    human = cli("status", "-i", str(inv), "-d", "router")
    assert f"drift: bravo/d0 at {d0} serves as a decode but is listed otherwise" in human.stderr
    code, doc, err = run_json(cli, "router", "sync", "-i", str(inv))
    assert code == 0, err
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
    state = doc["hosts"]["alpha"]["deployments"]["router"]["router"]
    assert not state["drift"], state
    assert {w["deployment"]: w["role"] for w in state["workers"]}["bravo/d0"] == "decode"
    cli("stop", "-i", str(inv))


def reregister(address: str, port: int, url: str, body: dict[str, Any]) -> None:
    """Take `url` out of the router by hand and add it back as `body` says."""
    remove_by_hand(address, port, url)
    base = f"http://{address}:{port}"
    add = urllib.request.Request(
        f"{base}/workers", data=json.dumps({"url": url, **body}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    urllib.request.urlopen(add, timeout=10).close()
    for _ in range(100):
        with urllib.request.urlopen(f"{base}/workers", timeout=10) as reply:
            if any(w["url"] == url and w.get("is_healthy") for w in json.load(reply)["workers"]):
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} not listed again")


def log_text(launch_doc: dict[str, Any], label: str) -> str:
    host, deployment = label.split("/")
    return Path(launch_doc["hosts"][host]["deployments"][deployment]["log"]).read_text()


def started_servers(model_dir: Path) -> int:
    """How many stand-ins have started with this model (each start appends a line)."""
    return len((model_dir / "standin-argv.jsonl").read_text().splitlines())


def test_a_loopback_bootstrap_a_shared_bootstrap_port_mismatched_tp_or_no_ib_start_nothing(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    cases: list[tuple[str, dict[str, dict[str, Any]], str]] = [
        (
            "loopback",
            {"p0": {"bind_host": "127.0.0.1"}},
            "bravo/d0 cannot fetch KV from alpha/p0: its bootstrap server listens on "
            "loopback (127.0.0.1) (sglang#10001)",
        ),
        ("tp", {"d0": {"tp": 2, "gpus": [0, 1]}}, "bravo/d0 has TP 2 and alpha/p0 TP 1"),
        # The lab hosts have no InfiniBand.
        ("ib", {"d0": {"ib_device": "mlx5_0"}}, "InfiniBand device mlx5_0 (ib_device) is not on"),
    ]
    for name, changes, problem in cases:
        inv, table = pd_fleet(hosts, tmp_path / name, prefills=1, decodes=2, **changes)
        code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
        assert code == 1 and not doc["started"], (name, err)
        problems = [
            p
            for host in doc["hosts"].values()
            for entry in host["deployments"].values()
            for p in entry["preflight"]["problems"]
        ]
        assert any(p.startswith(problem) for p in problems), (name, problems)
        assert started_servers(Path(table["alpha/p0"]["model_path"])) == 0, name
    # Two prefills on one host with one bootstrap port: refused before any host is asked.
    shared = {"bootstrap_port": free_port(hosts.hosts["alpha"].address)}
    inv, table = pd_fleet(hosts, tmp_path / "port", prefills=3, decodes=1, p0=shared, p2=shared)
    result = cli("launch", "-i", str(inv))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    port = shared["bootstrap_port"]
    assert f"alpha/p2's bootstrap_port {port} is also alpha/p0's bootstrap_port" in result.stderr
    assert started_servers(Path(table["alpha/p0"]["model_path"])) == 0
    # A prefill launched alone, whose router (not in this launch) has another prefill but
    # no decode: its own check refuses it.
    inv, table = pd_fleet(hosts, tmp_path / "alone", prefills=2, decodes=0)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-d", "p0", "--timeout", "60")
    assert code == 1 and not doc["started"], err
    assert list(doc["hosts"]) == ["alpha"] and list(doc["hosts"]["alpha"]["deployments"]) == ["p0"]
    assert doc["hosts"]["alpha"]["deployments"]["p0"]["preflight"]["problems"] == [
        "alpha/p0 is a prefill, but no decode names its router alpha/router: nothing would serve"
    ]
    assert started_servers(Path(table["alpha/p0"]["model_path"])) == 0


def test_a_prefill_and_a_decode_on_two_sglang_versions_start_nothing(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inv, table = pd_fleet(hosts, tmp_path, prefills=1, decodes=1)
    document = yaml.safe_load(inv.read_text())
    for name in ("alpha", "bravo"):  # each server's python: a copy of the real SGLang venv
        python = install_on(hosts.hosts[name], sglang_template, standin=STANDIN)
        document["all"]["hosts"][name]["python"] = python
    inv.write_text(yaml.safe_dump(document, sort_keys=False))
    claim_version(hosts.hosts["bravo"], "0.5.22")
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 1 and not doc["started"], err
    problems = {
        f"{host}/{name}": entry["preflight"]["problems"]
        for host, found in doc["hosts"].items()
        for name, entry in found["deployments"].items()
    }
    assert problems == {
        "alpha/router": [],
        "alpha/p0": [
            "the servers behind router alpha/router would run different SGLang or patch sets: "
            f"alpha/p0 runs SGLang {SGLANG_VERSION} with no patch set; bravo/d0 runs SGLang "
            "0.5.22 with no patch set"
        ],
        "bravo/d0": [],
    }
    assert started_servers(Path(table["alpha/p0"]["model_path"])) == 0


def serves(address: str, port: int) -> bool:
    """Whether a streamed request through the router ends in full now."""
    try:
        return stream_through(address, port).rstrip().endswith("[DONE]")
    except OSError:  # refused, or the router's 503 while no pair is healthy
        return False


def test_a_prefill_killed_under_load_is_restarted_and_no_decode_is(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # Decodes fail their health for a while after they lose their prefill (sglang#12779),
    # with a failed request's traceback in their logs: what a supervisor takes for a crash.
    # For 15 s: a round of watch that restarts the prefill holds up the next look at the
    # decodes (19 s at load 16, when a decode's 6 s had passed unseen).
    knobs = {"pd_health_fail_s": 15, "request_error": True, "crash_after_s": 0.2}
    inv, table = pd_fleet(hosts, tmp_path, prefills=1, decodes=2, knobs=knobs)
    code, launched, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    alpha = hosts.hosts["alpha"]
    p0 = launched["hosts"]["alpha"]["deployments"]["p0"]["pid"]

    def prefill_back_and_decodes_held(evs: list[dict[str, Any]]) -> bool:
        kinds = {(e["event"], e["target"]) for e in evs}
        held = {t for kind, t in kinds if kind == "decode_held"}
        return ("replaced", "alpha/p0") in kinds and held == {"bravo/d0", "alpha/d1"}

    with Load(alpha.address, router_port(table), streams=2, max_tokens=4):
        watch = WatchJson(cli, inv, "--timeout", "30", "--pd-window", "30")
        try:
            watch.started()  # its first look saw the pair serve; the kill comes after
            os.killpg(p0, signal.SIGKILL)
            watch.until(prefill_back_and_decodes_held, 90)
        finally:
            events = watch.stop()
    restarted = [e["target"] for e in events if e["event"] == "restarting"]
    assert restarted == ["alpha/p0"], events
    held = [e for e in events if e["event"] == "decode_held"]
    assert {e["target"] for e in held} == {"bravo/d0", "alpha/d1"}, events
    assert all(e["prefill"] == "alpha/p0" and e["window_s"] == 30 for e in held), held
    replaced = next(e for e in events if e["event"] == "replaced")
    assert replaced["state"] == "ready", replaced
    # The pair serves again, through the new prefill (once the decodes' health is back).
    wait_until(lambda: serves(alpha.address, router_port(table)), 30, interval=1)
    cli("stop", "-i", str(inv))


def test_a_stuck_transfer_is_reported_by_watch(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    # The decode accepts requests and never gets their KV: they wait in its transfer queue.
    slow = {"pd_timeout": 60}
    inv, table = pd_fleet(
        hosts, tmp_path, prefills=1, decodes=1, knobs={"stuck_transfer": True}, d0=slow, p0=slow
    )
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    with Load(hosts.hosts["alpha"].address, router_port(table), streams=1):
        try:
            events = watch_events(
                cli, inv, kind_in("stuck_transfer"), 60, "--timeout", "30", "--stuck-after", "2"
            )
        finally:
            cli("stop", "-i", str(inv))  # ends the requests that wait
    stuck = [e for e in events if e["event"] == "stuck_transfer"]
    assert [e["target"] for e in stuck] == ["bravo/d0"], events
    assert stuck[0]["waiting"] >= 1 and stuck[0]["stuck_s"] >= 2, stuck
    assert not [e for e in events if e["event"] == "restarting"], events


def roles_serving(address: str, port: int) -> tuple[int, int]:
    """How many healthy prefills and decodes the router lists now."""
    with urllib.request.urlopen(f"http://{address}:{port}/workers", timeout=10) as reply:
        workers = json.load(reply)["workers"]
    healthy = [w["worker_type"] for w in workers if w.get("is_healthy")]
    return healthy.count("prefill"), healthy.count("decode")


def rewrite_workers(inv: Path, change: dict[str, Any]) -> None:
    document = yaml.safe_load(inv.read_text())
    for host in document["all"]["hosts"].values():
        for name, variables in host["deployments"].items():
            if name != "router":
                variables.update(change)
    inv.write_text(yaml.safe_dump(document, sort_keys=False))


def test_a_rollout_of_2p2d_under_load_loses_no_request_and_never_empties_a_role(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    knobs = {"step_ms": 20.0, "per_req_ms": 0.5, "drain_s": 0.5}
    inv, table = pd_fleet(hosts, tmp_path, prefills=2, decodes=2, knobs=knobs)
    code, launched, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    assert len([r for r in launched["registrations"] if r["ok"]]) == 4
    address, port = hosts.hosts["alpha"].address, router_port(table)
    # Two prefills out at once would leave none: refused, nothing touched.
    rewrite_workers(inv, {"mem_fraction_static": 0.8})
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--max-unavailable", "2")
    assert code == 1, err
    first = {u["unit"]: u for u in doc["units"]}
    assert first["alpha/p0"]["outcome"] == "refused", first
    assert "would have no healthy prefill left" in first["alpha/p0"]["error"], first
    samples: list[tuple[int, int]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            samples.append(roles_serving(address, port))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with Load(address, port) as load:
            time.sleep(1)
            code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--drain-timeout", "30")
            time.sleep(1)
    finally:
        sampling.set()
        sampler.join(timeout=30)
    assert code == 0, err
    order = [u["unit"] for u in doc["units"] if u["outcome"] == "replaced"]
    assert order == ["alpha/p0", "bravo/p1", "alpha/d0", "bravo/d1"], doc["units"]
    assert load.failed == [] and len(load.done) > 10, (load.failed[:3], len(load.done))
    assert samples and min(p for p, _ in samples) >= 1 and min(d for _, d in samples) >= 1, sorted(
        set(samples)
    )
    assert roles_serving(address, port) == (2, 2)
    cli("stop", "-i", str(inv))


def test_a_pd_pair_runs_as_two_slurm_jobs_behind_a_router(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    job = {
        "launcher": "slurm",
        "python": "/usr/bin/python3",
        "bind_host": "0.0.0.0",  # the stand-in binds its node's address (bind_by_node)
        "slurm_time": "30:00",
        "router": "alpha/router",
        "env": FAST_PD_ENV,
    }
    port, bootstrap, decode_port = (free_port(NODE_ADDRESSES["n1"]) for _ in range(3))
    table = {
        "router": {**router_vars(alpha.address, real_router()), "pd": True},
        "p0": {**job, "role": "prefill", "port": port, "bootstrap_port": bootstrap},
        "d0": {**job, "role": "decode", "port": decode_port},
    }
    variables = {
        **prepare(alpha, tp=1, bind_by_node=NODE_ADDRESSES),
        "template": "baseline",
        "deployments": table,
    }
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    code, launched, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "90")
    assert code == 0, err
    jobs = {d: e["job"]["id"] for d, e in launched["hosts"]["alpha"]["deployments"].items()
            if e.get("job")}  # fmt: skip
    assert sorted(jobs) == ["d0", "p0"] and len(set(jobs.values())) == 2, jobs
    assert {r["worker"] for r in launched["registrations"] if r["ok"]} == {"alpha/p0", "alpha/d0"}
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
    state = doc["hosts"]["alpha"]["deployments"]["router"]["router"]
    roles = {w["deployment"]: (w["role"], w["bootstrap_port"]) for w in state["workers"]}
    assert roles == {"alpha/p0": ("prefill", bootstrap), "alpha/d0": ("decode", None)}, state
    assert stream_through(alpha.address, table["router"]["port"]).rstrip().endswith("[DONE]")
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err
    assert slurm_lab.active_jobs() == []
