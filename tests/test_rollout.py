"""`deployctl rollout` over the real router (sglang-router 0.3.2) and stand-in workers on real
sshd hosts: steady streamed load through the router during the rollout, and every request
must end with `[DONE]`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CLI
from tests.router_venv import legacy_router_python
from tests.sshd_hosts import STANDIN, SSHLab
from tests.test_lifecycle import prepare
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
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, (err, doc)  # under --json, why is in the document
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
    # A long request straight to w1 keeps it busy: its drain waits for it (about 24 s: on a
    # loaded machine the rollout's plan alone has taken longer than 8).
    long_body = {"model": "m", "prompt": "hi", "max_tokens": 1200, "stream": True}
    w1_url = f"{url_of(address, table['w1']['port'])}/v1/completions"
    answers: list[str] = []
    busy = threading.Thread(
        target=lambda: answers.append(stream_text(w1_url, long_body)), daemon=True
    )
    busy.start()
    rolling = cli.popen("rollout", "-i", str(inv), "--json", "--drain-timeout", "60")
    router = url_of(address, table["router"]["port"])
    wait_until_taken_out(router, url_of(address, table["w1"]["port"]))
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
    busy.join(timeout=120)
    assert answers and answers[0].rstrip().endswith("data: [DONE]"), answers
    cli("stop", "-i", str(inv))


def test_a_second_ctrl_c_during_a_start_leaves_at_once(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The first Ctrl-C lets the unit in hand finish its start (40 s here); the second leaves
    at once, with the router lock's release on the way out (tune's twin: test_tune.py)."""
    inv, _ = serving(hosts, cli, tmp_path, 2)
    knobs = hosts.hosts["alpha"].home / "model" / "standin.json"
    knobs.write_text(json.dumps({**json.loads(knobs.read_text()), "startup_s": 40}))
    rewrite(inv, {"mem_fraction_static": 0.8})
    rolling = cli.popen("rollout", "-i", str(inv), "--timeout", "120", "--drain-timeout", "5")
    runs = hosts.hosts["alpha"].home / ".deployctl" / "runs"
    # w1's new run is starting (40 s to its ready line)
    interrupt_twice_during_a_start(cli, inv, rolling, runs / "w1_baseline_v2*.json")


def interrupt_twice_during_a_start(
    cli: CLI, inv: Path, proc: subprocess.Popen[str], run: Path
) -> None:
    """Ctrl-C once a run record matching `run` (a glob) is written, its start under way, and
    again half a second later: the second must end the command at once (exit 130, within
    5 s). The inventory's runs are stopped afterwards."""
    try:
        deadline = time.monotonic() + 60
        while not list(run.parent.glob(run.name)) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        left = time.monotonic() - began
        assert proc.returncode == 130, err
        assert left < 5, f"the second Ctrl-C took {left:.2f}s to leave, bound 5s: {err}"
    finally:
        if proc.poll() is None:
            proc.kill()
        cli("stop", "-i", str(inv))


def registered(router: str) -> list[str]:
    """The URLs the router lists (0.3's /workers, else the legacy /list_workers)."""
    try:
        with urllib.request.urlopen(f"{router}/workers", timeout=10) as reply:
            return sorted(w["url"] for w in json.load(reply)["workers"])
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    with urllib.request.urlopen(f"{router}/list_workers", timeout=10) as reply:
        return sorted(json.load(reply)["urls"])


def wait_until_taken_out(router: str, url: str) -> None:
    """Wait until the router no longer lists `url` (a rollout took that worker out)."""
    deadline = time.monotonic() + 60
    while url in registered(router):
        assert time.monotonic() < deadline, f"{url} was never taken out of its router"
        time.sleep(0.05)


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


