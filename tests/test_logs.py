"""`deployctl crash` and `deployctl logs` on local files and on real sshd hosts, follow included."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from deployctl.connection import ConnectOptions, LocalConnection, open_connection
from deployctl.crash import load_catalog
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.masking import mask_text
from deployctl.ops import logs as logs_op
from tests.conftest import CLI
from tests.sshd_hosts import REPO, SSHLab, TestHost, sh
from tests.streamed import Streamed

LOGS = REPO / "tests" / "data" / "logs"
TP8 = LOGS / "tp8_spec_shape_mismatch.log"
HEALTHY = LOGS / "healthy_ready.log"
REMOTE_LOG = "~/logs/server.log"

# Sample log -> the signature it must be reported under (None: healthy).
EXPECTED = {
    "chained_tokenizer_load.log": "trust-remote-code",
    "cuda_graph_oom.log": "cuda-graph-capture-oom",
    "healthy_ready.log": None,
    "healthy_warnings.log": None,
    "nccl_watchdog_timeout.log": "nccl-timeout",
    "port_in_use.log": "port-in-use",
    "syntax_error_server_args.log": "sglang-syntax-error",
    "too_many_values_to_unpack.log": "api-mismatch-unpack",
    "tp8_spec_shape_mismatch.log": "tensor-shape-mismatch",
}

SCHEDULER_CRASH = """\
[2026-11-29 10:12:20 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/env/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 3012, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/env/lib/python3.11/site-packages/sglang/srt/layers/logits_processor.py", line 402, in forward
    hidden = hidden_states[pruned] + bias
RuntimeError: The size of tensor a (160) must match the size of tensor b (2) at non-singleton dimension 0

[2026-11-29 10:12:20] Received sigquit from a child process. It usually means the child failed.
"""


def write_log(host: TestHost, data: bytes | str, name: str = "logs/server.log") -> Path:
    """Write a log into a test host's home, owned by its user."""
    path = host.home / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    sh("chown", "-R", f"{host.user}:{host.user}", host.home)
    return path


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr


# ---- crash --file ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_crash_file_reports_each_sample_log(cli: CLI, name: str) -> None:
    result = cli("crash", "--file", str(LOGS / name), "--json")
    no_traceback(result)
    crashes = json.loads(result.stdout)["crashes"]
    expected = EXPECTED[name]
    if expected is None:
        assert result.returncode == 0
        assert crashes == []
    else:
        assert result.returncode == 1
        assert [c["signature"] for c in crashes] == [expected]
        assert set(crashes[0]) >= {"exception", "message", "file", "line", "ranks", "hint"}


def test_crash_file_tp8_is_one_report_with_eight_ranks(cli: CLI) -> None:
    doc = json.loads(cli("crash", "--file", str(TP8), "--json").stdout)
    assert len(doc["crashes"]) == 1
    crash = doc["crashes"][0]
    assert crash["ranks"] == [f"TP{n}" for n in range(8)]
    assert crash["exception"] == "RuntimeError"
    assert (crash["line"], crash["function"]) == (402, "forward")
    human = cli("crash", "--file", str(TP8))
    assert human.returncode == 1
    out = human.stdout
    assert out.count("crash: Tensor shape mismatch") == 1
    assert "RuntimeError: The size of tensor a (160) must match" in out
    assert "logits_processor.py:402 in forward" in out
    assert "ranks: TP0-TP7 (8)" in out
    assert "hint: Tensor a has size 160" in out


@pytest.mark.heavy
def test_crash_file_errors_are_one_line_and_junk_is_no_crash(cli: CLI, tmp_path: Path) -> None:
    for target, what in ((tmp_path / "nope.log", "does not exist"), (tmp_path, "is a directory")):
        result = cli("crash", "--file", str(target))
        no_traceback(result)
        assert result.returncode == 1
        assert result.stderr.splitlines() == [result.stderr.splitlines()[0]]
        assert result.stderr.startswith("error: ") and what in result.stderr
    binary = tmp_path / "binary.log"
    binary.write_bytes(bytes(range(256)) * 4000 + b"\xff\xfe\x00" * 1000)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    for target in (binary, empty):
        result = cli("crash", "--file", str(target))
        no_traceback(result)
        assert result.returncode == 0
        assert "no crash" in result.stdout


# ---- crash over SSH ----------------------------------------------------------------------


def test_crash_over_ssh_reports_per_host(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    names = ["alpha", "bravo", "charlie", "delta"]
    inventory = hosts.inventory(tmp_path / "inv.yml", names)
    write_log(hosts.hosts["alpha"], TP8.read_bytes())
    write_log(hosts.hosts["bravo"], HEALTHY.read_bytes())
    (hosts.hosts["delta"].home / "logs" / "server.log").mkdir(parents=True)
    result = cli(
        "crash", "-i", str(inventory), "--path", REMOTE_LOG, "-H", ",".join(names), "--json"
    )
    no_traceback(result)
    assert result.returncode == 1
    doc = json.loads(result.stdout)["hosts"]
    alpha, bravo, charlie, delta = (doc[n] for n in names)
    assert alpha["ok"] and alpha["log"] == REMOTE_LOG
    assert alpha["size"] == alpha["scanned_bytes"] == TP8.stat().st_size
    assert [c["signature"] for c in alpha["crashes"]] == ["tensor-shape-mismatch"]
    assert len(alpha["crashes"][0]["ranks"]) == 8
    assert bravo["ok"] and bravo["crashes"] == [] and bravo["error"] is None
    assert not charlie["ok"] and "does not exist" in charlie["error"] and charlie["crashes"] == []
    assert not delta["ok"] and "is a directory" in delta["error"]

    human = cli("crash", "-i", str(inventory), "--path", REMOTE_LOG, "-H", "alpha,bravo,charlie")
    no_traceback(human)
    assert human.returncode == 1
    assert "alpha: 1 crash in ~/logs/server.log" in human.stdout
    assert "bravo: no crash found in ~/logs/server.log (scanned 5.2 KiB of 5.2 KiB)" in human.stdout
    assert human.stderr.startswith("charlie: error: log ~/logs/server.log does not exist")

    healthy = cli("crash", "-i", str(inventory), "--path", REMOTE_LOG, "-H", "bravo")
    assert healthy.returncode == 0, healthy.stderr


def test_crash_scan_reads_growing_windows_from_the_end(
    hosts: SSHLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha = hosts.hosts["alpha"]
    # 3 MiB of healthy lines, a crash, then 100 kB more: a 1 MiB tail still holds the crash.
    filler = "[2026-11-29 10:12:01 TP0] Decode batch, #running-req: 10, gen throughput: 9.0\n"
    text = filler * (3 * 1024 * 1024 // len(filler)) + SCHEDULER_CRASH + filler * 1300
    log = str(write_log(alpha, text))
    crash_line = text.count("\n", 0, text.index("[2026-11-29 10:12:20 TP0]")) + 1
    # The first window (64 KiB) misses the crash, the second (1 MiB) holds it.
    monkeypatch.setattr(logs_op, "TAIL_WINDOWS", (64 << 10, 1 << 20))
    monkeypatch.setattr(logs_op, "SCAN_CHUNK_BYTES", 1 << 20)
    host = Host("alpha", {**DEFAULT_VARS, **alpha.inventory_vars(hosts.client_key)})
    catalog = load_catalog()
    local = LocalConnection("alpha", 30)
    ssh = open_connection(host, ConnectOptions(known_hosts=hosts.known_hosts))
    try:
        for conn in (local, ssh):
            tail = logs_op.scan_log(host, conn, catalog, None, log, scan_all=False)
            assert (tail.size, tail.scanned_bytes) == (len(text), 1 << 20)
            assert [c.signature for c in tail.crashes] == ["tensor-shape-mismatch"]
            whole = logs_op.scan_log(host, conn, catalog, None, log, scan_all=True)
            assert whole.scanned_bytes == whole.size == len(text)
            assert [c.log_line for c in whole.crashes] == [crash_line]
        # Two windows from the end, then --all in four 1 MiB pieces.
        assert local.round_trips == ssh.round_trips == 2 + 4
    finally:
        ssh.close()


# ---- logs --------------------------------------------------------------------------------


def test_logs_prints_exactly_the_last_lines(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo", "charlie"])
    lines = [f"[2026-11-29 10:12:{n:02d}] line {n}" for n in range(20)]
    write_log(hosts.hosts["alpha"], "\n".join(lines) + "\n")
    write_log(hosts.hosts["bravo"], "\n".join(lines))  # no newline at the end
    # Lines longer than the first window make the tail grow backwards.
    wide = [f"{n} " + "x" * 50_000 for n in range(10)]
    write_log(hosts.hosts["charlie"], "\n".join(wide) + "\n")

    one = cli("logs", "-i", str(inventory), "-H", "alpha", "--path", REMOTE_LOG, "-n", "5")
    no_traceback(one)
    assert one.returncode == 0
    assert one.stdout.splitlines() == lines[-5:]

    two = cli("logs", "-i", str(inventory), "-H", "alpha,bravo", "--path", REMOTE_LOG, "-n", "5")
    assert two.returncode == 0
    out = two.stdout.splitlines()
    assert out == [f"alpha | {line}" for line in lines[-5:]] + [
        f"bravo | {line}" for line in lines[-5:]
    ]

    big = cli("logs", "-i", str(inventory), "-H", "charlie", "--path", REMOTE_LOG, "-n", "3")
    assert big.stdout.splitlines() == wide[-3:]


def test_logs_finds_the_run_log_or_says_there_is_none(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    alpha = hosts.hosts["alpha"]
    log = write_log(alpha, "first\nsecond\nthird\n", "deployctl/logs/eagle3_t5_v1.log")
    runs = alpha.home / ".deployctl" / "runs"
    runs.mkdir(parents=True)
    record = {  # as the agent's start writes it, for a run long gone
        "template": "eagle3", "threshold": 5, "command": "python3 -m sglang.launch_server",
        "port": 30000, "bind_host": "127.0.0.1", "tp": 1, "patches": {},
        "deployctl_version": "0.1.0", "started_by": "test", "restart_of": None,
        "id": "eagle3_t5_v1", "log": str(log), "pid": 999999, "pgid": 999999, "sid": 999999,
        "started_at": 0.0, "status": "running",
    }  # fmt: skip
    (runs / "eagle3_t5_v1.json").write_text(json.dumps(record))
    (runs / "current").write_text("eagle3_t5_v1")
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", alpha.home)

    result = cli("logs", "-i", str(inventory), "-H", "alpha,bravo", "-n", "2")
    no_traceback(result)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["alpha | second", "alpha | third"]
    assert "bravo: error: no run recorded on bravo" in result.stderr
    assert "bravo: hint: launch one, or give --path" in result.stderr

    named = cli("logs", "-i", str(inventory), "-H", "alpha", "--run", "eagle3_t5_v1", "-n", "1")
    assert named.stdout == "third\n"


def test_logs_crash_prints_only_reports(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    write_log(hosts.hosts["alpha"], TP8.read_bytes())
    write_log(hosts.hosts["bravo"], HEALTHY.read_bytes())
    result = cli("logs", "-i", str(inventory), "-H", "alpha,bravo", "--path", REMOTE_LOG, "--crash")
    no_traceback(result)
    assert result.returncode == 0
    assert "alpha: 1 crash in ~/logs/server.log" in result.stdout
    assert "ranks: TP0-TP7 (8)" in result.stdout
    assert "bravo: no crash found in ~/logs/server.log" in result.stdout
    assert "Decode batch" not in result.stdout  # no plain log lines


# ---- logs --follow -----------------------------------------------------------------------


class Follow(Streamed):
    """`deployctl logs -f` as a subprocess, its stdout read line by line in a thread."""

    def __init__(self, cli: CLI, *args: str) -> None:
        super().__init__(cli.popen("logs", "-f", *args))


def append(path: Path, text: str) -> None:
    with path.open("a") as handle:
        handle.write(text)


def test_follow_streams_new_lines_and_marks_the_crash(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    log = write_log(hosts.hosts["alpha"], "old 1\nold 2\nold 3\npartial")
    follow = Follow(cli, "-i", str(inventory), "-H", "alpha", "--path", REMOTE_LOG, "-n", "2")
    try:
        follow.expect("old 3")
        append(log, " line done\n")
        healthy = [
            f"[2026-11-29 10:12:{n:02d} TP0] Decode batch, #running-req: {n}" for n in range(6)
        ]
        for line in healthy:
            append(log, line + "\n")
            time.sleep(0.05)
        append(log, SCHEDULER_CRASH)
        follow.expect("CRASH: Tensor shape mismatch")
        follow.expect("hint:")
        # Truncation (a log rewritten in place) restarts from the file's start.
        log.write_text("fresh start\n")
        follow.expect("fresh start")
    finally:
        code, err = follow.interrupt()
    seen = follow.seen
    assert seen[:3] == ["old 2", "old 3", "partial line done"]
    for line in healthy:
        assert seen.count(line) == 1
    assert (
        "!! [2026-11-29 10:12:20 TP0] Scheduler hit an exception: Traceback (most recent call last):"
        in seen
    )
    assert any(line.startswith("!! RuntimeError: The size of tensor a (160)") for line in seen)
    assert not any(line.startswith("!! ") for line in seen[: 3 + len(healthy)])
    assert code == 0, err
    assert "Traceback" not in err


def test_follow_two_hosts_prefixes_lines_and_reports_a_failed_host(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    log = write_log(hosts.hosts["alpha"], "start\n")
    follow = Follow(cli, "-i", str(inventory), "-H", "alpha,bravo", "--path", REMOTE_LOG)
    try:
        follow.expect("alpha | start")
        append(log, "next\n")
        follow.expect("alpha | next")
    finally:
        code, err = follow.interrupt()
    assert code == 1
    assert "bravo: error: log ~/logs/server.log does not exist on bravo" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_crash_file_refuses_what_is_not_a_regular_file(cli: CLI, tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        target = tmp_path / "pipe.log"
        os.mkfifo(target)  # opening it would wait for a writer forever
    else:
        target = Path("/dev/zero")  # --all would never end
    result = cli("crash", "--file", str(target), "--all", timeout=20)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {target} is not a regular file"), result.stderr


@pytest.mark.parametrize(
    ("env", "color"), [({}, True), ({"NO_COLOR": "1"}, False), ({"TERM": "dumb"}, False)]
)
def test_crash_lines_are_coloured_only_where_colour_is_welcome(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], color: bool
) -> None:
    from deployctl.present.live import LogPrinter

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert LogPrinter(prefixed=False).color is color


def test_follow_outlives_a_lost_connection_and_says_so_once(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """sshd and the session die; the follow reconnects with backoff and misses nothing."""
    bravo = hosts.hosts["bravo"]
    inventory = hosts.inventory(tmp_path / "inv.yml", ["bravo"])
    log = write_log(bravo, "before\n")
    follow = Follow(cli, "-i", str(inventory), "-H", "bravo", "--path", REMOTE_LOG)
    try:
        follow.expect("before")
        bravo.go_away()
        append(log, "while down\n")
        time.sleep(3)  # several polls fail meanwhile
        bravo.start()
        append(log, "after\n")
        follow.expect("after")
    finally:
        bravo.ensure_running()
        code, err = follow.interrupt()
    assert follow.seen == ["before", "while down", "after"]
    assert err.count("bravo: connection lost") == 1 and err.count("bravo: reconnected") == 1, err
    assert code == 0 and "Traceback" not in err


def test_crash_calls_a_trace_in_a_healthy_servers_log_a_warning_as_status_does(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    from tests.test_lifecycle import launch_json
    from tests.test_safety import one_host, wait_for

    _, inv = one_host(hosts, tmp_path, request_error=True, crash_after_s=0.1)
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    log = Path(doc["hosts"]["alpha"]["log"])
    wait_for(lambda: "Exception in ASGI application" in log.read_text())

    scanned = cli("crash", "-i", str(inv), "--json")
    entry = json.loads(scanned.stdout)["hosts"]["alpha"]
    assert scanned.returncode == 0, scanned.stdout + scanned.stderr
    assert entry["healthy"] is True and entry["crashes"] == []
    assert "ValueError" in json.dumps(entry["warnings"])
    human = cli("crash", "-i", str(inv))
    assert human.returncode == 0 and "the server is alive and healthy" in human.stdout
    assert "warning: " in human.stdout, human.stdout
    # The same log read as a file is no run's: its trace is reported as found.
    by_path = cli("crash", "-i", str(inv), "--path", str(log), "--json")
    assert by_path.returncode == 1 and json.loads(by_path.stdout)["hosts"]["alpha"]["crashes"]
    cli("stop", "-i", str(inv))


# ---- secrets and control characters in host text -----------------------------------------------

KEY = "sk-live-0123456789abcdef"
HF = "hf_SeCrEt0123456789"
# SGLang 0.5.23's engine.py logs `server_args={…}` (a dict of the resolved arguments);
# ServerArgs.__repr__ (printed by older releases and in errors) is `ServerArgs(name=value, …)`.
# Secrets no inventory knows, each right after another pair (which once hid it), in a URL,
# a header, or of a well-known shape: each line as written and as shown.
PAIR_LINES = {
    "connecting to postgres://deploy:SEKRIT5-live@db/x": "connecting to postgres://deploy:********@db/x",
    "headers={'Authorization': 'Basic SEKRIT6-live'}": "headers={'Authorization': 'Basic ********'}",
    "cached hf_SEKRIT7liveSEKRIT7liveSEKRIT7live0 and sk-proj-SEKRIT8-live-0123456789": (
        "cached ******** and ********"
    ),
    "args: --api-key SEKRIT1-live": "args: --api-key ********",
    "argv=--api-key=SEKRIT2-live": "argv=--api-key=********",
    "env: HF_TOKEN=SEKRIT3-live": "env: HF_TOKEN=********",
    "cmd: --admin-api-key SEKRIT4-live": "cmd: --admin-api-key ********",
}
PAIR_CRASH = (
    "RuntimeError: \x1b[2Jrejected api_key='{key}' (args: --api-key SEKRIT9-live): The size"
)
PAIR_SECRETS = [f"SEKRIT{i}" for i in range(1, 10)]
PAIR_PREFIX = "[2026-11-29 10:12:05 TP3] "
SECRET_LOG = (
    f"""\
[2026-11-29 10:12:00] server_args={{'model_path': '/m', 'tokenizer_path': '/m', 'api_key': '{KEY}', 'admin_api_key': None, 'hf_token': "{HF}", 'bucket_time_to_first_token': None}}
[2026-11-29 10:12:01] ServerArgs(model_path='/m', api_key='{KEY}', admin_api_key=None, max_total_tokens=5)
[2026-11-29 10:12:02] launched: python -m sglang.launch_server --api-key {KEY} --hf-token={HF} --port 30000
[2026-11-29 10:12:03] Decode batch, #running-req: 1, #token: 1234, #new-token: 5, token usage: 0.01
[2026-11-29 10:12:04] title \x1b]0;pwned\x07 then \x1b[2J cleared
"""
    + "".join(f"{PAIR_PREFIX}{line}\n" for line in PAIR_LINES)
    + SCHEDULER_CRASH.replace("RuntimeError: The size", PAIR_CRASH.format(key=KEY))
)


def pair_leaks(text: str) -> list[str]:
    return [s for s in [KEY, HF, *PAIR_SECRETS] if s in text]


def test_log_text_is_masked_in_every_form_sglang_logs_it() -> None:
    masked = mask_text(SECRET_LOG, ("inventory-secret-value",))
    assert KEY not in masked and HF not in masked
    assert "'api_key': '********'" in masked and "'hf_token': \"********\"" in masked
    assert "ServerArgs(model_path='/m', api_key='********', admin_api_key=None," in masked
    assert "--api-key ******** --hf-token=******** --port 30000" in masked
    # Counts and paths under token-like names are no secrets.
    assert "#token: 1234, #new-token: 5, token usage: 0.01" in masked
    assert "'tokenizer_path': '/m'" in masked and "'bucket_time_to_first_token': None" in masked
    assert mask_text("HF_TOKEN=hf_x WANDB_API_KEY=abc password: hunter2") == (
        "HF_TOKEN=******** WANDB_API_KEY=******** password: ********"
    )
    assert mask_text("Authorization: Bearer abc.def") == "Authorization: Bearer ********"
    assert mask_text("say inventory-secret-value", ("inventory-secret-value",)) == "say ********"
    for line, shown in PAIR_LINES.items():
        assert f"{PAIR_PREFIX}{shown}\n" in masked, line
    assert pair_leaks(masked) == []


@pytest.mark.heavy
def test_logs_and_crash_mask_each_pair_of_a_line_on_its_own(cli: CLI, tmp_path: Path) -> None:
    # A host reached without ssh: `logs` reads the file through the host agent as over ssh.
    log = tmp_path / "server.log"
    log.write_text(SECRET_LOG)
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      state_dir: {tmp_path / 'state'}\n"
    )
    where = ("-i", str(inv), "--path", str(log), "-n", "40")
    shown = cli("logs", *where)
    assert shown.returncode == 0, shown.stderr
    assert pair_leaks(shown.stdout) == [], shown.stdout
    as_json = cli("logs", *where, "--json")
    lines = [json.loads(line)["line"] for line in as_json.stdout.splitlines() if '"line"' in line]
    for line, masked in PAIR_LINES.items():
        assert f"{PAIR_PREFIX}{masked}" in lines, line
    assert pair_leaks(as_json.stdout) == []
    found = cli("crash", "--file", str(log), "--json")
    message = json.loads(found.stdout)["crashes"][0]["message"]
    assert "api_key='********' (args: --api-key ********): The size" in message
    assert pair_leaks(found.stdout) == []


def test_logs_and_crash_mask_secrets_and_show_control_characters_escaped(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    write_log(hosts.hosts["alpha"], SECRET_LOG)
    where = ("-i", str(inventory), "-H", "alpha", "--path", REMOTE_LOG)

    shown = cli("logs", *where, "-n", "40")
    no_traceback(shown)
    assert pair_leaks(shown.stdout) == []
    assert "'api_key': '********'" in shown.stdout
    assert "title \\x1b]0;pwned\\x07 then \\x1b[2J cleared" in shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    # JSON keeps the text as it is (JSON escapes it), secrets masked all the same.
    lines = [
        json.loads(line)
        for line in cli("logs", *where, "-n", "40", "--json").stdout.split("\n")
        if line
    ]
    text = "\n".join(str(doc.get("line", "")) for doc in lines)
    assert pair_leaks(text) == [] and "title \x1b]0;pwned\x07 then" in text
    assert f"{PAIR_PREFIX}env: HF_TOKEN=********" in text

    crash = cli("crash", *where)
    no_traceback(crash)
    assert crash.returncode == 1
    assert pair_leaks(crash.stdout) == [] and "\x1b" not in crash.stdout
    assert (
        "RuntimeError: \\x1b[2Jrejected api_key='********' (args: --api-key ********): The size"
        in crash.stdout
    )
    local = tmp_path / "copy.log"
    local.write_text(SECRET_LOG)
    for scan in ([], ["--all"]):
        found = cli("crash", "--file", str(local), "--json", *scan)
        assert found.returncode == 1
        message = json.loads(found.stdout)["crashes"][0]["message"]
        assert pair_leaks(message) == [] and "api_key='********'" in message

    follow = Follow(cli, *where, "-n", "40")
    try:
        follow.expect("cleared")
        follow.expect("hint:")
    finally:
        follow.interrupt()
    seen = "\n".join(follow.seen)
    assert pair_leaks(seen) == [] and "\x1b" not in seen
