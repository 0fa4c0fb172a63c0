"""One machine under two inventory names: an address written two ways (127.0.5.3 and
127.1283), or a name only ssh_config knows. Placement sums the machine's GPUs as one and
refuses one state_dir for one deployment before any lock is taken; a name nothing here can
tell apart is known by its launch lock, found held by this very launch."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployctl.addresses import literal_address, machine_address, same_address
from deployctl.deployments import deployment_targets, is_loopback
from deployctl.errors import PreflightError
from deployctl.inventory import DEFAULT_VARS, Host, Inventory
from deployctl.ops.plan import Plan, plan_launch
from deployctl.ops.router import reachability_problem
from deployctl.project import Project
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab
from tests.test_deployments import run_json
from tests.test_lifecycle import prepare, rank_pids


@pytest.mark.parametrize(
    ("written", "address"),
    [
        ("127.0.5.3", "127.0.5.3"),
        ("127.1283", "127.0.5.3"),  # a.b.c: the last part is 16 bits
        ("127.0.1283", "127.0.5.3"),
        ("2130707715", "127.0.5.3"),  # one 32-bit number
        ("0x7f.0.5.3", "127.0.5.3"),
        ("0177.0.5.3", "127.0.5.3"),  # octal
        (" 127.0.5.3 ", "127.0.5.3"),
        ("::1", "::1"),
        ("[0:0:0::1]", "::1"),
        ("FE80:0::1", "fe80::1"),
    ],
)
def test_every_spelling_of_an_address_reads_as_one(written: str, address: str) -> None:
    assert literal_address(written) == address
    assert machine_address(written) == address
    assert same_address(written, address)


@pytest.mark.parametrize("name", ["gpu-a", "deadbeef", "1.2.3.4 junk", "127.0.0.256", "a.1"])
def test_a_name_is_not_an_address(name: str) -> None:
    assert literal_address(name) is None


def test_a_name_is_resolved_here_and_one_that_does_not_resolve_stays_as_written() -> None:
    assert machine_address("localhost") == literal_address(socket.gethostbyname("localhost"))
    # .invalid never resolves (RFC 2606): an ssh_config alias, say; case and the root dot aside.
    assert machine_address("GPU-A.invalid.") == "gpu-a.invalid"
    assert same_address("GPU-A.invalid.", "gpu-a.invalid") and not same_address("a", "b")


def test_every_spelling_of_loopback_is_loopback() -> None:
    assert is_loopback("127.1") and is_loopback("2130706433") and is_loopback("[::1]")
    assert not is_loopback("10.1") and not is_loopback("gpu-a")


# ---- placement, before any host is touched ------------------------------------------------


def two_names(first: dict[str, Any], second: dict[str, Any]) -> list[Plan]:
    """Plan hosts `a` and `b`, each with its own variables over the defaults."""
    hosts = [
        Host(name, {**DEFAULT_VARS, "tp": 1, "model_path": "/m", **own})
        for name, own in (("a", first), ("b", second))
    ]
    inv = Inventory({h.name: h for h in hosts}, {}, "test")
    return plan_launch(
        Project(None), deployment_targets(hosts, resolve=inv.select), "baseline", None, [], {}
    )


def sharer(address: str, port: int, deployment: str) -> dict[str, Any]:
    """A deployment on GPU 0 at 0.6 of its memory."""
    own = {"gpus": [0], "mem_fraction_static": 0.6, "port": port}
    return {"ansible_host": address, "deployments": {deployment: own}}


def test_two_names_of_one_address_sum_their_fractions_on_its_gpus() -> None:
    with pytest.raises(PreflightError) as refused:
        two_names(sharer("127.0.5.3", 30000, "r1"), sharer("127.1283", 30001, "r2"))
    assert refused.value.message == (
        "GPU 0 of 127.0.5.3 (a and b: one machine) would hold 0.6 (a/r1) + 0.6 (b/r2) = 1.2 "
        "of its memory; at most 0.9 when deployments share a GPU"
    )
    local = {"ansible_connection": "local", "state_dir": "/srv/b"}
    with pytest.raises(PreflightError, match=r"GPU 0 of this machine \(a and b: one machine\)"):
        two_names({**sharer("", 30000, "r1"), **local}, {**sharer("", 30001, "r2"), **local})
    # Two machines: each GPU 0 holds 0.6.
    assert len(two_names(sharer("127.0.5.3", 30000, "r1"), sharer("127.0.5.4", 30000, "r2"))) == 2


def test_two_names_of_one_address_may_not_keep_one_deployment_in_one_state_dir() -> None:
    first = {"ansible_host": "127.0.5.3", "gpus": [0]}
    second = {"ansible_host": "127.1283", "gpus": [1], "port": 30001}
    with pytest.raises(PreflightError) as refused:
        two_names(first, second)
    assert refused.value.message == (
        "a and b are one machine (127.0.5.3 and 127.1283 both reach 127.0.5.3): both would "
        "keep the host's default deployment in state_dir ~/.deployctl"
    )
    assert "list the machine once in the inventory" in (refused.value.hint or "")
    # A state_dir of each name's own, or each its own login (a `~` state_dir is its home's).
    assert len(two_names(first, {**second, "state_dir": "~/.deployctl-b"})) == 2
    assert len(two_names({**first, "ansible_user": "u1"}, {**second, "ansible_user": "u2"})) == 2
    # The same port on one machine is still refused, and says it is one machine.
    with pytest.raises(
        PreflightError, match=r"a and b \(one machine: 127\.0\.5\.3\) would share port"
    ):
        two_names(first, {**second, "port": 30000, "state_dir": "/srv/b"})


# ---- over real sshd hosts ----------------------------------------------------------------


def short_form(address: str) -> str:
    """127.B.0.2 as `127.B.2`: inet_aton's three-part form, which reaches the same sshd."""
    a, b, c, d = (int(p) for p in address.split("."))
    return f"{a}.{b}.{c * 256 + d}"


