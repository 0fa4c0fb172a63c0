"""SSH host keys are verified: unknown refused, accept-new records, changed always refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import CLI, FullDisk
from tests.sshd_hosts import SSHLab


def inventory_with_known_hosts(lab: SSHLab, tmp_path: Path, known_hosts: Path) -> Path:
    return lab.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], known_hosts_file=str(known_hosts)
    )


def test_unknown_host_key_is_refused_by_default(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    result = cli("gpus", "-i", str(inventory_with_known_hosts(hosts, tmp_path, known)), "--json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    for name in ("alpha", "bravo"):
        assert doc["hosts"][name]["ok"] is False
        assert "host key" in doc["hosts"][name]["error"]
        assert "not known" in doc["hosts"][name]["error"]
        assert "--accept-new-host-keys" in doc["hosts"][name]["hint"]
    assert known.read_text() == ""


def test_accept_new_records_keys_then_plain_runs_work(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    inventory = inventory_with_known_hosts(hosts, tmp_path, known)
    first = cli("gpus", "-i", str(inventory), "--accept-new-host-keys")
    assert first.returncode == 0, first.stderr
    recorded = known.read_text()
    for name in ("alpha", "bravo"):
        host = hosts.hosts[name]
        assert host.host_key_line.split()[2] in recorded
        # OpenSSH itself accepts what we recorded.
        ssh = subprocess.run(
            [
                "ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
                "-o", "StrictHostKeyChecking=yes", "-i", str(hosts.client_key),
                "-p", str(host.port), f"{host.user}@{host.address}", "echo", "ok",
            ],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert ssh.stdout.strip() == "ok", ssh.stderr
    second = cli("gpus", "-i", str(inventory))
    assert second.returncode == 0, second.stderr
    assert known.read_text() == recorded


def test_changed_host_key_is_always_refused(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    key_type, key_body = impostor.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    alpha = hosts.hosts["alpha"]
    known.write_text(
        f"{alpha.known_hosts_name} {key_type} {key_body}\n" + hosts.hosts["bravo"].host_key_line
    )
    before = known.read_text()
    inventory = inventory_with_known_hosts(hosts, tmp_path, known)
    for extra in ([], ["--accept-new-host-keys"]):
        result = cli("gpus", "-i", str(inventory), "--json", *extra)
        doc = json.loads(result.stdout)
        assert result.returncode == 1
        assert "CHANGED" in doc["hosts"]["alpha"]["error"]
        assert "ssh-keygen -R" in doc["hosts"]["alpha"]["hint"]
        assert doc["hosts"]["bravo"]["clean"] is True
    assert known.read_text() == before


def test_known_hosts_comes_from_the_option_then_ssh_config_then_the_home_default(
    hosts: SSHLab, cli: CLI, tmp_path: Path, client_home: Path
) -> None:
    inventory = str(hosts.inventory(tmp_path / "inv.yml", ["alpha"], known_hosts_file=None))
    chosen = tmp_path / "chosen_known_hosts"
    chosen.write_text(hosts.hosts["alpha"].host_key_line)
    default = client_home / ".ssh" / "known_hosts"

    def error(*extra: str) -> str:
        result = cli("gpus", "-i", inventory, "--json", *extra)
        doc = json.loads(result.stdout)["hosts"]["alpha"]
        return "" if doc["ok"] else doc["error"]

    assert error("--known-hosts", str(chosen)) == ""
    # Without the option: ~/.ssh/known_hosts of the user running deployctl, absent here.
    assert "not known" in error() and str(default) in error()
    # accept-new records into that default, making ~/.ssh private as OpenSSH would.
    assert cli("gpus", "-i", inventory, "--accept-new-host-keys").returncode == 0
    assert hosts.hosts["alpha"].host_key_line.split()[2] in default.read_text()
    assert (default.parent.stat().st_mode & 0o777) == 0o700
    assert error() == ""
    # ~/.ssh/config's UserKnownHostsFile comes before the default ...
    from_config = tmp_path / "from_config_known_hosts"
    from_config.write_text("")
    (client_home / ".ssh" / "config").write_text(f"Host *\n  UserKnownHostsFile {from_config}\n")
    assert "not known" in error() and str(from_config) in error()
    # ... and the option before ~/.ssh/config.
    assert error("--known-hosts", str(chosen)) == ""


def test_accept_new_on_a_full_disk_is_one_line_per_host_and_keeps_known_hosts_whole(
    hosts: SSHLab, cli: CLI, tmp_path: Path, full_disk: FullDisk
) -> None:
    known = full_disk.path / "known_hosts"
    old = ("# " + "x" * 60 + "\n") * 64  # exactly 4 KiB: a full page, so an append needs more
    known.write_text(old)
    full_disk.fill()
    inventory = inventory_with_known_hosts(hosts, tmp_path, known)
    result = cli("gpus", "-i", str(inventory), "--accept-new-host-keys", "--json")
    assert result.returncode == 1, result.stderr
    for name in ("alpha", "bravo"):
        doc = json.loads(result.stdout)["hosts"][name]
        assert (doc["code"], doc["error"]) == (
            "local_file",
            f"cannot write {known}: No space left on device",
        )
    assert known.read_text() == old  # no half line
    assert full_disk.names() == {"known_hosts"}
    known.unlink()  # and a known_hosts it would have created is not left empty
    full_disk.fill()
    result = cli("gpus", "-i", str(inventory), "--accept-new-host-keys", "--json")
    assert result.returncode == 1 and full_disk.names() == set()
