"""Templated inventory variables: rendered in Jinja2's sandbox and bounded, so an inventory
(inline, group_vars/, `$DEPLOYCTL_INVENTORY`) can neither run code on the control machine nor
exhaust its memory or time; `hostvars` as Ansible has it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from deployctl.inventory_vars import resolve_hosts
from tests import cli_server
from tests.conftest import CLI
from tests.test_inventory_ansible import agree
from tests.timing import side_by_side

# Each escape, were it not sandboxed, creates the file named MARK.
ESCAPES = [
    "{{ cycler.__init__.__globals__.os.system('touch MARK') }}",
    "{{ joiner.__init__.__globals__.os.system('touch MARK') }}",
    "{{ namespace.__init__.__globals__.os.system('touch MARK') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ lookup.__globals__.os.system('touch MARK') }}",
    "{{ hostvars.__class__.__init__.__globals__.os.system('touch MARK') }}",
]


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("where", ["inline", "group_vars", "env"])
@pytest.mark.parametrize("escape", ESCAPES)
def test_an_inventory_template_cannot_run_code(
    tmp_path: Path, cli: CLI, where: str, escape: str
) -> None:
    mark = tmp_path / "MARK"
    value = escape.replace("MARK", str(mark))
    inline = {"x": value} if where != "group_vars" else {}
    inventory = write_json(tmp_path / "inv" / "fleet.yml", {"all": {"hosts": {"h1": inline}}})
    if where == "group_vars":
        write_json(tmp_path / "inv" / "group_vars" / "all.yml", {"x": value})
    args = ["hosts"] if where == "env" else ["hosts", "-i", str(inventory)]
    for command in (args, ["gpus", *args[1:], "-H", "h1"]):
        result = cli(*command, env={"DEPLOYCTL_INVENTORY": str(inventory)})
        assert result.returncode == 1, result.stderr
        lines = result.stderr.splitlines()
        assert lines[0].startswith("error: ") and "host h1: variable x:" in lines[0], lines
        assert "unsafe" in lines[0], lines
        assert not [ln for ln in lines if not ln.startswith(("error: ", "hint: "))], lines
        assert not mark.exists()


def cli_argv(render_seconds: float) -> list[str]:
    """The CLI with another render time limit (RENDER_SECONDS), in a fresh process."""
    main = (
        "import sys; import deployctl.inventory_vars as v; "
        f"v.RENDER_SECONDS = {render_seconds!r}; "
        "sys.argv = ['deployctl', *sys.argv[1:]]; from deployctl.cli import main; main()"
    )
    return [sys.executable, "-c", main]


def run_measured(
    cli: CLI, tmp_path: Path, *args: str, render_seconds: float | None = None
) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run the CLI; return its result, its wall time and its peak memory in MiB. With the
    usual time limit it is forked from the CLI server (tests/cli_server.py), which gives its
    own peak (from the server's memory up: no less than a fresh process's); another limit
    needs a fresh process."""
    started = time.monotonic()
    if render_seconds is None:
        argv = [sys.executable, "-m", "deployctl", *args]
        forked = cli_server.run(argv, cwd=str(cli.cwd), env=cli.env(), timeout=60)
        return forked, time.monotonic() - started, forked.peak_kib // 1024
    ran = Path(tempfile.mkdtemp(dir=tmp_path))  # a run's own files: runs may go side by side
    out, err = ran / "stdout", ran / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [*cli_argv(render_seconds), *args],
            cwd=cli.cwd, env=cli.env(), stdout=stdout, stderr=stderr,
        )  # fmt: skip
    while True:  # wait4, not wait: it gives the child's own peak memory
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > 60:
            proc.kill()
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())
    return done, time.monotonic() - started, usage.ru_maxrss // 1024


