"""Slurm as a launcher, its pure parts: the batch script, and the parsers of what squeue,
sacct and scontrol print (captured from Debian's slurm-wlm 22.05). The jobs themselves run
on a real Slurm in tests/test_slurm_jobs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.errors import InventoryError
from deployctl.inventory import Host
from deployctl.launchers.slurm.batch import (
    batch_script,
    checked_form,
    directives,
    step_word,
    template_context,
    time_limit_s,
)
from deployctl.remote.slurm_jobs import (
    parse_node_address,
    parse_sacct,
    parse_slurm_duration,
    parse_squeue,
)
from deployctl.settings import Settings, check_settings
from tests.conftest import CLI


def settings(**variables: object) -> Settings:
    return Settings({"launcher": "slurm", **variables}, "host login")


def test_durations_are_read_in_every_form_squeue_prints() -> None:
    assert parse_slurm_duration("1-02:03:04") == 93784
    assert parse_slurm_duration("3:59:58") == 14398
    assert parse_slurm_duration("9:30") == 570
    for text in ("UNLIMITED", "NOT_SET", "INVALID", ""):
        assert parse_slurm_duration(text) is None


def test_squeue_lines_give_state_reason_nodes_and_time_left() -> None:
    running = parse_squeue("12|RUNNING|None|n[1-2]|3:59:58\n13|PENDING|Resources||4:00:00\n", "12")
    assert running is not None
    assert (running["state"], running["reason"], running["nodes"]) == ("RUNNING", "", ["n[1-2]"])
    assert running["time_left"] == 14398
    pending = parse_squeue("12|RUNNING|None|n1|3:59:58\n13|PENDING|Resources||4:00:00\n", "13")
    assert pending is not None
    assert (pending["state"], pending["reason"], pending["nodes"]) == ("PENDING", "Resources", [])
    assert pending["time_left"] is None  # not running: its limit has not started
    assert parse_squeue("12|RUNNING|None|n1|1:00\n", "1") is None
    assert parse_squeue("slurm_load_jobs error: Invalid job id specified\n", "12") is None


def test_sacct_states_lose_their_by_and_keep_the_exit_code() -> None:
    job = parse_sacct("14|CANCELLED by 1001|0:15|n1\n", "14")
    assert job is not None and (job["state"], job["exit_code"], job["nodes"]) == (
        "CANCELLED",
        "0:15",
        ["n1"],
    )
    never = parse_sacct("15|CANCELLED by 0|0:0|None assigned\n", "15")
    assert never is not None and never["nodes"] == []
    assert parse_sacct("", "14") is None


def test_the_node_address_is_read_from_scontrol() -> None:
    text = "NodeName=n1 Arch=x86_64 CoresPerSocket=1\n   NodeAddr=127.0.3.1 NodeHostName=box\n"
    assert parse_node_address(text) == "127.0.3.1"
    assert parse_node_address("Node n9 not found\n") == ""


def test_a_multi_node_job_reads_its_rank_inside_the_step() -> None:
    context = template_context(settings(slurm_nodes=2, dist_port=20001))
    assert context == {
        "nnodes": 2,
        "node_rank": "${SLURM_NODEID}",
        "dist_init_addr": "${DEPLOYCTL_HEAD_ADDR}:20001",
    }
    assert template_context(settings()) == {}  # one node: no multi-node flags
    assert template_context(Settings({"slurm_nodes": 2}, "h")) == {}  # not a Slurm host
    assert step_word("--node-rank=${SLURM_NODEID}") == '--node-rank="${SLURM_NODEID}"'
    assert step_word("--x=$(reboot)") == "'--x=$(reboot)'"  # anything else stays quoted
    assert checked_form(
        ["--node-rank=${SLURM_NODEID}", "--dist-init-addr=${DEPLOYCTL_HEAD_ADDR}:1"]
    ) == [
        "--node-rank=0",
        "--dist-init-addr=127.0.0.1:1",
    ]


def test_directives_come_from_the_settings_and_gpus_default_to_the_share_of_tp() -> None:
    given = settings(
        slurm_nodes=2,
        slurm_partition="gpu",
        slurm_account="ml",
        slurm_qos="high",
        slurm_time="4:00:00",
        slurm_exclusive=True,
        slurm_extra=["--constraint=h200"],
    )
    assert directives(given, 16) == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--account=ml",
        "--qos=high",
        "--time=4:00:00",
        "--exclusive",
        "--constraint=h200",
    ]
    assert "--gpus-per-node=2" in directives(settings(slurm_gpus_per_node=2), 8)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("deployctl_launcher", "kubernetes"),
        ("deployctl_slurm_time", "four hours"),
        ("deployctl_slurm_partition", "gpu\n#SBATCH --uid=0"),
        ("deployctl_slurm_extra", ["--exclusive\n#SBATCH --uid=0"]),
        ("deployctl_slurm_extra", ["exclusive"]),
        ("deployctl_slurm_nodes", 0),
    ],
)
def test_settings_that_would_break_the_script_are_refused(name: str, value: object) -> None:
    with pytest.raises(InventoryError) as caught:
        check_settings({name: value}, "host login")
    assert name in caught.value.message


def fake_slurm(folder: Path, nodes: int, gpu_mib: dict[str, int]) -> dict[str, str]:
    """srun, scontrol and nvidia-smi stand-ins on PATH for running a batch script here: srun
    runs its command once per node with that node's SLURM_NODEID and SLURMD_NODENAME."""
    folder.mkdir()
    (folder / "srun").write_text(
        "#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\n"
        f"for i in $(seq 0 {nodes - 1}); do SLURM_NODEID=$i SLURMD_NODENAME=n$((i + 1)) "
        '"$@" || exit $?; done\n'
    )
    (folder / "scontrol").write_text(
        '#!/bin/bash\nif [ "$2" = hostnames ]; then echo n1; echo n2; '
        'else echo "NodeName=$3 NodeAddr=127.0.3.${3#n} State=IDLE"; fi\n'
    )
    lines = "".join(
        f'[ "$SLURMD_NODENAME" = {node} ] && echo "0, {mib}" && exit 0\n'
        for node, mib in gpu_mib.items()
    )
    (folder / "nvidia-smi").write_text(f"#!/bin/bash\n{lines}echo '0, 0'\n")
    for tool in folder.iterdir():
        tool.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{folder}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
    }


