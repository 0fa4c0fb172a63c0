"""Nothing lost: every command, run against a host that already has logs, run records and
patch backups, leaves every one of them in place. Logs only ever grow; backups, history
records and recorded commands never change once written; no run id is used twice.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import CLI
from tests.sglang_wheel import install_on
from tests.sshd_hosts import STANDIN, SSHLab, TestHost, sh
from tests.test_faults import ssh_sessions, wait_until
from tests.test_lifecycle import prepare

OLD_LOGS = {
    "eagle3_t5_v1.log": b"[2026-11-01 10:00:00] an old run\n",
    "eagle3_t5_v3.log": b"[2026-11-02 10:00:00] another old run\n",
    "baseline_v2.log": b"[2026-11-03 10:00:00] a baseline run\n",
    "eagle3_t5_v2.log.gz": bytes(range(256)),
    "server.log": b"kept by hand\n",
}
# A run whose log was deleted to save space; its record must survive the next launch.
ORPHAN_RUN = "eagle3_t5_v4"


@dataclass
class Ledger:
    """What was on the host, and the rules it must keep."""

    host: TestHost
    logs: dict[Path, tuple[int, bytes]] = field(default_factory=dict)
    frozen: dict[Path, tuple[int, bytes]] = field(default_factory=dict)
    steps: int = 0

    def frozen_paths(self) -> list[Path]:
        state = self.host.home / ".deployctl"
        return [
            *(p for p in (state / "patches" / "backups").rglob("*") if p.is_file()),
            *(state / "patches" / "history").glob("*.json"),
            *(state / "runs").glob("*.cmd"),
            state / "runs" / f"{ORPHAN_RUN}.json",
        ]

    def check(self, step: str) -> None:
        """Every log seen so far only grew; every frozen file is byte for byte the same."""
        self.steps += 1
        for path, (inode, data) in self.logs.items():
            assert path.exists(), f"{step}: {path.name} is gone"
            now = path.read_bytes()
            assert path.stat().st_ino == inode, f"{step}: {path.name} was replaced"
            assert now.startswith(data), f"{step}: {path.name} was truncated or overwritten"
        for path, (inode, data) in self.frozen.items():
            assert path.exists(), f"{step}: {path} is gone"
            assert (path.stat().st_ino, path.read_bytes()) == (inode, data), f"{step}: {path}"
        for path in (self.host.home / "logs").iterdir():
            self.logs[path] = (path.stat().st_ino, path.read_bytes())
        for path in self.frozen_paths():
            if path.exists() and path not in self.frozen:
                self.frozen[path] = (path.stat().st_ino, path.read_bytes())


def interrupt_after(cli: CLI, host: TestHost, *args: str) -> tuple[int, str, str]:
    """Run a command that runs until Ctrl-C (logs -f, watch); press Ctrl-C once it works."""
    proc = cli.popen(*args)
    wait_until(lambda: ssh_sessions(host), 30)  # connected: past start-up
    time.sleep(1.0)  # a few rounds of polling
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err


def test_every_command_keeps_existing_logs_records_and_backups(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=2)
    host_vars["python"] = install_on(alpha, sglang_template, standin=STANDIN)
    host_vars["patches"] = ["spec-disable"]
    inv = str(hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars}))
    logs, state = alpha.home / "logs", alpha.home / ".deployctl"

    # What the host already has: old logs, an orphaned run record, an applied-then-reverted
    # patch set (its backup and history record) and a backup from long ago.
    logs.mkdir()
    for name, data in OLD_LOGS.items():
        (logs / name).write_bytes(data)
    (state / "runs").mkdir(parents=True)
    orphan = {"id": ORPHAN_RUN, "status": "stopped", "log": str(logs / f"{ORPHAN_RUN}.log")}
    (state / "runs" / f"{ORPHAN_RUN}.json").write_text(json.dumps(orphan))
    (state / "runs" / f"{ORPHAN_RUN}.cmd").write_text("python3 -m sglang.launch_server\n")
    old_backup = state / "patches" / "backups" / "spec-disable" / "20250101T000000-000001"
    (old_backup / "sglang").mkdir(parents=True)
    (old_backup / "sglang" / "version.py").write_text("# a backup from long ago\n")
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", alpha.home)

    def ok(*args: str, code: int = 0) -> str:
        result = cli(*args, "-i", inv) if args[0] != "patch" or args[1] != "list" else cli(*args)
        assert result.returncode == code, (args, result.stderr, result.stdout)
        assert "Traceback" not in result.stderr, result.stderr
        ledger.check(" ".join(args))
        return result.stdout

    ledger = Ledger(alpha)
    ledger.check("before")
    ok("patch", "apply", "spec-disable")
    ok("patch", "revert", "spec-disable")
    before = dict(ledger.frozen)
    assert len(before) > 5  # the backups, the history record, the orphan's record and command

    ok("hosts")
    ok("render", "--threshold", "5")
    ok("gpus")
    ok("patch", "list")
    ok("patch", "apply", "--dry-run")
    ok("patch", "apply")
    ok("patch", "apply")  # unchanged: a no-op
    ok("patch", "audit")
    ok("launch", "--dry-run", "--threshold", "5")
    first = json.loads(ok("launch", "--threshold", "5", "--json", "--timeout", "60"))
    assert first["hosts"]["alpha"]["run"] == "eagle3_t5_v5"  # after the logs and the orphan
    ok("status")
    ok("logs", "-n", "20")
    code, _, err = interrupt_after(cli, alpha, "logs", "-f", "-i", inv)
    assert code == 0 and "Traceback" not in err, err
    ledger.check("logs -f")
    ok("crash")
    ok("crash", "--all")
    ok("crash", "--path", str(logs / "eagle3_t5_v1.log"))
    again = json.loads(ok("restart", "--json", "--timeout", "60"))
    assert again["hosts"]["alpha"]["run"] == "eagle3_t5_v6"
    ok("restart", "--crashed")  # nothing crashed: nothing done
    code, _, err = interrupt_after(cli, alpha, "watch", "-i", inv, "--interval", "0.5")
    assert code == 0 and "Traceback" not in err, err
    ledger.check("watch")
    ok("stop")
    ok("stop")  # already stopped
    base = json.loads(ok("launch", "--template", "baseline", "--json", "--timeout", "60"))
    assert base["hosts"]["alpha"]["run"] == "baseline_v3"
    ok("launch", "--template", "baseline", code=1)  # refused: its port is taken
    ok("stop")
    ok("patch", "revert", "spec-disable")
    ok("patch", "revert", "spec-disable")  # not applied: a no-op

    # Everything that was there is still there, unchanged; old logs byte for byte.
    for name, data in OLD_LOGS.items():
        assert (logs / name).read_bytes() == data
    assert all(ledger.frozen[p] == before[p] for p in before)
    runs = sorted(p.stem for p in (state / "runs").glob("*.json"))
    assert runs == ["baseline_v3", "eagle3_t5_v4", "eagle3_t5_v5", "eagle3_t5_v6"]
    assert len(list((state / "patches" / "backups" / "spec-disable").iterdir())) == 3
    assert os.listdir(state / "patches" / "history") and not (state / "lock").exists()
    print(f"nothing lost: {ledger.steps} checks after {ledger.steps - 1} commands")