def alias_inventory(lab: SSHLab, tmp_path: Path, alias: str, **extra: Any) -> Path:
    """alpha, and `alias` written in as a second host at alpha's address, its user and port:
    the SSH host key, as ssh records it for each name it was reached by, known for both."""
    alpha = lab.hosts["alpha"]
    own = {**prepare(alpha, tp=1), "template": "baseline", **extra}
    known = tmp_path / "known_hosts"
    known.write_text(
        lab.known_hosts.read_text() + f"[{alias}]:{alpha.host_key_line.split(':', 1)[1]}"
    )
    path = lab.inventory(
        tmp_path / "inv.yml", ["alpha"], {"alpha": own}, known_hosts_file=str(known)
    )
    document = yaml.safe_load(path.read_text())
    document["all"]["hosts"]["alias"] = {**document["all"]["hosts"]["alpha"], "ansible_host": alias}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def no_launch_left(lab: SSHLab) -> None:
    alpha = lab.hosts["alpha"]
    assert not (alpha.home / "model" / "standin-argv.jsonl").exists()
    assert rank_pids(alpha) == []
    assert not list((alpha.home / ".deployctl").glob("lock*"))


def test_a_launch_on_two_spellings_of_one_address_says_they_are_one_machine(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    alias = short_form(alpha.address)
    inv = alias_inventory(hosts, tmp_path, alias, gpus=[0])
    assert cli("gpus", "-i", str(inv), "-H", "alias").returncode == 0  # the alias reaches alpha
    result = cli("launch", "-i", str(inv), "--timeout", "60")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        f"alpha and alias are one machine ({alpha.address} and {alias} both reach "
        f"{alpha.address}): both would keep the host's default deployment in state_dir "
        "~/.deployctl"
    ) in result.stderr, result.stderr
    assert "in progress" not in result.stderr
    no_launch_left(hosts)


def test_a_name_only_ssh_config_knows_is_told_by_the_lock_this_launch_holds(
    hosts: SSHLab, cli: CLI, tmp_path: Path, client_home: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    # Nothing here resolves the name: ssh_config alone says where it is.
    (client_home / ".ssh").mkdir(mode=0o700)
    (client_home / ".ssh" / "config").write_text(f"Host alpha-alias\n  HostName {alpha.address}\n")
    inv = alias_inventory(hosts, tmp_path, "alpha-alias", gpus=[0])
    assert cli("gpus", "-i", str(inv), "-H", "alias").returncode == 0  # the alias reaches alpha
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 1 and doc["started"] is False, err
    problems = {n: doc["hosts"][n]["preflight"]["problems"] for n in ("alpha", "alias")}
    # Both preflights ran at once: either may be the one that found the other's lock.
    refused = "alias" if problems["alias"] else "alpha"
    other = "alpha" if refused == "alias" else "alias"
    assert problems[other] == []
    assert problems[refused] == [
        f"{refused} and {other} are one machine: this launch already holds the lock that "
        f"{refused} needs in state_dir ~/.deployctl there, for {other}"
    ], problems
    assert (
        "list the machine once in the inventory" in doc["hosts"][refused]["preflight"]["hints"][0]
    )
    no_launch_left(hosts)


def test_a_worker_bound_on_loopback_is_reached_by_a_router_at_its_address_written_another_way() -> (
    None
):
    def host(name: str, address: str) -> Host:
        return Host(name, {**DEFAULT_VARS, "ansible_host": address})

    worker = host("w", "10.0.5.3")
    assert reachability_problem(worker, host("r", "10.1283"), "127.0.0.1") is None
    assert reachability_problem(worker, host("r", "10.0.5.4"), "127.0.0.1") == (
        "w binds to 127.0.0.1, which its router r (on 10.0.5.4) cannot reach"
    )
