"""Preflight's checks (PREFLIGHT_CHECKS in ops/preflight.py), each run on a small plan and a host's
reply built here: nothing is reached. The docs' list of what preflight checks
(docs/guides/launching.md) is the table's."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from deployctl.facts import ProbeOutput
from deployctl.findings import Findings
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops.plan import ONE_MACHINE_HINT, Plan
from deployctl.ops.preflight import PREFLIGHT_CHECKS, HostFacts, judge
from deployctl.patchset import PatchSet, load_patch_sets
from deployctl.project import SHIPPED_DATA
from deployctl.remote.protocol import LiveRun, PreflightReply
from deployctl.render import RenderedCommand

LAUNCHING = Path(__file__).resolve().parent.parent / "docs" / "guides" / "launching.md"

ARGV = ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--port", "30000"]
ONE_GPU = "0, GPU-a, NVIDIA H200, 0, 143771, 0, 30, 9.0, 550\n@@apps\n"


def make_plan(argv: list[str] = ARGV, sets: list[PatchSet] | None = None, **variables: Any) -> Plan:
    host = Host("alpha", {**DEFAULT_VARS, "model_path": "/m", **variables})
    return Plan(host, RenderedCommand("baseline", None, list(argv)), sets or [])


def good_reply(**changes: Any) -> PreflightReply:
    """What a host with nothing in the way answers."""
    reply: dict[str, Any] = {
        "sglang": {"version": "0.5.23", "site": "/site"},
        "records": {},
        "files": {},
        "hunks": {},
        "live_runs": [],
        "module_found": True,
        "port_free": True,
        "port_error": "",
        "busy_ports": {},
        "argv_check": {"method": "declarations", "note": "", "options": 559, "findings": [],
                       "seconds": 0.03},
        "paths": {"/m": True},
        "log_dir_writable": True,
        "log_dir_error": "",
        "next_log": "/logs/baseline_v1.log",
        "next_version": 1,
        "lock": {"acquired": True, "token": "t", "holder": None},
        "launcher_facts": {"sbatch": "/usr/bin/sbatch"},
        "model_mla": None,
        "machine": "m/b",
    }  # fmt: skip
    return cast(PreflightReply, {**reply, **changes})


def facts(gpus: str = ONE_GPU, exit_code: int = 0, **changes: Any) -> HostFacts:
    return HostFacts(good_reply(**changes), ProbeOutput(exit_code, gpus))


def check(name: str) -> Callable[[Plan, HostFacts], Findings]:
    return next(c.run for c in PREFLIGHT_CHECKS if c.name == name)


def live_run(deployment: str | None = None, gpus: list[int] | None = None) -> LiveRun:
    return {"id": "baseline_v1", "pid": 42, "deployment": deployment, "gpus": gpus,
            "port": 30000, "members": [42]}  # fmt: skip


def spec_disable() -> PatchSet:
    return load_patch_sets([SHIPPED_DATA / "patches"])["spec-disable"]


SPEC_FLAG = "--speculative-disable-batch-threshold"
OTHER_LAUNCH = {"op": "launch", "pid": 9, "host": "elsewhere"}
FLAG_FINDINGS = [
    {"level": "error", "flag": "--bogus", "message": "unknown flag --bogus", "candidates": []},
    {"level": "warning", "flag": "--tp", "message": "--tp abbreviates --tp-size", "candidates": []},
]


@dataclass(frozen=True)
class Failing:
    """A check's failing case: its plan and facts, and what it must say."""

    plan: Callable[[], Plan]
    facts: Callable[[], HostFacts]
    problem: str = ""  # the start of its first problem ("": it refuses nothing)
    warning: str = ""  # the start of its first warning
    hint: str | None = None  # its first hint, where it gives one