def script_for(tmp_path: Path, **variables: object) -> Path:
    """The batch script of a two-node server whose `python` prints its argv."""
    show = tmp_path / "show-argv"
    show.write_text('#!/bin/sh\n[ "$1" = -c ] && exec python3 "$@"\necho "$SLURMD_NODENAME: $*"\n')
    show.chmod(0o755)
    host = Host("login", {"launcher": "slurm", "slurm_nodes": 2, "python": str(show), **variables})
    argv = [str(show), "-m", "sglang.launch_server", "--tp-size=2", "--nnodes=2"]
    argv += ["--node-rank=${SLURM_NODEID}", "--dist-init-addr=${DEPLOYCTL_HEAD_ADDR}:20000"]
    text = batch_script(
        host.settings,
        argv,
        {"NCCL_DEBUG": "INFO"},
        tp=2,
        port=30123,
        bind_host="0.0.0.0",
        max_used_mib=16,
    )
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    return path


@pytest.mark.heavy
def test_the_script_runs_each_node_with_its_own_rank_and_the_head_address(tmp_path: Path) -> None:
    script = script_for(tmp_path)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    env = fake_slurm(tmp_path / "bin", 2, {})
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "[deployctl] job 7 on n[1-2], head n1 (127.0.3.1)" in lines
    assert "[deployctl] node n1: GPUs all clean, port 30123 free" in lines
    servers = [line for line in lines if "sglang.launch_server" in line]
    assert len(servers) == 2
    assert "--node-rank=0 --dist-init-addr=127.0.3.1:20000" in servers[0]
    assert servers[0].startswith("n1:") and servers[1].startswith("n2:")
    assert "--node-rank=1 --dist-init-addr=127.0.3.1:20000" in servers[1]


def test_a_dirty_gpu_on_any_node_fails_the_job_before_the_server(tmp_path: Path) -> None:
    env = fake_slurm(tmp_path / "bin", 2, {"n2": 8811})
    script = script_for(tmp_path)
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "[deployctl] GPU 0 on node n2 is not clean: 8811 MiB in use" in out
    assert "the server was not started" in out
    assert "sglang.launch_server" not in out


