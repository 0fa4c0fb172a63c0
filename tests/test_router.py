"""SGLang's real router (sglang-router 0.3.2) as a deployment, its workers' registration kept
true by launch and stop, drift shown by status and mended by `router sync`; the legacy
(<= 0.2.1) registration API through its stand-in. Over real sshd hosts, with the stand-in
SGLang server as the workers."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CLI
from tests.router_venv import legacy_router_python, router_venv
from tests.sshd_hosts import SSHLab, free_port, loopback_address
from tests.test_deployments import run_json
from tests.test_faults import wait_until
from tests.test_lifecycle import prepare

pytestmark = pytest.mark.lab


def router_vars(address: str, python: str) -> dict[str, Any]:
    """A router deployment on `address` (no GPU), with a Prometheus port of its own."""
    return {
        "template": "router",
        "python": python,
        "port": free_port(address),
        "router_metrics_port": free_port(address),
        "router_policy": "round_robin",
    }


def fleet(
    lab: SSHLab,
    tmp_path: Path,
    workers: int = 2,
    python: str | None = None,
    knobs: dict[str, Any] | None = None,
    worker_python: str | None = None,
    router_args: list[str] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """alpha running a router (`python`: the real one's by default; `router_args`: its
    extra_args) and `workers` stand-in workers on their own GPUs, each naming it
    (`worker_python`: theirs, else Debian's)."""
    alpha = lab.hosts["alpha"]
    address = alpha.address
    table: dict[str, Any] = {"router": router_vars(address, python or real_router())}
    if router_args:
        table["router"]["extra_args"] = router_args
    for i in range(workers):
        table[f"w{i + 1}"] = {"gpus": [i], "port": free_port(address), "router": "alpha/router"}
    variables = {
        **prepare(alpha, tp=1, **(knobs or {})),
        "template": "baseline",
        "deployments": table,
    }
    if worker_python is not None:
        variables["python"] = worker_python
    alpha.set_gpus("live", workers)
    return lab.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables}), table


def real_router() -> str:
    return str(router_venv() / "bin" / "python")


def router_entry(cli: CLI, inv: Path) -> dict[str, Any]:
    code, doc, err = run_json(cli, "status", "-i", str(inv), "-d", "router")
    entry: dict[str, Any] = doc["hosts"]["alpha"]["deployments"]["router"]
    assert entry["state"] == "ready" and code == 0 and not err, (err, entry)
    assert entry["gpus"] == []  # a router holds no GPU and got none
    return entry["router"]


def url_of(address: str, port: int) -> str:
    return f"http://{address}:{port}"


def stream_text(url: str, body: dict[str, Any], timeout: float = 120) -> str:
    """One streamed completion, read to its end."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return str(reply.read().decode())


def stream_through(address: str, port: int) -> str:
    body = {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}
    return stream_text(f"{url_of(address, port)}/v1/completions", body, timeout=30)


def test_a_router_deployment_keeps_its_workers_registered_and_status_shows_drift(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, table = fleet(hosts, tmp_path)
    address = hosts.hosts["alpha"].address
    w1, w2 = (url_of(address, table[w]["port"]) for w in ("w1", "w2"))
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    added = {(r["worker"], r["url"]) for r in doc["registrations"] if r["ok"]}
    assert added >= {("alpha/w1", w1), ("alpha/w2", w2)}, doc["registrations"]

    listed = router_entry(cli, inv)
    assert listed["api"] == "workers" and not listed["drift"], listed
    assert {w["deployment"]: w["url"] for w in listed["workers"]} == {
        "alpha/w1": w1,
        "alpha/w2": w2,
    }
    assert all(w["healthy"] for w in listed["workers"])
    assert stream_through(address, table["router"]["port"]).rstrip().endswith("data: [DONE]")
    human = cli("status", "-i", str(inv))
    assert "alpha/router: 2 workers, 2 of ours healthy" in human.stdout, human.stdout

    # Stop removes the worker from its router first.
    code, doc, err = run_json(cli, "stop", "-i", str(inv), "-d", "w1")
    assert code == 0, err
    removal = doc["hosts"]["alpha"]["deployments"]["w1"]["router"]
    assert removal == {"worker": "alpha/w1", "router": "alpha/router", "url": w1,
                       "action": "remove", "ok": True, "error": ""}  # fmt: skip
    assert [w["url"] for w in router_entry(cli, inv)["workers"]] == [w2]

    # Drift both ways: w1 serves again unregistered (started under the router's nose by
    # killing nothing: its registration is dropped by hand), and w2 dies while listed.
    code, _, err = run_json(cli, "launch", "-i", str(inv), "-d", "w1", "--timeout", "60")
    assert code == 0, err
    remove_by_hand(address, table["router"]["port"], w1)
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "w2")
    os.killpg(doc["hosts"]["alpha"]["deployments"]["w2"]["pid"], signal.SIGKILL)
    listed = router_entry(cli, inv)
    assert listed["drift"] and listed["unregistered"] == {"alpha/w1": w1}
    assert listed["stray"] == [w2]
    human = cli("status", "-i", str(inv), "-d", "router")
    assert f"drift: alpha/w1 serves at {w1} but is not registered" in human.stderr
    assert "deployctl router sync -H alpha -d router" in human.stderr

    code, doc, err = run_json(cli, "router", "sync", "-i", str(inv), "--dry-run")
    assert code == 0, err
    planned = doc["hosts"]["alpha"]["deployments"]["router"]["changes"]
    assert {(c["action"], c["url"]) for c in planned} == {("add", w1), ("remove", w2)}
    assert [w["url"] for w in router_entry(cli, inv)["workers"]] == [w2]  # dry: no change
    code, doc, err = run_json(cli, "router", "sync", "-i", str(inv))
    assert code == 0, err
    listed = router_entry(cli, inv)
    assert not listed["drift"] and [w["url"] for w in listed["workers"]] == [w1]
    cli("stop", "-i", str(inv))


def listed(address: str, port: int) -> dict[str, bool | None]:
    """The router's own list, read over HTTP: URL -> is_healthy."""
    with urllib.request.urlopen(f"{url_of(address, port)}/workers", timeout=10) as reply:
        return {w["url"]: w.get("is_healthy") for w in json.load(reply)["workers"]}