FAILING: dict[str, Failing] = {
    "lock": Failing(
        make_plan,
        lambda: facts(lock={"acquired": False, "token": None, "holder": OTHER_LAUNCH}),
        "another deployctl launch is in progress on alpha (pid 9 on elsewhere)",
    ),
    "launcher": Failing(
        lambda: make_plan(launcher="slurm", bind_host="0.0.0.0"),
        lambda: facts(launcher_facts={"sbatch": None}),
        "sbatch is not on the PATH of alpha (launcher: slurm)",
        hint="run deployctl against a Slurm login node, or set launcher: ssh",
    ),
    "gpus": Failing(
        make_plan,
        lambda: facts(ONE_GPU + "77, python3, 900 MiB, GPU-a\n"),
        "GPUs are not clean: dirty: PIDs 77 hold GPU memory",
        hint="stop what holds them (deployctl stop -H alpha) or kill those PIDs",
    ),
    "live runs": Failing(
        make_plan,
        lambda: facts(live_runs=[live_run()]),
        "run baseline_v1 (pid 42) is still running on alpha",
        hint="stop it first (deployctl stop -H alpha), or launch with --replace",
    ),
    "ports": Failing(
        make_plan,
        lambda: facts(port_free=False, port_error="Address already in use"),
        "port 30000 is in use on alpha (Address already in use)",
    ),
    "module": Failing(
        make_plan,
        lambda: facts(module_found=False),
        "python3 on alpha cannot find module sglang.launch_server",
        hint="set the host's `python` to the interpreter that has SGLang installed",
    ),
    "patch sets": Failing(
        lambda: make_plan([*ARGV, SPEC_FLAG, "4"], [spec_disable()]),
        lambda: facts(sglang={"version": "0.0.1", "site": "/site"}),
        f"{SPEC_FLAG} needs patch set spec-disable, which is unsupported on alpha "
        "(no variant for SGLang 0.0.1)",
        hint="deployctl patch apply spec-disable -H alpha",
    ),
    "flags": Failing(
        make_plan,
        lambda: facts(argv_check={**good_reply()["argv_check"], "findings": FLAG_FINDINGS}),
        "unknown flag --bogus (SGLang 0.5.23 on alpha)",
        warning="--tp abbreviates --tp-size (SGLang 0.5.23 on alpha)",
    ),
    "paths": Failing(
        make_plan,
        lambda: facts(paths={"/m": False}),
        "/m does not exist on alpha",
    ),
    "log folder": Failing(
        make_plan,
        lambda: facts(log_dir_writable=False, log_dir_error="Permission denied"),
        "log folder ~/deployctl/logs is not writable: Permission denied",
    ),
    "routing": Failing(
        lambda: make_plan([*ARGV, "--disaggregation-mode", "prefill"]),
        lambda: HostFacts(good_reply(), ProbeOutput(0, ONE_GPU), select=lambda pattern: []),
        "alpha is a prefill but names no router",
        hint="a prefill and its decodes meet at a router with pd: true",
    ),
}


def test_every_check_has_a_failing_case_here() -> None:
    assert list(FAILING) == [c.name for c in PREFLIGHT_CHECKS]


@pytest.mark.parametrize("name", list(FAILING))
def test_each_check_says_its_failing_case(name: str) -> None:
    case = FAILING[name]
    plan, found = case.plan(), case.facts()
    assert check(name)(make_plan(), facts()).problems == [], "it refuses a good host"
    said = check(name)(plan, found)
    if case.problem:
        assert said.problems and said.problems[0].startswith(case.problem), said.problems
    if case.warning:
        assert said.warnings and said.warnings[0].startswith(case.warning), said.warnings
    if case.hint is not None:
        assert said.hints[0] == case.hint, said.hints
    # The whole preflight says it too, beside the other checks (which pass).
    assert judge(plan, found).problems == said.problems


def test_a_good_host_passes_every_check() -> None:
    judged = judge(make_plan(), facts())
    assert (judged.problems, judged.warnings, judged.hints) == ([], [], [])
    assert judged.ok and judged.lock_token == "t" and judged.next_log == "/logs/baseline_v1.log"
    assert judged.gpus is not None and judged.gpus.clean
    assert judged.flags is not None and judged.flags.method == "declarations"


def test_problems_are_said_in_the_tables_order_and_hints_once() -> None:
    found = facts(module_found=False, log_dir_writable=False, log_dir_error="full",
                  live_runs=[live_run()], port_free=False, port_error="in use")  # fmt: skip
    judged = judge(make_plan(), found)
    starts = ["run baseline_v1", "port 30000", "python3 on alpha", "log folder"]
    assert [p.split(" ")[0] for p in judged.problems] == [s.split(" ")[0] for s in starts]
    two = judge(make_plan(), facts(live_runs=[live_run(), {**live_run(), "id": "baseline_v2"}]))
    assert len(two.problems) == 2 and len(two.hints) == 1  # two runs in the way: one hint