def test_patch_apply_rolling_without_sglang_is_refused_before_anything_is_touched(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The workers' python has no SGLang: the installation is read while planning, so no
    worker is taken out, stopped or patched."""
    inv, table = serving(hosts, cli, tmp_path, 2)
    code, doc, err = run_json(
        cli, "patch", "apply", "spec-disable", "--rolling", "-i", str(inv), "--dry-run"
    )
    assert code == 1, err
    assert all("SGLang" in u["blocked"] for u in doc["units"] if u["unit"] != "alpha/router")
    with Load(hosts.hosts["alpha"].address, table["router"]["port"]) as load:
        code, doc, err = run_json(
            cli, "patch", "apply", "spec-disable", "--rolling", "-i", str(inv)
        )
    assert code == 1, err
    units = {u["unit"]: u for u in doc["units"]}
    w1 = units["alpha/w1"]
    assert w1["outcome"] == "refused" and w1["error"].startswith("alpha/w1: cannot apply: ")
    assert "SGLang" in w1["error"], w1
    assert (w1["old_run"], w1["new_run"], w1["timings_s"]) == ("w1_baseline_v1", None, {}), w1
    assert units["alpha/w2"]["outcome"] == "not reached"
    assert load.failed == [] and load.done, load.failed[:3]
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2"]
    _, doc, _ = run_json(cli, "status", "-i", str(inv))
    runs = {d: s["run"] for d, s in doc["hosts"]["alpha"]["deployments"].items() if d != "router"}
    assert runs == {"w1": "w1_baseline_v1", "w2": "w2_baseline_v1"}
    cli("stop", "-i", str(inv))


def kill_run(cli: CLI, inv: Path, deployment: str) -> None:
    """SIGKILL a deployment's server (its whole process group), as a crash would end it."""
    _, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", deployment)
    os.killpg(doc["hosts"]["alpha"]["deployments"][deployment]["pid"], signal.SIGKILL)


@pytest.mark.parametrize("router", ["real", "legacy"])
def test_a_dead_worker_its_router_still_lists_is_no_capacity(
    hosts: SSHLab, cli: CLI, tmp_path: Path, router: str
) -> None:
    """w2 crashed: the real router still calls it healthy for a while (its health checks run
    once a minute), the legacy one says nothing of health. Taking w1 out would empty it."""
    python = real_router() if router == "real" else str(legacy_router_python())
    inv, table = serving(hosts, cli, tmp_path, 2, python=python)
    address = hosts.hosts["alpha"].address
    kill_run(cli, inv, "w2")
    router_url = url_of(address, table["router"]["port"])
    assert registered(router_url) == sorted(url_of(address, table[w]["port"]) for w in ("w1", "w2"))
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--restart", "-d", "w1")
    assert code == 1, err
    (unit,) = doc["units"]
    assert (unit["outcome"], unit["old_run"], unit["new_run"]) == (
        "refused", "w1_baseline_v1", None
    ), unit  # fmt: skip
    assert unit["error"] == (
        "alpha/router would have no healthy worker left while alpha/w1 is replaced"
    )
    # Untouched: w1 still serves through its router.
    _, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "w1")
    w1 = doc["hosts"]["alpha"]["deployments"]["w1"]
    assert (w1["run"], w1["state"]) == ("w1_baseline_v1", "ready"), w1
    assert url_of(address, table["w1"]["port"]) in registered(router_url)
    if router == "real":  # it retries a dead worker's requests elsewhere: none is lost
        with Load(address, table["router"]["port"]) as load:
            code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--restart", "-d", "w1")
            time.sleep(1.0)
        assert code == 1 and doc["units"][0]["outcome"] == "refused", err
        assert load.failed == [] and load.done, load.failed[:3]
    cli("stop", "-i", str(inv))