def fake_tools(folder: Path, **scripts: str) -> dict[str, str]:
    """Executables named by the keywords, each a shell script body, first on PATH."""
    folder.mkdir()
    for name, body in scripts.items():
        tool = folder / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def query(env: dict[str, str], known: dict[str, object] | None) -> subprocess.CompletedProcess[str]:
    """remote.slurm_jobs.query_job in a process of its own, its failure (the agent's answer,
    CallFailed) printed and exit 1, as the agent's dispatch answers it."""
    code = (
        "import json, sys\n"
        "from deployctl.remote.files import CallFailed\n"
        "from deployctl.remote.slurm_jobs import query_job\n"
        "try:\n"
        "    print(json.dumps(query_job('12', json.loads(sys.argv[1]))))\n"
        "except CallFailed as failed:\n"
        "    sys.exit(print(failed.message) or 1)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(known)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_a_job_slurm_has_forgotten_keeps_the_state_its_record_saw(tmp_path: Path) -> None:
    env = fake_tools(
        tmp_path / "bin",
        squeue='echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1',
        sacct='echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1',
    )
    ended = {"id": "12", "state": "CANCELLED", "reason": "", "nodes": ["n1"], "head": "10.0.0.1",
             "time_left": None, "exit_code": "0:15"}  # fmt: skip
    done = query(env, ended)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ended
    # A job recorded as running that Slurm no longer knows has ended some way unknown; where
    # it ran is still known (its router lists it at its head).
    done = query(env, {**ended, "state": "RUNNING"})
    forgotten = json.loads(done.stdout)
    assert forgotten["state"] == "UNKNOWN" and forgotten["reason"].startswith("last seen RUNNING")
    assert (forgotten["nodes"], forgotten["head"]) == (["n1"], "10.0.0.1")


def test_a_controller_that_does_not_answer_is_an_error_not_a_dead_job(tmp_path: Path) -> None:
    env = fake_tools(
        tmp_path / "bin",
        squeue='echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1',
    )
    done = query(env, None)
    assert done.returncode == 1
    assert (
        "squeue failed on the login node: squeue: error: Unable to contact slurm controller"
        in done.stdout
    )


def test_the_script_people_see_masks_secrets_and_the_one_sbatch_gets_has_them() -> None:
    from deployctl.ops.plan import Plan
    from deployctl.render import RenderedCommand

    host = Host("login", {"launcher": "slurm", "bind_host": "0.0.0.0", "port": 30000})
    argv = ["python3", "-m", "sglang.launch_server", "--api-key=s3cret-key"]
    rendered = RenderedCommand("baseline", None, argv, ("s3cret-key",), {"HF_TOKEN": "hf_abc"})
    plan = Plan(host, rendered, [])
    shown, real = plan.launcher_script(masked=True), plan.launcher_script(masked=False)
    assert "s3cret-key" not in shown and "hf_abc" not in shown and "********" in shown
    assert "--api-key=s3cret-key" in real and "export HF_TOKEN=hf_abc" in real


# ---- the slurm_* settings as a user writes them (refused before any host is asked) ----------


def unreachable_login(tmp_path: Path, **variables: object) -> Path:
    """An inventory whose one host, a Slurm login node, nothing answers for (port 1): a
    command that got as far as asking it would fail on the connection, not on the setting."""
    host = {
        "ansible_host": "127.0.0.1", "ansible_port": 1, "connect_timeout": 2,
        "launcher": "slurm", "bind_host": "0.0.0.0", "model_path": "/models/m", "tp": 1,
        "template": "baseline", **variables,
    }  # fmt: skip
    path = tmp_path / "inv.yml"
    path.write_text(json.dumps({"all": {"hosts": {"login": host}}}))
    return path


def refusal(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """A refusal's `error:` and `hint:` lines, checked to be just those."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: "), lines
    return lines[0], lines[1]


def test_a_slurm_name_with_a_space_is_refused_as_not_one_word(cli: CLI, tmp_path: Path) -> None:
    inv = unreachable_login(tmp_path, slurm_account="a b")
    error, hint = refusal(cli("render", "-i", str(inv)))
    assert error.endswith("inv.yml: host login: slurm_account 'a b' is not one word, no spaces")
    assert "e.g. ml-team" in hint


def test_a_launcher_in_the_wrong_case_is_refused_not_run_over_ssh(cli: CLI, tmp_path: Path) -> None:
    inv = unreachable_login(tmp_path, launcher="Slurm")
    error, hint = refusal(cli("launch", "-i", str(inv), "--timeout", "5", timeout=60))
    assert error.endswith("inv.yml: host login: launcher 'Slurm' is not ssh or slurm")
    assert "(lower case)" in hint


@pytest.mark.parametrize("limit", ["1-12:00:00", "1-12", "1-12:30", "90", "4:00:00"])
def test_slurm_time_takes_every_form_sbatch_does(cli: CLI, tmp_path: Path, limit: str) -> None:
    shown = cli("render", "-i", str(unreachable_login(tmp_path, slurm_time=limit)))
    assert shown.returncode == 0, shown.stderr
    assert f"#SBATCH --time={limit}\n" in shown.stdout


def test_time_limits_read_as_sbatch_reads_them() -> None:
    assert time_limit_s("90") == 90 * 60  # minutes, where squeue's 9:30 is m:s
    assert time_limit_s("9:30") == 9 * 60 + 30
    assert time_limit_s("4:00:00") == 4 * 3600
    assert time_limit_s("1-12") == 36 * 3600
    assert time_limit_s("1-12:30") == 36 * 3600 + 30 * 60
    assert time_limit_s("1-12:00:05") == 36 * 3600 + 5
    assert time_limit_s("UNLIMITED") is None


def test_watch_refuses_a_renew_window_not_shorter_than_the_time_limit(
    cli: CLI, tmp_path: Path
) -> None:
    # A job of 1 minute renewed 2 minutes before its end would be renewed without end.
    inv = unreachable_login(tmp_path, slurm_time="1", router="login")
    error, hint = refusal(cli("watch", "-i", str(inv), "--renew-before", "2m", timeout=30))
    assert error == (
        "error: --renew-before 120s is not shorter than login's time limit (slurm_time 1: "
        "60s): each successor would be renewed as soon as it serves, without end"
    )
    assert hint == "hint: renew within the limit, e.g. --renew-before 15s"
