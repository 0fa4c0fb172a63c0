"""The launcher seam is enough for a third launcher: one whose servers are known by a handle
(`unit-N`), not a pid, registered on both sides through `register` alone
(tests/launcher_double.py), launches, reports and stops a deployment of the stand-in server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl.cli import run
from tests.launcher_double import answer_in_process, registered
from tests.test_real_sglang_captures import local_host


@pytest.mark.lab  # launches the stand-in server on this machine: a service
def test_a_launcher_added_through_the_registries_alone_launches_reports_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, env = local_host(tmp_path, {"startup_s": 0.3})
    # Bound off 127.0.0.1, so a server read anywhere but where its placement says it answers
    # is not found.
    inv.write_text(inv.read_text() + "    launcher: unit\n    bind_host: 127.0.0.2\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    answer_in_process(monkeypatch)
    with registered(monkeypatch) as units:

        def document(*argv: str) -> dict[str, object]:
            code = run([*argv, "-i", str(inv), "--json"])
            out = capsys.readouterr().out
            assert code == 0, out
            found: dict[str, object] = json.loads(out)["hosts"]["localhost"]
            return found

        launched = document("launch", "--timeout", "60")
        assert launched["state"] == "ready" and launched["job"]["id"] == "unit-1"  # type: ignore[index]
        assert units.state("unit-1")["state"] == "active"
        status = document("status", "--metrics")
        assert status["alive"] and status["ready"], status
        # The server is read where its placement says it answers (its bind_host here).
        assert status["metrics"] and not status.get("metrics_note"), status
        assert status["job"]["id"] == "unit-1" and status["job"]["state"] == "active"  # type: ignore[index]
        # Its placements in a table of their own, titled by the launcher.
        assert run(["status", "-i", str(inv)]) == 0
        shown = capsys.readouterr().out
        assert "units" in shown and "unit-1" in shown, shown
        stopped = document("stop")
        assert stopped["job"]["state"] == "inactive", stopped  # type: ignore[index]
        assert stopped["shutdown"] == "drained" and stopped["note"] == "", stopped
        assert units.state("unit-1")["state"] == "inactive"
        assert document("status")["alive"] is False
