"""`deployctl rollout` over the real router (sglang-router 0.3.2) and stand-in workers on real
sshd hosts: steady streamed load through the router during the rollout, and every request
must end with `[DONE]`."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CLI
from tests.sshd_hosts import STANDIN, SSHLab
from tests.test_router import (
    fleet,
    real_router,
    router_entry,
    router_vars,
    run_json,
    stream_text,
    url_of,
)

pytestmark = pytest.mark.lab

# Slow enough that requests are in flight whenever a worker is taken out (16 tokens at
# 20 ms a step: about 0.35 s a request), fast enough for a short test.
KNOBS = {"step_ms": 20.0, "per_req_ms": 0.5, "drain_s": 0.5}


class Load:
    """Streams completions through the router from `streams` threads until stopped."""

    def __init__(self, address: str, port: int, streams: int = 3, max_tokens: int = 16) -> None:
        self.url = f"{url_of(address, port)}/v1/completions"
        self.max_tokens = max_tokens
        self.done: list[float] = []  # seconds each finished request took
        self.failed: list[str] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._stream, daemon=True) for _ in range(streams)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _stream(self) -> None:
        body = {"model": "m", "prompt": "hi", "max_tokens": self.max_tokens, "stream": True}
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                text = stream_text(self.url, body)
            except OSError as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}")
                continue
            if text.rstrip().endswith("data: [DONE]"):
                self.done.append(time.monotonic() - started)
            else:
                self.failed.append(f"no [DONE]: {text[-200:]!r}")


def rewrite(inv: Path, change: dict[str, Any]) -> None:
    """Give every worker of the inventory new variables (the router keeps its own)."""
    document = yaml.safe_load(inv.read_text())
    table = document["all"]["hosts"]["alpha"]["deployments"]
    for name, variables in table.items():
        if name != "router":
            variables.update(change)
    inv.write_text(yaml.safe_dump(document, sort_keys=False))


def serving(
    lab: SSHLab, cli: CLI, tmp_path: Path, workers: int, **extra: Any
) -> tuple[Path, dict[str, Any]]:
    """`fleet()` launched to ready: a router and `workers` stand-ins registered with it."""
    inv, table = fleet(lab, tmp_path, workers=workers, knobs=KNOBS, **extra)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    return inv, table


def healthy_workers(cli: CLI, inv: Path) -> list[str]:
    listed = router_entry(cli, inv)
    assert not listed["drift"], listed
    return sorted(w["deployment"] for w in listed["workers"] if w["healthy"])


def test_a_rollout_of_three_workers_under_load_loses_no_request(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    address = hosts.hosts["alpha"].address
    inv, table = serving(hosts, cli, tmp_path, 3)
    rewrite(inv, {"mem_fraction_static": 0.8})

    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--dry-run")
    assert code == 0, err
    planned = {u["unit"]: u for u in doc["units"]}
    assert not planned["alpha/router"]["changes"]
    assert planned["alpha/w1"]["command_diff"] == ["+--mem-fraction-static=0.8"]
    assert planned["alpha/w2"]["router"] == "alpha/router"

    with Load(address, table["router"]["port"]) as load:
        time.sleep(1.0)
        code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--drain-timeout", "30")
        time.sleep(1.0)
    assert code == 0, err
    outcomes = {u["unit"]: (u["outcome"], u["new_run"]) for u in doc["units"]}
    assert outcomes == {
        "alpha/router": ("skipped", None),
        "alpha/w1": ("replaced", "w1_baseline_v2"),
        "alpha/w2": ("replaced", "w2_baseline_v2"),
        "alpha/w3": ("replaced", "w3_baseline_v2"),
    }, err
    assert all(u["drained"] for u in doc["units"] if u["outcome"] == "replaced")
    assert load.failed == [] and len(load.done) > 10, (load.failed[:3], len(load.done))
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2", "alpha/w3"]
    # Run again: everything matches now; restart --rolling replaces them anyway.
    code, doc, err = run_json(cli, "rollout", "-i", str(inv))
    assert code == 0 and {u["outcome"] for u in doc["units"]} == {"skipped"}, err
    code, doc, err = run_json(cli, "restart", "--rolling", "-i", str(inv), "-d", "w2")
    assert code == 0, err
    assert [(u["outcome"], u["new_run"]) for u in doc["units"]] == [("replaced", "w2_baseline_v3")]
    # Two at a time: the third serves meanwhile.
    rewrite(inv, {"mem_fraction_static": 0.7})
    with Load(address, table["router"]["port"]) as load:
        code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--max-unavailable", "2")
    assert code == 0, err
    replaced = sorted(u["new_run"] for u in doc["units"] if u["outcome"] == "replaced")
    assert replaced == ["w1_baseline_v3", "w2_baseline_v4", "w3_baseline_v3"], doc["units"]
    assert load.failed == [] and load.done, load.failed[:3]
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2", "alpha/w3"]
    cli("stop", "-i", str(inv))


def test_a_rollout_whose_new_config_crashes_stops_there_with_every_worker_serving(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv, table = serving(hosts, cli, tmp_path, 3)
    bad = alpha.home / "bad-model"
    bad.mkdir()
    (bad / "standin.json").write_text(json.dumps({"startup_s": 0.3, "crash": "startup"}))
    subprocess.run(["chown", "-R", f"{alpha.user}:{alpha.user}", str(bad)], check=True)
    rewrite(inv, {"model_path": str(bad)})

    with Load(alpha.address, table["router"]["port"]) as load:
        code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--drain-timeout", "30")
    assert code == 1, err
    units = {u["unit"]: u for u in doc["units"]}
    failed = units["alpha/w1"]
    assert failed["outcome"] == "failed" and failed["state"] == "ready", failed
    assert failed["crash"]["exception"], failed
    # Back on its previous configuration, under a new log version, and in its router.
    assert failed["new_run"] == "w1_baseline_v3", failed
    assert units["alpha/w2"]["outcome"] == units["alpha/w3"]["outcome"] == "not reached"
    assert load.failed == [] and load.done, load.failed[:3]
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2", "alpha/w3"]
    human = cli("rollout", "-i", str(inv), "--drain-timeout", "30")
    assert human.returncode == 1
    assert "rollout stopped at alpha/w1" in human.stderr, human.stderr
    cli("stop", "-i", str(inv))


def test_a_routers_last_worker_is_refused_unless_downtime_is_allowed(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, _ = serving(hosts, cli, tmp_path, 1)
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--restart", "-d", "w1")
    assert code == 1
    (unit,) = doc["units"]
    assert unit["outcome"] == "refused" and unit["old_run"] == "w1_baseline_v1"
    assert unit["error"] == (
        "alpha/router would have no healthy worker left while alpha/w1 is replaced"
    )
    assert healthy_workers(cli, inv) == ["alpha/w1"]  # untouched
    code, doc, _ = run_json(cli, "restart", "--rolling", "-i", str(inv))
    # The router comes last, and is not reached once its worker is refused.
    outcomes = [(u["unit"], u["outcome"]) for u in doc["units"]]
    assert code == 1 and outcomes == [("alpha/w1", "refused"), ("alpha/router", "not reached")]
    code, doc, err = run_json(
        cli, "rollout", "-i", str(inv), "--restart", "-d", "w1", "--allow-downtime"
    )
    assert code == 0, err
    assert doc["units"][0]["outcome"] == "replaced"
    assert doc["units"][0]["new_run"] == "w1_baseline_v2"
    assert healthy_workers(cli, inv) == ["alpha/w1"]
    cli("stop", "-i", str(inv))


def test_ctrl_c_while_a_worker_drains_puts_it_back_in_its_router_and_starts_no_other(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    address = hosts.hosts["alpha"].address
    inv, table = serving(hosts, cli, tmp_path, 2)
    rewrite(inv, {"mem_fraction_static": 0.8})
    # A long request straight to w1 keeps it busy: its drain waits for it.
    long_body = {"model": "m", "prompt": "hi", "max_tokens": 400, "stream": True}
    w1_url = f"{url_of(address, table['w1']['port'])}/v1/completions"
    answers: list[str] = []
    busy = threading.Thread(
        target=lambda: answers.append(stream_text(w1_url, long_body)), daemon=True
    )
    busy.start()
    rolling = cli.popen("rollout", "-i", str(inv), "--json", "--drain-timeout", "60")
    router = url_of(address, table["router"]["port"])
    deadline = time.monotonic() + 60
    while registered(router) != [url_of(address, table["w2"]["port"])]:
        assert time.monotonic() < deadline, "w1 was never taken out of its router"
        time.sleep(0.1)
    rolling.send_signal(signal.SIGINT)
    out, err = rolling.communicate(timeout=120)
    assert rolling.returncode == 130, err
    doc = json.loads(out)
    units = {u["unit"]: u for u in doc["units"]}
    assert doc["interrupted"] and units["alpha/w1"]["outcome"] == "undone", err
    assert units["alpha/w2"]["outcome"] == "not reached"
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2"]
    _, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "w1")
    assert doc["hosts"]["alpha"]["deployments"]["w1"]["run"] == "w1_baseline_v1"
    busy.join(timeout=60)
    assert answers and answers[0].rstrip().endswith("data: [DONE]"), answers
    cli("stop", "-i", str(inv))


def registered(router: str) -> list[str]:
    with urllib.request.urlopen(f"{router}/workers", timeout=10) as reply:
        return sorted(w["url"] for w in json.load(reply)["workers"])


def test_patch_apply_rolling_patches_each_worker_while_it_is_out_of_its_router(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    from tests.sglang_wheel import install_on

    python = install_on(hosts.hosts["alpha"], sglang_template, standin=STANDIN)
    inv, table = serving(hosts, cli, tmp_path, 2, worker_python=python)
    with Load(hosts.hosts["alpha"].address, table["router"]["port"]) as load:
        code, doc, err = run_json(
            cli, "patch", "apply", "spec-disable", "--rolling", "-i", str(inv), "-d", "w1"
        )
        assert code == 0, err
        code, doc2, err = run_json(
            cli, "patch", "apply", "spec-disable", "--rolling", "-i", str(inv), "-d", "w2"
        )
        assert code == 0, err
    (w1,), (w2,) = doc["units"], doc2["units"]
    assert w1["reasons"] == ["alpha/w1: patches (apply spec-disable 1.2.0)"]
    assert [p["action"] for p in w1["patches_done"]] == ["applied"]
    # One SGLang installation on alpha: the second worker finds the set applied already.
    assert [p["action"] for p in w2["patches_done"]] == ["unchanged"]
    assert (w1["new_run"], w2["new_run"]) == ("w1_baseline_v2", "w2_baseline_v2")
    assert load.failed == [] and load.done, load.failed[:3]
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2"]
    cli("stop", "-i", str(inv))


def test_a_multi_node_worker_registers_rank_0_and_is_replaced_as_one_unit(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    from tests.test_multinode import group_inventory

    inv = group_inventory(hosts, tmp_path, ["alpha", "bravo"], **KNOBS)
    document = yaml.safe_load(inv.read_text())
    alpha, charlie = hosts.hosts["alpha"], hosts.hosts["charlie"]
    url = url_of(alpha.address, document["all"]["hosts"]["alpha"]["port"])
    kimi = document["all"]["children"]["kimi"]["vars"]["deployments"]["kimi"]
    kimi.update(router="charlie/router", worker_url=url)
    router = router_vars(charlie.address, real_router())
    document["all"]["hosts"]["charlie"] = {
        **charlie.inventory_vars(hosts.client_key),
        "bind_host": charlie.address,
        "deployments": {"router": router},
    }
    inv.write_text(yaml.safe_dump(document, sort_keys=False))
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    assert [(r["worker"], r["url"]) for r in doc["registrations"]] == [("alpha/kimi", url)]
    code, doc, err = run_json(cli, "status", "-i", str(inv), "-H", "charlie")
    listed = doc["hosts"]["charlie"]["deployments"]["router"]["router"]
    assert [(w["deployment"], w["url"]) for w in listed["workers"]] == [("alpha/kimi", url)]

    kimi["mem_fraction_static"] = 0.8
    inv.write_text(yaml.safe_dump(document, sort_keys=False))
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "-H", "alpha,bravo")
    assert code == 1 and doc["units"][0]["outcome"] == "refused", err  # its router's only one
    code, doc, err = run_json(
        cli, "rollout", "-i", str(inv), "-H", "alpha,bravo", "--allow-downtime"
    )
    assert code == 0, err
    (unit,) = doc["units"]
    assert unit["unit"] == "kimi (alpha, bravo)" and unit["outcome"] == "replaced", unit
    assert unit["reasons"] == ["alpha/kimi: command", "bravo/kimi: command"]
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-H", "alpha,bravo")
    runs = {n: doc["hosts"][n]["deployments"]["kimi"]["run"] for n in ("alpha", "bravo")}
    assert runs == {"alpha": "kimi_baseline_v2", "bravo": "kimi_baseline_v2"}
    code, doc, err = run_json(cli, "status", "-i", str(inv), "-H", "charlie")
    listed = doc["hosts"]["charlie"]["deployments"]["router"]["router"]
    assert [w["url"] for w in listed["workers"] if w["healthy"]] == [url], listed
    cli("stop", "-i", str(inv))


def test_a_unit_whose_host_fails_after_its_stop_goes_back_to_its_previous_run(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The workers' python has no SGLang: the patch set cannot be applied once w1 is down."""
    inv, table = serving(hosts, cli, tmp_path, 2)
    with Load(hosts.hosts["alpha"].address, table["router"]["port"]) as load:
        code, doc, err = run_json(
            cli, "patch", "apply", "spec-disable", "--rolling", "-i", str(inv)
        )
    assert code == 1, err
    units = {u["unit"]: u for u in doc["units"]}
    w1 = units["alpha/w1"]
    assert w1["outcome"] == "failed" and "SGLang" in w1["error"], w1
    assert (w1["state"], w1["new_run"]) == ("ready", "w1_baseline_v2"), w1
    assert units["alpha/w2"]["outcome"] == "not reached"
    assert load.failed == [] and load.done, load.failed[:3]
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2"]
    cli("stop", "-i", str(inv))
