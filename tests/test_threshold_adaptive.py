"""`threshold_mode: adaptive`: --threshold N through stock SGLang's adaptive speculation
(`--speculative-adaptive --speculative-adaptive-config F`), no patch needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl.errors import TemplateError
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.patchset import load_patch_sets, sets_for_flags
from deployctl.project import SHIPPED_DATA
from deployctl.render import THRESHOLD_FLAG, TemplateSet
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab
from tests.test_argv_check import host_with_sglang
from tests.test_hostile_values import recorded_argvs
from tests.test_lifecycle import prepare

TEMPLATES = TemplateSet([SHIPPED_DATA / "templates"])


def host(**variables: object) -> Host:
    return Host(
        "h1",
        {
            **DEFAULT_VARS,
            "model_path": "/m",
            "draft_model_path": "/d",
            "threshold_mode": "adaptive",
            **variables,
        },
    )


def test_adaptive_threshold_renders_stock_flags_and_its_config() -> None:
    rendered = TEMPLATES.render(host(), "eagle3", threshold=5)
    path = ".deployctl/runs/adaptive-t5-s3.json"  # ~/ made relative: the server runs from ~
    assert rendered.argv[-2:] == ["--speculative-adaptive", f"--speculative-adaptive-config={path}"]
    assert not any(a.startswith(THRESHOLD_FLAG) for a in rendered.argv)
    # Three steps while the batch is 1..5, none from 6 on: one candidate per slot.
    assert json.loads(rendered.files[path]) == {
        "1": {"candidate_steps": [3]},
        "6": {"candidate_steps": [0]},
    }
    assert rendered.threshold_mode == "adaptive"
    assert sets_for_flags(rendered.argv, load_patch_sets([SHIPPED_DATA / "patches"])) == []


def test_patch_mode_is_the_default() -> None:
    unset = {k: v for k, v in host().vars.items() if k != "threshold_mode"}
    rendered = TEMPLATES.render(Host("h1", unset), "eagle3", threshold=5)
    assert rendered.argv[-1] == f"{THRESHOLD_FLAG}=5" and rendered.files == {}
    assert rendered.threshold_mode == "patch"


def test_absolute_state_dir_keeps_an_absolute_config_path() -> None:
    rendered = TEMPLATES.render(host(state_dir="/var/lib/deployctl/"), "eagle3", threshold=8)
    assert "/var/lib/deployctl/runs/adaptive-t8-s3.json" in rendered.files


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"threshold_mode": "magic"}, "threshold_mode 'magic' is not patch or adaptive"),
        ({"speculative_eagle_topk": 4}, "needs --speculative-eagle-topk 1"),
    ],
)
def test_adaptive_refuses_what_sglang_would(variables: dict[str, object], message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        TEMPLATES.render(host(**variables), "eagle3", threshold=5)


def test_adaptive_needs_draft_steps_in_the_command() -> None:
    with pytest.raises(TemplateError, match="needs --speculative-num-steps"):
        TEMPLATES.render(host(), "baseline", threshold=5)


def test_launch_writes_the_config_and_the_server_starts_without_a_patch(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    host_vars["threshold_mode"] = "adaptive"
    inv = str(hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars}))
    shown = cli("render", "--threshold", "5", "-i", inv)
    assert "# --threshold 5: stock SGLang's adaptive speculation, no patch" in shown.stdout
    launched = cli("launch", "--threshold", "5", "-i", inv, "--json", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr + launched.stdout
    assert json.loads(launched.stdout)["hosts"]["alpha"]["state"] == "ready"
    config = alpha.home / ".deployctl" / "runs" / "adaptive-t5-s3.json"
    assert json.loads(config.read_text()) == {
        "1": {"candidate_steps": [3]},
        "6": {"candidate_steps": [0]},
    }
    [argv] = recorded_argvs(Path(str(host_vars["model_path"])))
    assert argv[-2:] == [
        "--speculative-adaptive",
        "--speculative-adaptive-config=.deployctl/runs/adaptive-t5-s3.json",
    ]
    assert cli("stop", "-i", inv).returncode == 0


def test_host_sglang_accepts_the_adaptive_flags_unpatched(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inv = host_with_sglang(hosts, sglang_template, tmp_path, threshold_mode="adaptive")
    checked = cli("render", "--check", "--threshold", "5", "-i", inv, "--json")
    assert checked.returncode == 0, checked.stderr
    entry = json.loads(checked.stdout)["hosts"]["alpha"]
    assert entry["flags"]["method"] == "declarations" and entry["flags"]["problems"] == []
    assert entry["threshold_mode"] == "adaptive"


def test_sglangs_own_adaptive_params_switch_at_the_threshold() -> None:
    """SGLang 0.5.23's AdaptiveSpeculativeParams, driven on the device machine
    (scripts/check-adaptive-threshold) with the configs deployctl renders: 10,000 verify
    results around N never switched the steps, and batches got S steps up to N, 0 above —
    with CUDA graphs, after SGLang pads the batch to the next graph size."""
    captured = json.loads(
        (Path(__file__).parent / "data" / "sglang" / "adaptive-threshold-0.5.23.json").read_text()
    )
    assert captured["failures"] == []
    for result in captured["results"]:
        threshold, steps = result["threshold"], result["steps"]
        rendered = TEMPLATES.render(host(speculative_num_steps=steps), "eagle3", threshold)
        [text] = rendered.files.values()
        assert json.loads(text) == result["config"]  # the capture is of today's config
        assert result["switches"] == 0
        by_batch = {int(b): s for b, s in result["steps_by_batch"].items()}
        if result["cuda_graph_bs"] is None:
            assert by_batch == {b: steps if b <= threshold else 0 for b in by_batch}
        else:
            assert by_batch[threshold + 1] == 0 and by_batch[1] == steps
