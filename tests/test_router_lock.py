"""The router lock (`agent.HOLD`): held by a running agent call, refused to a second taker
with the first one named, and gone with its holder — closed, or killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deployctl import agent
from deployctl.connection import Held, LocalConnection
from deployctl.inventory import Host
from deployctl.remote.protocol import HoldArgs, HoldReply
from tests.test_agent import local_host

REPO = Path(__file__).resolve().parent.parent


def hold(host: Host, what: str) -> tuple[HoldReply, Held]:
    args: HoldArgs = {
        "state_dir": host.settings.state_dir,
        "name": "router",
        "holder": {"what": what, "pid": os.getpid()},
    }
    return agent.hold(host, LocalConnection("here", 30), agent.HOLD, args)


def test_a_second_taker_is_refused_naming_the_first_until_it_lets_go(tmp_path: Path) -> None:
    host = local_host(tmp_path)
    first, held = hold(host, "rollout")
    assert first == {"acquired": True, "holder": None}
    second, refused = hold(host, "tune")
    refused.close()
    assert not second["acquired"]
    assert second["holder"] is not None and second["holder"]["what"] == "rollout"
    held.close()
    third, held = hold(host, "tune")
    assert third["acquired"], third
    held.close()


@pytest.mark.heavy
def test_the_lock_dies_with_a_holder_that_is_killed(tmp_path: Path) -> None:
    """SIGKILL: no clean-up runs, and no stale lock is left."""
    host = local_host(tmp_path)
    script = (
        "import sys, time; from tests.test_router_lock import hold; "
        "from tests.test_agent import local_host; from pathlib import Path; "
        "reply, _ = hold(local_host(Path(sys.argv[1])), 'rollout'); "
        "print(reply['acquired'], flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        reply, held = hold(host, "tune")
        held.close()
        assert not reply["acquired"] and reply["holder"] == {
            "what": "rollout", "pid": holder.pid, "since": reply["holder"]["since"]
        }  # fmt: skip
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        reply, held = hold(host, "tune")
        held.close()
        if reply["acquired"]:
            break
        assert time.monotonic() < deadline, "the killed holder's lock outlived it"
        time.sleep(0.1)


@pytest.mark.heavy
def test_one_command_taking_a_routers_lock_twice_holds_it_until_its_last_release(
    tmp_path: Path,
) -> None:
    """tune of two deployments behind one router takes the router's lock once for each (its
    threads share this process's hold), and they end in either order: the lock stays the
    command's until the last one lets go, and neither release raises."""
    from deployctl.ops.router import router_locks

    here = local_host(tmp_path)
    router = Host(here.name, here.vars, "router")
    fleet: Any = SimpleNamespace(connection=lambda host: LocalConnection("here", 30))

    def other_taker() -> bool:
        """Does another deployctl get the lock now? (Let go at once.)"""
        reply, held = hold(router, "rollout")
        held.close()
        return reply["acquired"]

    first, second = router_locks(fleet, [router], "tune"), router_locks(fleet, [router], "tune")
    first.__enter__()
    second.__enter__()  # the command's own: not refused as another holder's
    assert not other_taker()
    first.__exit__(None, None, None)  # the first deployment's tune ends first
    assert not other_taker(), "released while the second deployment still holds it"
    second.__exit__(None, None, None)
    assert other_taker(), "still held after the last release"
    with router_locks(fleet, [router], "tune"):  # taken again afresh by the command
        assert not other_taker()