def edited(inv: Path, name: str, **deployments: dict[str, Any] | None) -> Path:
    """A copy of the inventory beside it whose alpha deployments are changed (None: gone)."""
    doc = yaml.safe_load(inv.read_text())
    table = doc["all"]["hosts"]["alpha"]["deployments"]
    for deployment, changes in deployments.items():
        if changes is None:
            del table[deployment]
        else:
            table[deployment] = {**table[deployment], **changes}
    path = inv.with_name(name)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def remove_by_hand(address: str, port: int, url: str) -> None:
    with urllib.request.urlopen(f"{url_of(address, port)}/workers", timeout=10) as reply:
        found = json.load(reply)["workers"]
    (worker,) = [w for w in found if w["url"] == url]
    request = urllib.request.Request(
        f"{url_of(address, port)}/workers/{worker['id']}", method="DELETE"
    )
    urllib.request.urlopen(request, timeout=10).close()
    # The removal runs in the background: wait until the list no longer has it.
    for _ in range(100):
        with urllib.request.urlopen(f"{url_of(address, port)}/workers", timeout=10) as reply:
            if all(w["url"] != url for w in json.load(reply)["workers"]):
                return
        import time

        time.sleep(0.1)
    raise AssertionError(f"{url} still registered")


def test_the_routers_metrics_port_is_checked_on_its_own_address_not_every_one(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """Held on another address of the host, the port does not stop the launch (it once did,
    checked on every address: xdist workers' servers on their own addresses refused each
    other's routers); held on the router's own address, it does, and nothing starts."""
    inv, table = fleet(hosts, tmp_path, workers=1)
    alpha, metrics = hosts.hosts["alpha"], table["router"]["router_metrics_port"]
    with socket.socket() as elsewhere:
        elsewhere.bind((loopback_address(250), metrics))
        elsewhere.listen()
        with socket.socket() as same:
            same.bind((alpha.address, metrics))
            same.listen()
            refused = cli("launch", "-i", str(inv), "--timeout", "60")
        assert refused.returncode == 1, refused.stderr
        assert (
            f"alpha/router: error: port {metrics} (router_metrics_port, its Prometheus port) "
            "is in use on alpha"
        ) in refused.stderr
        for port in (table["router"]["port"], table["w1"]["port"]):  # nothing started
            with socket.socket() as probe:
                assert probe.connect_ex((alpha.address, port)) != 0, port
        code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
        assert code == 0, (err, doc)
    assert router_entry(cli, inv)["workers"], "the router serves its worker"
    cli("stop", "-i", str(inv))


def test_a_router_launched_after_its_workers_registers_the_ready_ones(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """Through the legacy registration API (routers up to 0.2.1: /add_worker, /list_workers)."""
    inv, table = fleet(hosts, tmp_path, workers=1, python=str(legacy_router_python()))
    address = hosts.hosts["alpha"].address
    w1 = url_of(address, table["w1"]["port"])
    # The router is not up: the worker serves, and its launch says it is not registered.
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "-d", "w1", "--timeout", "60")
    assert code == 1
    assert doc["hosts"]["alpha"]["deployments"]["w1"]["state"] == "ready"
    (failed,) = doc["registrations"]
    assert not failed["ok"] and "nothing answers" in failed["error"], failed
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-d", "router", "--timeout", "60")
    assert code == 0, err
    assert [(r["worker"], r["url"], r["ok"]) for r in doc["registrations"]] == [
        ("alpha/w1", w1, True)
    ]
    listed = router_entry(cli, inv)
    assert listed["api"] == "legacy" and [w["url"] for w in listed["workers"]] == [w1]
    assert stream_through(address, table["router"]["port"]).rstrip().endswith("data: [DONE]")
    code, doc, err = run_json(cli, "stop", "-i", str(inv), "-d", "w1")
    assert code == 0 and doc["hosts"]["alpha"]["deployments"]["w1"]["router"]["ok"], err
    assert router_entry(cli, inv)["workers"] == []
    cli("stop", "-i", str(inv))


def test_a_power_of_two_router_crash_at_start_is_said_in_the_routers_words(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """sglang-router 0.3.2 refuses power_of_two with fewer than two workers at its start, and
    a router starts with none (its workers are added as they become ready): the launch fails
    with the router's own reason, and its workers are launched all the same."""
    inv, _ = fleet(hosts, tmp_path, workers=1)
    document = yaml.safe_load(inv.read_text())
    document["all"]["hosts"]["alpha"]["deployments"]["router"]["router_policy"] = "power_of_two"
    inv.write_text(yaml.safe_dump(document, sort_keys=False))
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 1 and "Traceback" not in err, err
    deployments = doc["hosts"]["alpha"]["deployments"]
    assert "Power-of-two policy requires at least 2 workers" in deployments["router"]["error"]
    assert deployments["w1"]["state"] == "ready", deployments["w1"]
    cli("stop", "-i", str(inv))


def test_a_worker_its_router_cannot_reach_is_refused_before_anything_starts(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha, bravo = hosts.hosts["alpha"], hosts.hosts["bravo"]
    router = {"deployments": {"router": router_vars(alpha.address, real_router())}}
    worker = {**prepare(bravo, tp=1), "template": "baseline", "router": "alpha/router"}
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], {"alpha": router, "bravo": worker}
    )
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-H", "bravo", "--dry-run")
    assert code == 1
    problems = doc["hosts"]["bravo"]["preflight"]["problems"]
    assert problems == [
        f"bravo binds to {bravo.address}, which its router alpha/router (on {alpha.address}) "
        "cannot reach"
    ], problems
    assert any("worker_url" in h for h in doc["hosts"]["bravo"]["preflight"]["hints"])
    # With worker_url the user says how the router reaches it.
    worker["worker_url"] = f"http://{bravo.address}:{worker['port']}"
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], {"alpha": router, "bravo": worker}
    )
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-H", "bravo", "--dry-run")
    assert code == 0, err
    # A router the inventory does not have.
    worker["router"] = "nowhere/router"
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], {"alpha": router, "bravo": worker}
    )
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-H", "bravo", "--dry-run")
    assert code == 1
    assert doc["hosts"]["bravo"]["preflight"]["problems"] == [
        "router 'nowhere/router' names no host of the inventory"
    ]


