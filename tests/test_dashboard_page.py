"""The dashboard's page in a real browser (Debian's chromium, driven by Playwright) over the
sshd lab's stand-in deployments: states after a crash, the crash report, metrics that move
under load, a log tail that follows. A screenshot is kept under tests/artifacts/."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser import save_screenshot
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, sh
from tests.test_canary_lab import canary_fleet
from tests.test_dashboard import dashboard
from tests.test_lifecycle import launch_json, prepare
from tests.test_rollout import Load

pytestmark = pytest.mark.browser


def two_servers(lab: SSHLab, tmp_path: Path) -> Path:
    """alpha serving steadily; bravo's server crashes 4 s after it is ready."""
    host_vars = {
        "alpha": {**prepare(lab.hosts["alpha"], tp=1), "template": "baseline"},
        "bravo": {
            **prepare(lab.hosts["bravo"], tp=1, crash="after_ready", crash_after_s=4.0),
            "template": "baseline",
        },
    }
    return lab.inventory(tmp_path / "inv.yml", ["alpha", "bravo"], host_vars)


def cell(page: Any, target: str, column: int) -> str:
    """The text of a row's cell (1-based column) in the deployments table."""
    text: str = page.locator(f'tr[data-target="{target}"] td:nth-child({column})').inner_text()
    return text.strip()


STATE, RUNNING, TOKS = 5, 9, 11


def test_the_page_shows_states_a_crash_report_moving_metrics_and_a_following_log(
    hosts: SSHLab, cli: CLI, tmp_path: Path, page: Any
) -> None:
    inv = two_servers(hosts, tmp_path)
    code, doc, err = launch_json(cli, inv)
    assert code == 0, err
    alpha = hosts.hosts["alpha"]
    port = int(doc["hosts"]["alpha"]["command"].split("--port=")[1].split()[0])
    with dashboard(cli, inv) as served:
        page.goto(served.base + "/")
        page.wait_for_selector('tr[data-target="alpha"] .badge.ready', timeout=30_000)
        # bravo crashes a few seconds after it was ready: its state word and its report.
        page.wait_for_selector('tr[data-target="bravo"] .badge.crashed', timeout=60_000)
        assert cell(page, "alpha", STATE) == "ready" and cell(page, "bravo", STATE) == "crashed"
        note = page.locator('tr[data-note-for="bravo"]').inner_text()
        assert "Tensor shape mismatch" in note
        page.locator('tr[data-target="bravo"]').click()
        crash = page.locator("#detail-crash .crash").first.inner_text()
        assert "Tensor shape mismatch" in crash and "hint:" in crash
        # Under load, alpha's running requests and tok/s move off zero.
        page.locator('tr[data-target="alpha"]').click()
        with Load(alpha.address, port, streams=4, max_tokens=400):
            page.wait_for_function(
                """() => {
                    const row = document.querySelector('tr[data-target="alpha"]');
                    const cells = row && row.querySelectorAll('td');
                    return cells && Number(cells[8].textContent) > 0 && Number(cells[10].textContent) > 0;
                }""",
                timeout=30_000,
            )
            save_screenshot(page, "dashboard")
        # The log tail follows: a line written to the run's log shows up in the detail view.
        marker = "dashboard-follows-this-line"
        log = Path(doc["hosts"]["alpha"]["log"])
        alpha.as_user(f"echo {marker} >> {log}")
        page.wait_for_function(
            f"() => document.querySelector('#detail-log').textContent.includes('{marker}')",
            timeout=30_000,
        )
        assert page.locator("#detail-title").inner_text() == "alpha"
        assert "live" in page.locator("#connection").inner_text()


def canary_record(state: str, decision: str | None, ratio: float) -> dict[str, Any]:
    """A kept canary of alpha/router as `canary` writes it (r1 tried against r2)."""
    return {
        "canary": 1, "router": "alpha/router", "state": state, "started_at": time.time() - 40,
        "updated_at": time.time(), "candidates": ["alpha/r1"], "controls": ["alpha/r2"],
        "metric": "itl", "max_regression": 0.05, "confidence": 0.95,
        "verdict": "undecided" if decision is None else "regression",
        "estimate": 1.02, "low": 0.97, "high": 1.08, "samples": 24,
        "buckets": [
            {"bucket": 8, "control_n": 7, "candidate_n": 6, "control": 0.0121,
             "candidate": 0.0122, "ratio": 1.008},
            {"bucket": 16, "control_n": 6, "candidate_n": 5, "control": 0.0142,
             "candidate": 0.0142 * ratio, "ratio": ratio},
        ],
        "reason": "" if decision is None else "itl regressed", "decision": decision,
        "elapsed_s": 30.0, "interrupted": False, "steps": [],
    }  # fmt: skip


def test_the_detail_view_shows_a_running_canarys_buckets_and_then_its_decision(
    hosts: SSHLab, cli: CLI, tmp_path: Path, page: Any
) -> None:
    inv, _ = canary_fleet(hosts, tmp_path, {})
    code, _, err = launch_json(cli, inv)
    assert code == 0, err
    alpha = hosts.hosts["alpha"]
    kept = alpha.home / ".deployctl" / "canaries" / "1.json"
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(canary_record("running", None, 1.031)))
    sh("chown", "-R", f"{alpha.user}:", kept.parent)
    with dashboard(cli, inv) as served:
        page.goto(served.base + "/")
        page.wait_for_selector('tr[data-target="alpha/router"] .badge.ready', timeout=30_000)
        page.locator('tr[data-target="alpha/r1"]').click()  # the candidate's own view
        page.wait_for_selector("#detail-canary .canary-buckets tbody tr", timeout=30_000)
        box = page.locator("#detail-canary").inner_text()
        assert "canary 1: alpha/r1 against alpha/r2 (itl)" in box, box
        assert "running · 24 matched samples" in box and "[0.970, 1.080]" in box, box
        rows = page.locator("#detail-canary tbody tr").all_inner_texts()
        assert [r.split()[0] for r in rows] == ["8", "16"] and "6/5" in rows[1], rows
        # The record moves on: the next rounds show its buckets and then its decision.
        kept.write_text(json.dumps(canary_record("done", "rolled back", 1.094)))
        page.wait_for_function(
            "() => document.querySelector('#detail-canary').textContent.includes('rolled back')",
            timeout=30_000,
        )
        assert page.locator("#detail-canary tr.worse").all_inner_texts()[0].startswith("16")
        page.locator('tr[data-target="alpha/router"]').click()  # the router's view: the same
        assert "canary 1" in page.locator("#detail-canary").inner_text()
        save_screenshot(page, "dashboard-canary")
    cli("stop", "-i", str(inv))