def beside_a_plain_run(
    cli: CLI, tmp_path: Path, *args: str, render_seconds: float | None = None
) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run the CLI beside `hosts` on an inventory of one plain host; return its result, the
    wall time it took beyond the plain run's (a loaded machine stretches both alike) and its
    peak memory in MiB."""
    plain = write_json(
        Path(tempfile.mkdtemp(dir=tmp_path)) / "plain.yml", {"all": {"hosts": {"h": {}}}}
    )
    (measured, _), (usual, _) = side_by_side(
        lambda: run_measured(cli, tmp_path, *args, render_seconds=render_seconds),
        lambda: run_measured(
            cli, tmp_path, "hosts", "-i", str(plain), render_seconds=render_seconds
        ),
    )
    assert usual[0].returncode == 0, usual[0].stderr
    return measured[0], measured[1] - usual[1], measured[2]


HUGE = [
    "{{ range(10 ** 9) | list }}",
    "{{ 'x' * 500000000 }}",
    "{{ [0] * 100000000 }}",
    "{{ ('x' * 900000) ~ ('y' * 900000) }}",
    "{{ 'x' * 900000 + 'y' * 900000 }}",
    "{% set ns = namespace(s='xy') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s | length }}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
    "{% endfor %}{{ ns.l | length }}",
    "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
    "{{ ('x' * 100000) | replace('x', 'y' * 100000) }}",
    "{{ ('x' * 100000).replace('x', 'y' * 100000) }}",
    "{{ ('x' * 100000) | regex_replace('x', 'y' * 100000) }}",
    "{{ 'x'.ljust(10 ** 9) }}",
    "{{ 'x' | center(10 ** 9) }}",
    "{{ 'x' | indent(10 ** 9, true) }}",
    "{{ [1] | batch(10 ** 9, 0) | list }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '%0999999999d' | format(1) }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ 10 ** 100000000 }}",
    "{{ range(100000) | join('x' * 100000) }}",
]
# Nothing grows, so only the time limit stops it (tested below with a shorter limit).
ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("template", HUGE)
@pytest.mark.heavy
def test_a_huge_value_fails_fast_naming_host_and_variable(
    tmp_path: Path, cli: CLI, template: str
) -> None:
    inventory = write_json(
        tmp_path / "fleet.yml", {"all": {"hosts": {"h1": {"big": template}, "h2": {}}}}
    )
    args = ("hosts", "-i", str(inventory), "-H", "h1")
    result, extra, mib = beside_a_plain_run(cli, tmp_path, *args)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: host h1: variable big:"), lines
    assert "internal error" not in result.stderr and len(lines) <= 2, lines
    assert extra < 18 and mib < 400, (
        f"took {extra:.2f}s more than a plain inventory and {mib} MiB, bounds 18s and 400 MiB"
    )
    assert cli("hosts", "-i", str(inventory), "-H", "h2").returncode == 0  # only h1 is broken


@pytest.mark.heavy
def test_an_endless_loop_stops_at_the_time_limit_naming_host_and_variable(
    tmp_path: Path, cli: CLI
) -> None:
    # The limit is RENDER_SECONDS (5 s); the same CLI with 0.5 s shows the same stop without
    # waiting 5 s twice (every host is resolved, so `-H h2` renders h1's loop too).
    inventory = write_json(
        tmp_path / "fleet.yml", {"all": {"hosts": {"h1": {"big": ENDLESS}, "h2": {}}}}
    )
    args = ("hosts", "-i", str(inventory))
    result, extra, mib = beside_a_plain_run(cli, tmp_path, *args, "-H", "h1", render_seconds=0.5)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        "error: host h1: variable big: takes longer than 0.5s to render",
        "hint: an inventory template must not loop for long",
    ]
    assert extra < 8 and mib < 400, (
        f"took {extra:.2f}s more than a plain inventory and {mib} MiB, bounds 8s and 400 MiB"
    )
    h2, _, _ = run_measured(cli, tmp_path, *args, "-H", "h2", render_seconds=0.5)
    assert h2.returncode == 0, h2.stderr  # only h1 is broken


@pytest.mark.heavy
def test_values_under_the_caps_render(tmp_path: Path, cli: CLI) -> None:
    variables = {
        "text": "{{ 'x' * 1000000 }}",
        "items": "{{ range(100000) | list }}",
        "joined": "{{ range(1000) | join(',') }}",
        "padded": "{{ '%05d' % 42 }}",
        "power": "{{ 2 ** 64 }}",
    }
    inventory = write_json(tmp_path / "fleet.yml", {"all": {"hosts": {"h1": variables}}})
    result = cli("hosts", "--json", "-i", str(inventory))
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)["hosts"]["h1"]["vars"]
    assert len(shown["text"]) == 1000000 and shown["items"][-1] == 99999
    assert shown["joined"].startswith("0,1,2") and shown["padded"] == "00042"
    assert shown["power"] == 2**64


def test_hostvars_of_another_host_hold_its_magic_variables(tmp_path: Path, cli: CLI) -> None:
    files = {
        "inv.ini": "[g]\nh1\nh2.example.com\n[g:vars]\n"
        "peer=\"{{ hostvars['h2.example.com'].inventory_hostname }}\"\n"
        "peer_short=\"{{ hostvars['h2.example.com']['inventory_hostname_short'] }}\"\n"
        "peer_groups=\"{{ hostvars['h1'].group_names }}\"\n"
    }
    agree(cli, tmp_path, files, ["inv.ini"], ("peer", "peer_short", "peer_groups"))


@pytest.mark.parametrize("item", ["0", "True", "'x'"])
def test_a_list_counts_each_short_item_as_text_does(item: str) -> None:
    # A list's size is its items and each item's own characters (a digit or a letter at
    # least): 600,000 one-character items are 1.2 million, past the bound, whatever their kind.
    # (A zero counted as no characters made a list of zeros twice as long as one of letters
    # before it was refused, walked whole at every check of a doubling loop.)
    template = "{{ [" + item + "] * 600000 }}"
    resolved, broken = resolve_hosts({"h1": {"big": template}}, lambda host: {})
    assert "h1" in broken, resolved["h1"]["big"][:3]
    assert "longer than 1048576 characters or items" in str(broken["h1"])
