"""Hostile values reach the server exactly, run nothing else; secrets never show.

Every value below would run a command if it were pasted into shell text unquoted. Each
command would `touch` a PWNED-* file in the host user's working folder (the home), so a
value that escaped its quoting leaves a trace the test finds.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, TestHost, sh
from tests.test_lifecycle import prepare

HOSTILE = [
    "space in it",
    "single'quote",
    'double"quote',
    "semi;touch PWNED-semi",
    "and&&touch PWNED-and",
    "or||touch PWNED-or",
    "subst$(touch PWNED-subst)",
    "back`touch PWNED-back`tick",
    "new\nline\ntouch PWNED-newline",
    "-leading-dash",
    "--model-path=-evil",
    "pipe|touch PWNED-pipe",
    "redirect>PWNED-redirect",
    "var${IFS}$HOME$(id)",
    "glob*?[ab]",
    "brace{a,b}",
    "#hash touch PWNED-hash",
    "back\\slash\\",
    "{{ 7*7 }}{% raw %}",
    "tab\there",
    "ünïcødé ✓",
    "emoji :rocket: [bold]markup[/bold]",
    "all'\"$(touch PWNED-all)`touch PWNED-all2`;&&|\n-x",
]
# Hostile, and usable as one folder name (no "/").
MODEL_NAME = "-m " + HOSTILE[-1]
DRAFT_NAME = "-draft;touch PWNED-draft $(touch PWNED-draft2)"  # relative: starts with "-"
SET_MODEL_NAME = "set 'model' $(touch PWNED-set) `touch PWNED-set2` ;& -x"


def pwned(host: TestHost) -> list[str]:
    return sorted(str(p) for p in host.home.rglob("PWNED*"))


def recorded_argvs(model: Path) -> list[list[str]]:
    lines = (model / "standin-argv.jsonl").read_text().splitlines()
    return [json.loads(line)["argv"] for line in lines]


def make_dir(host: TestHost, path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "standin.json").write_text(json.dumps({"startup_s": 0.2}))
    sh("chown", "-R", f"{host.user}:{host.user}", host.home)
    return path


def test_hostile_values_reach_the_server_exactly_and_run_nothing(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    base = prepare(alpha, tp=1)
    model = make_dir(alpha, alpha.home / "models" / MODEL_NAME)
    make_dir(alpha, alpha.home / DRAFT_NAME)
    set_model = make_dir(alpha, alpha.home / "models" / SET_MODEL_NAME)
    # The interpreter itself, through a folder whose name is hostile.
    py_dir = alpha.home / "py bin;touch PWNED-py $(touch PWNED-py2)"
    py_dir.mkdir()
    (py_dir / "python3").symlink_to("/usr/bin/python3")
    attention = "$(touch PWNED-ab)`touch PWNED-ab2`"
    extra = [f"--served-model-name={value}" for value in HOSTILE]
    host_vars = {
        **base,
        "python": str(py_dir / "python3"),
        "model_path": str(model),
        "draft_model_path": DRAFT_NAME,
        "attention_backend": attention,
        "extra_args": extra,
        "log_dir": "~/logs dir;touch PWNED-log $(touch PWNED-log2)",
        "state_dir": "~/state 'x' $(touch PWNED-state)",
    }
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    # Inventory values are templates, as in Ansible; `!unsafe` keeps the Jinja-looking one as is.
    text = inv.read_text()
    assert text.count("- --served-model-name={{") == 1
    inv.write_text(text.replace("- --served-model-name={{", "- !unsafe --served-model-name={{"))
    tail = [
        "--speculative-algorithm=EAGLE3",
        f"--speculative-draft-model-path={DRAFT_NAME}",
        "--speculative-num-steps=3",
        "--speculative-eagle-topk=1",
        "--speculative-num-draft-tokens=4",
    ]
    head = ["--tp-size=1", f"--host={alpha.address}", f"--port={base['port']}", "--enable-metrics"]
    expected = [f"--model-path={model}", *head, f"--attention-backend={attention}", *tail, *extra]

    # render shows a line that a shell splits back into exactly these words.
    shown = cli("render", "-i", str(inv))
    assert shown.returncode == 0, shown.stderr
    line = shown.stdout.split("\n", 1)[1]
    assert shlex.split(line) == [str(py_dir / "python3"), "-m", "sglang_standin", *expected]

    launched = cli("launch", "-i", str(inv), "--json", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr + launched.stdout
    entry = json.loads(launched.stdout)["hosts"]["alpha"]
    assert entry["state"] == "ready"
    log_dir = alpha.home / "logs dir;touch PWNED-log $(touch PWNED-log2)"
    assert entry["log"] == str(log_dir / "eagle3_v1.log")
    assert recorded_argvs(model) == [expected]  # the exact words, once: nothing else ran
    state = alpha.home / "state 'x' $(touch PWNED-state)" / "runs"
    assert json.loads((state / "eagle3_v1.json").read_text())["log"] == entry["log"]

    # The other commands work on those paths too.
    status = cli("status", "-i", str(inv), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["hosts"]["alpha"]["ready"] is True
    logs = cli("logs", "-i", str(inv), "-n", "500")
    assert logs.returncode == 0 and "ready to roll" in logs.stdout, logs.stderr
    crash = cli("crash", "-i", str(inv))
    assert crash.returncode == 0 and "no crash found" in crash.stdout, crash.stderr
    assert cli("stop", "-i", str(inv)).returncode == 0

    # The same through --set on the command line.
    overrides = {
        "model_path": str(set_model),
        "attention_backend": HOSTILE[-1],
        "draft_model_path": DRAFT_NAME,
    }
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    relaunched = cli("launch", "-i", str(inv), "--json", "--timeout", "60", *sets)
    assert relaunched.returncode == 0, relaunched.stderr + relaunched.stdout
    assert json.loads(relaunched.stdout)["hosts"]["alpha"]["run"] == "eagle3_v2"
    assert recorded_argvs(set_model) == [
        [f"--model-path={set_model}", *head, f"--attention-backend={HOSTILE[-1]}", *tail, *extra]
    ]
    assert cli("stop", "-i", str(inv)).returncode == 0

    assert pwned(alpha) == []
    tried = len(HOSTILE) + 6 + len(overrides)  # + model, draft, attention, python, log, state
    print(f"hostile values tried: {tried}, all exact")


# ---- secrets -------------------------------------------------------------------------------

SECRET_TEMPLATE = """{% extends "baseline.j2" %}
{% block speculative %}  --api-key={{ api_key }}
  --served-model-name=model-{{ hf_token }}
  --quantization={{ sglang_env.HF_TOKEN }}
{% endblock %}
"""
NESTED_SECRET = "hf_NESTED_TOKEN_987654"
SECRETS: dict[str, Any] = {
    "api_key": "sk-live-APIKEY-0123456789",
    "hf_token": "hf_INVENTORY_TOKEN_abcdef",
    "db_password": "hunter2-PASSWORD-xyz",
    "sglang_env": {"HF_TOKEN": NESTED_SECRET},
}
SET_SECRET = "hf_SET_ON_COMMAND_LINE_42"


def leaks(text: str) -> list[str]:
    values = [SECRETS["api_key"], SECRETS["hf_token"], SECRETS["db_password"], SET_SECRET]
    return [v for v in [*values, NESTED_SECRET] if v in text]


def test_secrets_are_masked_everywhere_deployctl_writes(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars: dict[str, Any] = {**prepare(alpha, tp=1), **SECRETS, "template": "secretive"}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    (cli.cwd / "templates").mkdir()
    (cli.cwd / "templates" / "secretive.j2").write_text(SECRET_TEMPLATE)
    use_set = ("--set", f"hf_token={SET_SECRET}")
    outputs: dict[str, str] = {}

    def run(name: str, *args: str, code: int = 0) -> str:
        result = cli(*args)
        assert result.returncode == code, (name, result.stderr, result.stdout)
        outputs[name] = result.stdout + result.stderr
        return result.stdout

    run("hosts", "hosts", "-i", str(inv))
    described = json.loads(run("hosts --json", "hosts", "-i", str(inv), "--json"))
    shown_vars = described["hosts"]["alpha"]["vars"]
    assert shown_vars["api_key"] == shown_vars["db_password"] == "********"
    assert shown_vars["sglang_env"]["HF_TOKEN"] == "********"
    run("render", "render", "-i", str(inv), *use_set)
    rendered = json.loads(run("render --json", "render", "-i", str(inv), "--json", *use_set))
    assert "--api-key=********" in rendered["hosts"]["alpha"]["command"]
    run("launch --dry-run", "launch", "--dry-run", "-i", str(inv), *use_set)
    run("launch", "launch", "-i", str(inv), "--json", "--timeout", "60", *use_set)
    run("status", "status", "-i", str(inv))
    run("status --json", "status", "-i", str(inv), "--json")
    restarted = json.loads(run("restart", "restart", "-i", str(inv), "--json", "--timeout", "60"))
    assert restarted["hosts"]["alpha"]["run"] == "secretive_v2"
    run("stop", "stop", "-i", str(inv), "--json")

    for name, text in outputs.items():
        assert leaks(text) == [], f"`deployctl {name}` shows a secret: {text}"
    runs = alpha.home / ".deployctl" / "runs"
    records = sorted(runs.glob("*.json"))
    assert [p.name for p in records] == ["secretive_v1.json", "secretive_v2.json"]
    for record in records:
        assert leaks(record.read_text()) == [], record.read_text()
        assert "--api-key=********" in json.loads(record.read_text())["command"]
    # The real command is kept for restart, readable by the host user only.
    for command_file in runs.glob("*.cmd"):
        assert os.stat(command_file).st_mode & 0o777 == 0o600
    # And the server did get the real values, both times.
    argvs = recorded_argvs(Path(host_vars["model_path"]))
    assert len(argvs) == 2
    for argv in argvs:
        assert f"--api-key={SECRETS['api_key']}" in argv
        assert f"--served-model-name=model-{SET_SECRET}" in argv
        assert f"--quantization={NESTED_SECRET}" in argv