def test_a_worker_without_metrics_is_drained_by_waiting_the_drain_timeout(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """enable_metrics: false: nothing says when w1 is idle, so the drain waits it out; its
    long requests (about 4 s) all end."""
    inv, table = fleet(hosts, tmp_path, workers=2, knobs=KNOBS)
    rewrite(inv, {"enable_metrics": False})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    rewrite(inv, {"mem_fraction_static": 0.8})
    address = hosts.hosts["alpha"].address
    # And one request straight to w1 once it is out of the router (about 4 s): in flight at
    # its stop unless the drain waits.
    w1_url = f"{url_of(address, table['w1']['port'])}/v1/completions"
    body = {"model": "m", "prompt": "hi", "max_tokens": 200, "stream": True}
    answers: list[str] = []
    busy = threading.Thread(target=lambda: answers.append(stream_text(w1_url, body)))
    router = url_of(address, table["router"]["port"])
    with Load(address, table["router"]["port"], streams=4, max_tokens=200) as load:
        time.sleep(1.5)
        rolling = cli.popen("rollout", "-i", str(inv), "-d", "w1", "--json", "--drain-timeout", "6")
        wait_until_taken_out(router, url_of(address, table["w1"]["port"]))
        busy.start()
        out, err = rolling.communicate(timeout=120)
        time.sleep(1.0)
    assert rolling.returncode == 0, err
    doc = json.loads(out)
    busy.join(timeout=120)
    assert answers and answers[0].rstrip().endswith("data: [DONE]"), answers
    assert load.failed == [] and len(load.done) > 3, (load.failed[:3], len(load.done))
    (unit,) = doc["units"]
    assert (unit["outcome"], unit["drained"], unit["drain_signal"]) == (
        "replaced", True, "timeout"
    ), unit  # fmt: skip
    assert unit["timings_s"]["drain"] >= 6.0, unit["timings_s"]
    assert any("waited the whole --drain-timeout 6s" in w for w in unit["warnings"]), unit
    human = cli("rollout", "-i", str(inv), "-d", "w2", "--drain-timeout", "1")
    assert human.returncode == 0, human.stderr
    assert "yes (timeout)" in human.stdout, human.stdout
    cli("stop", "-i", str(inv))


@contextlib.contextmanager
def router_lock_as_tune(inv: Path, deployment: str = "w1") -> Iterator[None]:
    """Hold the router lock of alpha's `deployment` from this process, as tune_fleet does."""
    from deployctl.connection import ConnectOptions
    from deployctl.deployments import deployment_targets
    from deployctl.fanout import Fleet
    from deployctl.inventory import load_inventory
    from deployctl.ops.router import router_lock_of

    inventory = load_inventory(inv)
    (worker,) = deployment_targets(inventory.select("alpha"), deployment, inventory.select)
    with (
        Fleet([worker], ConnectOptions(), 2, inventory.origin, inventory.select) as fleet,
        router_lock_of(fleet, worker, "tune"),
    ):
        yield


def test_two_rollouts_through_one_router_the_second_is_refused_naming_the_first(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """Each would see the other's worker serving and take out its own: one router, one
    change at a time. The lock lives on the router's host and dies with its holder."""
    alpha = hosts.hosts["alpha"]
    inv, table = serving(hosts, cli, tmp_path, 2)
    rewrite(inv, {"mem_fraction_static": 0.8})
    # A long request straight to w1 keeps it busy (80 s): the first rollout's drain waits
    # for it while the commands below run, however slowly.
    long_body = {"model": "m", "prompt": "hi", "max_tokens": 4000, "stream": True}
    w1_url = f"{url_of(alpha.address, table['w1']['port'])}/v1/completions"
    threading.Thread(target=lambda: stream_text(w1_url, long_body), daemon=True).start()
    with Load(alpha.address, table["router"]["port"]) as load:
        first = cli.popen("rollout", "-i", str(inv), "--json", "--drain-timeout", "120")
        router = url_of(alpha.address, table["router"]["port"])
        wait_until_taken_out(router, url_of(alpha.address, table["w1"]["port"]))
        for command in (["rollout"], ["restart", "--rolling"]):
            code, doc, err = run_json(cli, *command, "-i", str(inv), "-d", "w2")
            assert code == 1, err
            assert doc["code"] == "busy", doc
            assert doc["error"].startswith(
                f"alpha/router is in use: deployctl rollout (pid {first.pid} on "
            ), doc
            human = cli(*command, "-i", str(inv), "-d", "w2")
            assert human.stderr.startswith("error: alpha/router is in use"), human.stderr
            assert "hint: wait for it to finish" in human.stderr, human.stderr
        # w2 was not touched: it serves the load alone meanwhile.
        assert registered(router) == [url_of(alpha.address, table["w2"]["port"])]
        # The first one crashes (SIGKILL: no clean-up of its own): its lock goes with it.
        first.kill()
        first.communicate(timeout=30)
        code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--drain-timeout", "5")
        assert code == 0, err
    assert [u["outcome"] for u in doc["units"]] == ["replaced", "replaced", "skipped"], doc
    assert load.failed == [] and load.done, load.failed[:3]
    assert healthy_workers(cli, inv) == ["alpha/w1", "alpha/w2"]
    # tune's replacements take the same lock: a rollout meanwhile is refused, naming it.
    with router_lock_as_tune(inv):
        code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--restart")
        assert code == 1 and "alpha/router is in use: deployctl tune (pid " in doc["error"], doc
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--restart", "-d", "w1")
    assert code == 0, err
    cli("stop", "-i", str(inv))


def test_a_new_run_that_serves_but_its_dead_router_cannot_take_is_kept_and_said(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The router dies while w1's new configuration starts: w1 serves it, outside the
    router; the rollout says so and stops, and w1 is not relaunched on its old one."""
    alpha = hosts.hosts["alpha"]
    inv, table = serving(hosts, cli, tmp_path, 2)
    slow = alpha.home / "slow-model"
    slow.mkdir()
    # Long enough that the router is dead before w1 is ready, however slow `status` is.
    (slow / "standin.json").write_text(json.dumps({"startup_s": 12, **KNOBS}))
    subprocess.run(["chown", "-R", f"{alpha.user}:{alpha.user}", str(slow)], check=True)
    rewrite(inv, {"model_path": str(slow)})
    rolling = cli.popen("rollout", "-i", str(inv), "--json", "-d", "w1")
    router = url_of(alpha.address, table["router"]["port"])
    wait_until_taken_out(router, url_of(alpha.address, table["w1"]["port"]))
    _, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
    os.killpg(doc["hosts"]["alpha"]["deployments"]["router"]["pid"], signal.SIGKILL)
    out, err = rolling.communicate(timeout=120)
    assert rolling.returncode == 1, err
    (unit,) = json.loads(out)["units"]
    assert (unit["outcome"], unit["state"], unit["new_run"]) == (
        "failed", "ready", "w1_baseline_v2"
    ), unit  # fmt: skip
    assert "not added to alpha/router" in unit["error"], unit
    assert unit["error"].endswith("w1_baseline_v2 serves, outside its router"), unit
    _, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "w1")
    w1 = doc["hosts"]["alpha"]["deployments"]["w1"]
    assert (w1["run"], w1["state"]) == ("w1_baseline_v2", "ready"), w1
    cli("stop", "-i", str(inv))


def test_a_host_that_fails_mid_drain_gets_its_unit_put_back_in_its_router(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The router on charlie, w1 on alpha busy with a long request: alpha drops off while w1
    drains. The removal was recorded, so w1 (still serving) goes back into the router."""
    alpha, bravo, charlie = (hosts.hosts[n] for n in ("alpha", "bravo", "charlie"))
    workers: dict[str, dict[str, Any]] = {}
    for name, host in (("w1", alpha), ("w2", bravo)):
        variables: dict[str, Any] = {**prepare(host, tp=1, **KNOBS), "template": "baseline"}
        variables["router"] = "charlie/router"
        variables["worker_url"] = url_of(host.address, variables["port"])
        host.set_gpus("live", 1)
        workers[name] = variables
    router_deployment = router_vars(charlie.address, real_router())
    router = {"bind_host": charlie.address, "deployments": {"router": router_deployment}}
    inv = hosts.inventory(
        tmp_path / "inv.yml",
        ["alpha", "bravo", "charlie"],
        {"alpha": workers["w1"], "bravo": workers["w2"], "charlie": router},
        command_timeout=5,
    )
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    w1_url = workers["w1"]["worker_url"]
    router_url = url_of(charlie.address, router_deployment["port"])
    assert w1_url in registered(router_url)
    long_body = {"model": "m", "prompt": "hi", "max_tokens": 4000, "stream": True}
    threading.Thread(
        target=lambda: stream_text(f"{w1_url}/v1/completions", long_body), daemon=True
    ).start()
    rolling = cli.popen("rollout", "-i", str(inv), "--json", "--restart", "-H", "alpha",
                        "--drain-timeout", "120")  # fmt: skip
    try:
        wait_until_taken_out(router_url, w1_url)
        time.sleep(1.0)  # draining
        alpha.go_away()
        out, err = rolling.communicate(timeout=120)
    finally:
        if rolling.poll() is None:
            rolling.kill()
        alpha.ensure_running()
    assert rolling.returncode == 1, err
    (unit,) = json.loads(out)["units"]
    assert unit["outcome"] == "failed" and unit["old_run"] == "baseline_v1", unit
    assert not any("not put back" in w for w in unit["warnings"]), unit
    assert w1_url in registered(router_url)  # back in, serving its old run
    cli("stop", "-i", str(inv))


def test_a_dry_run_with_a_host_that_cannot_be_read_fails(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha, bravo = hosts.hosts["alpha"], hosts.hosts["bravo"]
    host_vars = {
        n: {**prepare(h, tp=1), "template": "baseline"}
        for n, h in (("alpha", alpha), ("bravo", bravo))
    }
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"], host_vars, connect_timeout=2)
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--dry-run")
    assert code == 0, err  # both read: neither runs, both would start
    bravo.go_away()
    try:
        code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--dry-run")
    finally:
        bravo.ensure_running()
    assert code == 1, err
    units = {u["unit"]: u for u in doc["units"]}
    assert units["bravo"]["blocked"].startswith("bravo: cannot be read"), units
    assert not units["alpha"]["blocked"], units


def edit_worker(inv: Path, name: str, change: dict[str, Any]) -> None:
    document = yaml.safe_load(inv.read_text())
    document["all"]["hosts"]["alpha"]["deployments"][name].update(change)
    inv.write_text(yaml.safe_dump(document, sort_keys=False))


def test_a_worker_whose_url_was_edited_is_taken_out_by_the_url_its_run_registered(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """w1 serves on every address, registered as 127.0.0.2:P; its worker_url is edited to
    localhost:P after launch. The rollout takes out (and drains) the URL the router lists,
    and the new run registers under the new one: no request lost, no stale URL left."""
    address = hosts.hosts["alpha"].address
    inv, table = fleet(hosts, tmp_path, workers=2, knobs=KNOBS)
    edit_worker(inv, "w1", {"bind_host": "0.0.0.0"})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    router = url_of(address, table["router"]["port"])
    port = table["w1"]["port"]
    old, new = f"http://{address}:{port}", f"http://localhost:{port}"
    assert old in registered(router)
    edit_worker(inv, "w1", {"worker_url": new, "mem_fraction_static": 0.8})
    with Load(address, table["router"]["port"]) as load:
        time.sleep(1.0)
        code, doc, err = run_json(cli, "rollout", "-i", str(inv), "-d", "w1")
        time.sleep(1.0)
    assert code == 0, err
    assert [(u["outcome"], u["new_run"]) for u in doc["units"]] == [
        ("replaced", "w1_baseline_v2")
    ], err
    assert load.failed == [] and load.done, load.failed[:3]
    listed = registered(router)
    assert new in listed and old not in listed, listed
    cli("stop", "-i", str(inv))