def test_the_same_launchs_lock_names_the_other_target() -> None:
    holder = {"op": "launch", "pid": 9, "host": "here", "launch": "L1", "target": "beta",
              "machine": "m/b"}  # fmt: skip
    reply = good_reply(lock={"acquired": False, "token": None, "holder": holder})
    said = check("lock")(make_plan(), HostFacts(reply, ProbeOutput(0, ONE_GPU), launch="L1"))
    assert said.problems[0].startswith("alpha and beta are one machine: this launch already")
    assert said.hints == [ONE_MACHINE_HINT]


def test_the_gpu_check_says_why_the_gpus_fall_short() -> None:
    gpus = check("gpus")
    unread = gpus(make_plan(), facts("nvidia-smi: command not found", exit_code=127))
    assert unread.problems == ["GPUs cannot be checked: nvidia-smi: command not found"]
    assert gpus(make_plan(gpus=[3]), facts()).problems == ["GPU 3 not on alpha (it has GPU 0)"]
    assert judge(make_plan(gpus=[3]), facts()).gpus is None
    short = gpus(make_plan([*ARGV, "--tp-size", "2"]), facts())
    assert short.problems == ["tensor parallelism 2 needs 2 GPUs; alpha has 1"]
    # A router needs no GPU, and a replaced run's GPUs are checked after its stop.
    router = make_plan(["python3", "-m", "sglang_router.launch_router"])
    assert gpus(router, facts("", exit_code=127)).problems == []
    dirty = ONE_GPU + "77, python3, 900 MiB, GPU-a\n"
    replacing = HostFacts(good_reply(), ProbeOutput(0, dirty), replacing=True)
    assert gpus(make_plan(), replacing).problems == []


def test_a_replaced_run_is_not_in_its_own_way() -> None:
    replacing = HostFacts(good_reply(live_runs=[live_run()], port_free=False, port_error="x"),
                          ProbeOutput(0, ONE_GPU), replacing=True)  # fmt: skip
    assert judge(make_plan(), replacing).problems == []
    beside = HostFacts(good_reply(live_runs=[live_run()]), ProbeOutput(0, ONE_GPU),
                       beside="baseline_v1")  # fmt: skip
    assert check("live runs")(make_plan(), beside).problems == []


def test_a_flag_whose_patch_set_is_missing_is_said_once() -> None:
    case = FAILING["patch sets"]
    unknown = {"level": "error", "flag": SPEC_FLAG, "message": f"unknown flag {SPEC_FLAG}",
               "candidates": []}  # fmt: skip
    found = facts(sglang={"version": "0.0.1", "site": "/site"},
                  argv_check={**good_reply()["argv_check"], "findings": [unknown]})  # fmt: skip
    judged = judge(case.plan(), found)
    assert len(judged.problems) == 1 and judged.problems[0].startswith(case.problem)


def test_an_ib_device_missing_names_where_the_host_lists_them() -> None:
    path = "/sys/class/infiniband/mlx5_0"
    said = check("paths")(make_plan(), facts(paths={"/m": True, path: False}))
    assert said.problems == ["InfiniBand device mlx5_0 (ib_device) is not on alpha"]
    assert said.hints == ["/sys/class/infiniband on alpha lists the devices it has"]


def test_routing_is_checked_only_with_the_inventory() -> None:
    prefill = make_plan([*ARGV, "--disaggregation-mode", "prefill"])
    assert check("routing")(prefill, facts()).problems == []  # no select: a bare preflight


# ---- the docs -----------------------------------------------------------------------------


def documented_checks() -> list[str]:
    """The docs' list of what preflight checks: its `- \\`name\\`: description` lines."""
    text = LAUNCHING.read_text(encoding="utf-8")
    start = text.index("## What preflight checks")
    found = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("- `"):
            found.append(line)
        elif found:
            break
    return found


def test_the_docs_list_every_check_of_the_table_and_no_other() -> None:
    expected = [f"- `{c.name}`: {c.description}" for c in PREFLIGHT_CHECKS]
    assert documented_checks() == expected, (
        "docs/guides/launching.md's list should be:\n" + "\n".join(expected)
    )


def test_each_check_has_a_name_and_a_one_line_description() -> None:
    names = [c.name for c in PREFLIGHT_CHECKS]
    assert len(set(names)) == len(names)
    for c in PREFLIGHT_CHECKS:
        assert re.fullmatch(r"[a-z][a-z ]*", c.name), c.name
        assert c.description and "\n" not in c.description, c.name