@pytest.fixture
def revived(hosts: SSHLab) -> Iterator[SSHLab]:
    """Bring back every host's sshd after the test, whatever happened."""
    yield hosts
    for host in hosts.hosts.values():
        host.resume()
        host.ensure_running()


def test_router_sync_leaves_urls_whose_owner_cannot_be_read_or_is_not_ours(
    revived: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """A worker whose host cannot be read may be serving: its URL is unknown, kept (sync
    exits 1), removed only with --force; so is a URL the inventory names no worker at."""
    alpha, bravo = revived.hosts["alpha"], revived.hosts["bravo"]
    far = {**prepare(bravo, tp=1), "template": "baseline", "router": "alpha/router"}
    far["worker_url"] = bravo_url = url_of(bravo.address, far["port"])
    router = router_vars(alpha.address, real_router())
    near = {"gpus": [0], "port": free_port(alpha.address), "router": "alpha/router"}
    here = {**prepare(alpha, tp=1), "template": "baseline"}
    here["deployments"] = {"router": router, "w1": near}
    alpha.set_gpus("live", 1)
    bravo.set_gpus("live", 1)
    inv = revived.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], {"alpha": here, "bravo": far}, connect_timeout=2
    )
    w1 = url_of(alpha.address, near["port"])
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    assert set(listed(alpha.address, router["port"])) == {w1, bravo_url}
    # Another inventory's view: w1 is not one of its workers, and bravo's host goes down.
    mine = edited(inv, "mine.yml", w1=None)
    bravo.stop()
    try:
        code, doc, err = run_json(cli, "status", "-i", str(mine), "-H", "alpha", "-d", "router")
        state = doc["hosts"]["alpha"]["deployments"]["router"]["router"]
        assert state["stray"] == [] and state["unregistered"] == {} and not state["drift"], state
        assert state["unknown"] == {bravo_url: "bravo"} and state["not_ours"] == [w1], state
        assert "cannot connect" in state["unread"]["bravo"], state
        human = cli("status", "-i", str(mine), "-H", "alpha", "-d", "router")
        assert f"alpha/router: unknown: {bravo_url} is registered: its worker bravo" in human.stderr
        assert "router sync" not in human.stderr, human.stderr  # no drift to mend

        code, doc, err = run_json(cli, "router", "sync", "-i", str(mine), "-H", "alpha")
        synced = doc["hosts"]["alpha"]["deployments"]["router"]
        assert code == 1 and not synced["ok"] and synced["changes"] == [], synced
        assert synced["error"].startswith(f"{bravo_url} kept: its worker bravo cannot be read")
        assert synced["code"] == "error" and set(synced["kept"]) == {bravo_url, w1}, synced
        assert set(listed(alpha.address, router["port"])) == {w1, bravo_url}
        human = cli("router", "sync", "-i", str(mine), "-H", "alpha")
        assert human.returncode == 1
        assert f"alpha/router: error: kept {bravo_url}: its worker bravo cannot be read" in (
            human.stderr
        )
        assert f"alpha/router: kept {w1}: no worker of this inventory is there" in human.stdout
        code, doc, err = run_json(cli, "router", "sync", "-i", str(mine), "--dry-run", "--force")
        planned = doc["hosts"]["alpha"]["deployments"]["router"]["changes"]
        assert code == 0 and {(c["action"], c["url"]) for c in planned} == {
            ("remove", bravo_url),
            ("remove", w1),
        }, planned
        assert set(listed(alpha.address, router["port"])) == {w1, bravo_url}
    finally:
        bravo.start()
    # bravo answers again: its URL is ours; --force removes the URL that is not ours, on a
    # line that names the router (no worker of ours is there to name).
    human = cli("router", "sync", "-i", str(mine), "-H", "alpha", "--force")
    assert human.returncode == 0, human.stderr
    assert human.stdout.splitlines() == [f"alpha/router: removed from alpha/router as {w1}"]
    assert set(listed(alpha.address, router["port"])) == {bravo_url}
    cli("stop", "-i", str(inv))


