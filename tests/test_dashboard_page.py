"""The dashboard's page in a real browser (Debian's chromium, driven by Playwright) over the
sshd lab's stand-in deployments: states after a crash, the crash report, metrics that move
under load, a log tail that follows. A screenshot is kept under tests/artifacts/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser import save_screenshot
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab
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
