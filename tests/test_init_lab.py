"""`deployctl init` over real sshd hosts named as ~/.ssh/config names them: the inventory it
writes launches, a host it cannot read is named and left out, no file is overwritten."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import CLI
from tests.sglang_wheel import install_on
from tests.sshd_hosts import STANDIN, SSHLab, free_port, sh


def ssh_config(lab: SSHLab, home: Path, names: list[str], gone: str = "gone") -> None:
    """The client's ~/.ssh/config: an alias for each test host, and `gone` where nothing
    listens."""
    entries = []
    for name in names:
        host = lab.hosts[name]
        entries.append(
            f"Host {name}\n  HostName {host.address}\n  Port {host.port}\n  User {host.user}\n"
            f"  IdentityFile {lab.client_key}\n  UserKnownHostsFile {lab.known_hosts}\n"
        )
    address = lab.hosts[names[0]].address
    entries.append(f"Host {gone}\n  HostName {address}\n  Port {free_port(address)}\n")
    (home / ".ssh").mkdir(exist_ok=True)
    (home / ".ssh" / "config").write_text("".join(entries))


def give_model(lab: SSHLab, name: str) -> Path:
    """A model folder where models usually are: ~/models/<name>/config.json (and the
    stand-in's own settings)."""
    host = lab.hosts[name]
    model = host.home / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "standin.json").write_text('{"startup_s": 0.3}')
    sh("chown", "-R", f"{host.user}:{host.user}", host.home / "models")
    return model


def test_init_writes_an_inventory_that_launches_and_leaves_out_what_it_cannot_read(
    hosts: SSHLab, sglang_template: Path, cli: CLI
) -> None:
    alpha = hosts.hosts["alpha"]
    python = str(Path(install_on(alpha, sglang_template, standin=STANDIN)).with_name("python3"))
    alpha.set_gpus("clean", 2)
    model = give_model(hosts, "alpha")
    ssh_config(hosts, cli.home, ["alpha", "bravo"])

    result = cli("init", "alpha", "bravo", "gone", "--json")
    assert result.returncode == 1, result.stderr  # one host could not be read
    doc = json.loads(result.stdout)
    assert doc["written"] is True and doc["backup"] is None
    assert doc["hosts"]["gone"]["ok"] is False and doc["hosts"]["gone"]["code"] == "connect"
    read = doc["hosts"]["alpha"]
    assert [s["python"] for s in read["sglang"]] == [python]
    assert read["sglang"][0]["version"] == "0.5.23"
    assert read["sglang"][0]["patches"]["spec-disable"] == "missing"
    assert read["islands"] == [[0, 1]] and read["models"] == [str(model)]
    assert read["sbatch"]  # the lab's hosts have Slurm's client
    assert doc["hosts"]["bravo"]["sglang"] == []

    inventory = cli.cwd / "inventory.yml"
    text = inventory.read_text()
    assert text == doc["inventory"]
    assert "#   gone: " in text and "gone:" not in text.split("all:", 1)[1]
    assert "# python: /path/to/python  # no SGLang found" in text  # bravo

    # What init wrote launches, as it is: the stand-in stands for SGLang (no GPU here).
    own = ("-i", str(inventory), "-H", "alpha", "--set", "launch_module=sglang_standin")
    dry = cli("launch", *own, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    started = cli("launch", *own, "--timeout", "60", "--json")
    assert started.returncode == 0, started.stderr
    run = json.loads(started.stdout)["hosts"]["alpha"]
    assert run["state"] == "ready" and run["log"].startswith(str(alpha.home))
    rendered = json.loads(cli("render", *own, "--json").stdout)["hosts"]["alpha"]
    command = rendered["command"]
    assert command.startswith(f"{python} -m sglang_standin --model-path={model} --tp-size=2 ")
    assert rendered["env"].get("CUDA_VISIBLE_DEVICES") == "0,1", rendered
    stopped = cli("stop", "-i", str(inventory), "-H", "alpha", "--json")
    assert stopped.returncode == 0, stopped.stderr

    # Never overwritten: a second init is refused and changes nothing; --force keeps a backup.
    again = cli("init", "alpha")
    assert again.returncode == 1 and "inventory.yml exists" in again.stderr
    assert inventory.read_text() == text
    forced = cli("init", "alpha", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    backup = cli.cwd / json.loads(forced.stdout)["backup"]  # as the file was named: relative
    assert backup.read_text() == text and backup.name.endswith(".bak")
    assert "bravo" not in inventory.read_text()

    # -i adds hosts to the file (its text kept as it was); one it has already is refused.
    shutil.copy(inventory, cli.cwd / "before.yml")
    same = cli("init", "-i", str(inventory), "alpha")
    assert same.returncode == 1 and "already in the inventory: alpha" in same.stderr
    added = cli("init", "-i", str(inventory), "bravo", "--json")
    assert added.returncode == 0, added.stderr
    assert inventory.read_text().startswith((cli.cwd / "before.yml").read_text().rstrip("\n"))
    listed = json.loads(cli("hosts", "-i", str(inventory), "--json").stdout)["hosts"]
    assert set(listed) == {"alpha", "bravo"}