def test_stop_removes_the_url_its_run_registered_and_two_workers_with_one_url_are_refused(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, table = fleet(hosts, tmp_path)
    address, port = hosts.hosts["alpha"].address, table["router"]["port"]
    w1, w2 = (url_of(address, table[w]["port"]) for w in ("w1", "w2"))
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    # A copy-paste slip gives w2 w1's URL: refused when the inventory is read, nothing done.
    slip = edited(inv, "slip.yml", w2={"worker_url": w1})
    for args in (("stop", "-d", "w2"), ("status",)):
        result = cli(*args, "-i", str(slip))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        first, hint = result.stderr.splitlines()
        assert first == (
            f"error: alpha/w1 and alpha/w2 have one worker URL, {w1}: their router cannot "
            "tell them apart, and stopping one would take the other out of it"
        ), result.stderr
        assert hint.startswith("hint: give each worker its own worker_url"), hint
    assert listed(address, port) == {w1: True, w2: True}
    # w1's worker_url edited after its launch, to a URL another inventory's server has:
    # its stop removes the URL its run registered, not that one.
    moved = edited(inv, "moved.yml", w1={"worker_url": w2}, w2=None)
    code, doc, err = run_json(cli, "stop", "-i", str(moved), "-d", "w1")
    removal = doc["hosts"]["alpha"]["deployments"]["w1"]["router"]
    assert code == 0 and removal["url"] == w1 and removal["ok"], (removal, err)
    assert listed(address, port) == {w2: True}
    cli("stop", "-i", str(inv))


def add_by_hand(address: str, port: int, url: str) -> None:
    """Register `url` as another tool would (POST /workers), and wait until it is listed healthy."""
    request = urllib.request.Request(
        f"{url_of(address, port)}/workers", data=json.dumps({"url": url}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=10).close()
    wait_until(lambda: listed(address, port).get(url) is True, 30)


def test_a_worker_its_router_lists_with_a_trailing_slash_is_removed_by_stop_and_sync(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """A hand fix (or another tool) registered w1 as `http://H:P/`: status finds w1 in it,
    stop and router sync remove that very entry (by the router's own id), and what they say
    is what the router lists after."""
    inv, table = fleet(hosts, tmp_path)
    address, port = hosts.hosts["alpha"].address, table["router"]["port"]
    w1, w2 = (url_of(address, table[w]["port"]) for w in ("w1", "w2"))
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    remove_by_hand(address, port, w1)
    add_by_hand(address, port, f"{w1}/")
    state = router_entry(cli, inv)
    assert not state["drift"], state
    assert {w["url"]: w["deployment"] for w in state["workers"]} == {
        f"{w1}/": "alpha/w1", w2: "alpha/w2"
    }  # fmt: skip
    code, doc, err = run_json(cli, "stop", "-i", str(inv), "-d", "w1")
    removal = doc["hosts"]["alpha"]["deployments"]["w1"]["router"]
    assert code == 0 and removal["ok"], (removal, err)
    assert listed(address, port) == {w2: True}
    for _ in range(3):  # round robin: no request is sent to the stopped w1
        assert stream_through(address, port).rstrip().endswith("data: [DONE]")

    # Listed twice (as launch added it, and with a slash), then killed: sync removes both.
    code, _, err = run_json(cli, "launch", "-i", str(inv), "-d", "w1", "--timeout", "60")
    assert code == 0, err
    add_by_hand(address, port, f"{w1}/")
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "w1")
    os.killpg(doc["hosts"]["alpha"]["deployments"]["w1"]["pid"], signal.SIGKILL)
    assert sorted(router_entry(cli, inv)["stray"]) == [w1, f"{w1}/"]
    code, doc, err = run_json(cli, "router", "sync", "-i", str(inv))
    assert code == 0, (doc, err)
    assert listed(address, port) == {w2: True}
    state = router_entry(cli, inv)
    assert not state["drift"] and [w["url"] for w in state["workers"]] == [w2], state
    cli("stop", "-i", str(inv))


def test_an_addition_is_done_only_once_its_router_lists_the_worker_healthy(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The real router keeps a worker it saw fail listed unhealthy until it passes 8 health
    checks: a relaunch on that URL is added only once the router lists it healthy."""
    # One failed check marks a worker unhealthy: the killed one's is refused at once, and a
    # live one's slow answer on a busy machine must not count as a failure (a 5 s timeout).
    fast_checks = [
        "--health-check-interval-secs", "1", "--health-check-timeout-secs", "5",
        "--health-failure-threshold", "1", "--health-success-threshold", "8",
    ]  # fmt: skip
    inv, table = fleet(hosts, tmp_path, workers=1, router_args=fast_checks)
    address, port = hosts.hosts["alpha"].address, table["router"]["port"]
    w1 = url_of(address, table["w1"]["port"])
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "w1")
    os.killpg(doc["hosts"]["alpha"]["deployments"]["w1"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while listed(address, port) != {w1: False}:
        assert time.monotonic() < deadline, listed(address, port)
        time.sleep(0.2)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-d", "w1", "--timeout", "60")
    assert code == 0, err
    assert [(r["url"], r["ok"]) for r in doc["registrations"]] == [(w1, True)]
    assert listed(address, port) == {w1: True}  # healthy when the launch says added
    cli("stop", "-i", str(inv))


def test_a_router_that_does_not_answer_shows_no_drift(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """A live router that answers nothing lists nobody: not "every worker unregistered"."""
    inv, _ = fleet(hosts, tmp_path, workers=1)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
    pgid = doc["hosts"]["alpha"]["deployments"]["router"]["pid"]
    os.killpg(pgid, signal.SIGSTOP)
    try:
        code, doc, _ = run_json(cli, "status", "-i", str(inv), "-d", "router")
        state = doc["hosts"]["alpha"]["deployments"]["router"]["router"]
        assert state["api"] is None and state["error"], state
        assert state["unregistered"] == {} and not state["drift"], state
        human = cli("status", "-i", str(inv), "-d", "router")
        assert "router not read" in human.stderr and "drift" not in human.stderr, human.stderr
        code, doc, _ = run_json(cli, "router", "sync", "-i", str(inv))
        synced = doc["hosts"]["alpha"]["deployments"]["router"]
        assert code == 1 and synced["changes"] == [], synced
    finally:
        os.killpg(pgid, signal.SIGCONT)
    cli("stop", "-i", str(inv))
