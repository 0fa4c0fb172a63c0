"""Probe parsers on real nvidia-smi captures from an H200, and the probe script round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.connection import Connection
from deployctl.errors import ParseError
from deployctl.facts import (
    Gpu,
    GpuProcess,
    GpuState,
    ProbeOutput,
    parse_gpu_processes,
    parse_gpus,
    parse_gpus_command,
    parse_probe_output,
    probe_script,
    run_probes,
)
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops.gpus import (
    DEFAULT_MAX_USED_MIB,
    GpuReport,
    check_gpus,
    find_holders,
    gpu_report,
)
from deployctl.present.documents import gpus_json
from deployctl.remote.wire import GPUS_COMMAND, REPLY_MARK

CAPTURES = Path(__file__).resolve().parent / "data" / "nvidia-smi" / "h200-1gpu"
UUID_A = "GPU-0f384172-4faf-f5c3-14fd-9c3861703c69"  # the machine of idle/busy captures
UUID_B = "GPU-b9ac1398-b3b7-7428-6100-5c367f7b6c36"  # the machine of idle2/busy3 captures
H200_TOTAL_MIB = 143771


def capture(name: str) -> str:
    return (CAPTURES / name).read_text(encoding="utf-8")


def h200(index: int = 0, used: int = 0, uuid: str = UUID_A) -> Gpu:
    return Gpu(index, uuid, "NVIDIA H200", used, H200_TOTAL_MIB, 0, "9.0")


# --- GPUs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("idle-query-gpu.csv", [h200(used=0)]),
        ("busy-query-gpu.csv", [h200(used=8811)]),
        ("idle2-query-gpu-noheader-nounits.csv", [h200(used=0, uuid=UUID_B)]),
    ],
)
def test_parse_gpus_on_real_captures(name: str, expected: list[Gpu]) -> None:
    assert parse_gpus(capture(name)) == expected


def test_gpu_json_leaves_out_compute_capability() -> None:
    (gpu,) = parse_gpus(capture("busy-query-gpu.csv"))
    assert gpu.to_json() == {
        "index": 0,
        "uuid": UUID_A,
        "name": "NVIDIA H200",
        "memory_used_mib": 8811,
        "memory_total_mib": H200_TOTAL_MIB,
        "utilization_pct": 0,
    }


def test_parse_gpus_reads_several_gpus_in_order() -> None:
    header, line = capture("idle-query-gpu.csv").splitlines()
    lines = [line.replace("0, GPU-", f"{i}, GPU-", 1) for i in range(8)]
    gpus = parse_gpus("\n".join([header, *lines]) + "\n")
    assert [g.index for g in gpus] == list(range(8))
    assert {g.memory_total_mib for g in gpus} == {H200_TOTAL_MIB}


def test_parse_gpus_on_empty_output_is_no_gpu() -> None:
    assert parse_gpus("") == []
    assert parse_gpus(capture("idle-query-gpu.csv").splitlines()[0]) == []


def test_utilization_not_available_is_none() -> None:
    line = capture("idle2-query-gpu-noheader-nounits.csv").replace(", 0, 36,", ", [N/A], 36,")
    (gpu,) = parse_gpus(line)
    assert gpu.utilization_pct is None
    assert gpu.memory_used_mib == 0


def test_parse_gpus_needs_only_the_six_leading_fields() -> None:
    # A query without temperature, compute capability and driver (an older deployctl's).
    line = capture("idle2-query-gpu-noheader-nounits.csv").split(", 36,")[0]
    assert line.count(",") == 5
    assert parse_gpus(line) == [Gpu(0, UUID_B, "NVIDIA H200", 0, H200_TOTAL_MIB, 0, None)]


@pytest.mark.parametrize(
    ("fields", "compute_cap"),
    [(7, None), (8, "9.0"), (9, "9.0"), (10, "9.0")],
)
def test_compute_capability_is_the_eighth_field_when_present(
    fields: int, compute_cap: str | None
) -> None:
    # The noheader capture has ten fields (its last one a PCI bus id); cut it to `fields`.
    line = ", ".join(capture("idle2-query-gpu-noheader-nounits.csv").strip().split(", ")[:fields])
    (gpu,) = parse_gpus(line)
    assert gpu.compute_cap == compute_cap
    assert gpu.memory_total_mib == H200_TOTAL_MIB


@pytest.mark.parametrize(
    "text",
    [
        # The busy3 "query-gpu" capture actually holds a compute-apps line (mis-split).
        capture("busy3-query-gpu-noheader-nounits.csv"),
        capture("bogus-field.txt"),
        capture("busy.txt"),
        "0, GPU-x, NVIDIA H200, [N/A], 143771 MiB, 0 %\n",
        "0, GPU-x, NVIDIA H200, 0 MiB\n",
        "x, GPU-x, NVIDIA H200, 0 MiB, 143771 MiB, 0 %\n",
    ],
    ids=["process-line", "bogus-field", "table", "no-memory", "short", "bad-index"],
)
def test_parse_gpus_rejects_garbage(text: str) -> None:
    with pytest.raises(ParseError, match=r"nvidia-smi GPU line"):
        parse_gpus(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "0, GPU-x, NVIDIA H200, 0 MiB\n",
            "unexpected nvidia-smi GPU line: 0,GPU-x,NVIDIA H200,0 MiB",
        ),
        (
            "0, GPU-x, NVIDIA H200, [N/A], 143771 MiB, 0 %\n",
            "no memory figures in nvidia-smi GPU line: 0,GPU-x,NVIDIA H200,[N/A],143771 MiB,0 %",
        ),
    ],
)
def test_a_rejected_gpu_line_is_quoted_in_the_error(text: str, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_gpus(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("line", "prefix"),
    [
        ("x, " + "y" * 500 + ", z, 1, 2, 3", "unexpected nvidia-smi GPU line: "),
        ("0, " + "y" * 500 + ", z, [N/A], 2, 3", "no memory figures in nvidia-smi GPU line: "),
    ],
)
def test_a_rejected_gpu_line_is_quoted_up_to_200_characters(line: str, prefix: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_gpus(line)
    assert str(info.value) == prefix + line.replace(", ", ",")[:200]


# --- GPU processes ---------------------------------------------------------------------------

ONE_PROCESS = [GpuProcess(419, "python3", 8802, UUID_A)]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("idle-query-compute-apps.csv", []),
        ("busy-query-compute-apps.csv", ONE_PROCESS),
        ("busy-query-compute-apps-noheader-nounits.csv", ONE_PROCESS),
        # Mis-split capture: this file holds busy3's noheader compute-apps line.
        (
            "busy3-query-gpu-noheader-nounits.csv",
            [GpuProcess(418, "python3", 1634, UUID_B)],
        ),
    ],
)
def test_parse_gpu_processes_on_real_captures(name: str, expected: list[GpuProcess]) -> None:
    assert parse_gpu_processes(capture(name)) == expected


def test_parse_gpu_processes_reads_the_first_line_of_the_mis_split_busy3_capture() -> None:
    # Only the first line of busy3-query-compute-apps.csv is nvidia-smi output; ps follows.
    first = capture("busy3-query-compute-apps.csv").splitlines()[0]
    assert parse_gpu_processes(first) == [GpuProcess(418, "python3", 1634, UUID_B)]


def test_process_json_shape() -> None:
    (process,) = parse_gpu_processes(capture("busy-query-compute-apps.csv"))
    assert process.to_json() == {
        "pid": 419,
        "name": "python3",
        "used_memory_mib": 8802,
        "gpu_uuid": UUID_A,
    }


def test_process_memory_not_available_is_none() -> None:
    line = f"419, python3, [N/A], {UUID_A}\n"
    assert parse_gpu_processes(line) == [GpuProcess(419, "python3", None, UUID_A)]


@pytest.mark.parametrize(
    "text",
    [
        # The mis-split busy3 captures: a shell transcript and ps output, not csv rows.
        capture("busy3-query-compute-apps-noheader-nounits.csv"),
        capture("busy3-query-compute-apps.csv"),
        capture("busy-pmon.txt"),
        capture("busy-query-gpu.csv"),
        "419, python3\n",
    ],
    ids=["busy3-transcript", "busy3-with-ps", "pmon", "gpu-query", "short"],
)
def test_parse_gpu_processes_rejects_garbage(text: str) -> None:
    with pytest.raises(ParseError, match=r"nvidia-smi process line"):
        parse_gpu_processes(text)


def test_a_rejected_process_line_is_quoted_up_to_200_characters() -> None:
    with pytest.raises(ParseError) as info:
        parse_gpu_processes("419, python3\n")
    assert str(info.value) == "unexpected nvidia-smi process line: 419,python3"
    long_line = "x, " + "/opt/venv/" * 50 + ", 8802 MiB, " + UUID_A
    with pytest.raises(ParseError) as info:
        parse_gpu_processes(long_line)
    assert (
        str(info.value)
        == "unexpected nvidia-smi process line: " + (long_line.replace(", ", ",")[:200])
    )


# --- the combined GPU command ----------------------------------------------------------------


def combined(gpu_file: str, apps_file: str) -> str:
    return capture(gpu_file) + "@@apps\n" + capture(apps_file)


def test_parse_gpus_command_idle() -> None:
    state = parse_gpus_command(0, combined("idle-query-gpu.csv", "idle-query-compute-apps.csv"))
    assert state.gpus == [h200(used=0)]
    assert state.processes == []


def test_parse_gpus_command_busy() -> None:
    state = parse_gpus_command(0, combined("busy-query-gpu.csv", "busy-query-compute-apps.csv"))
    assert state.gpus == [h200(used=8811)]
    assert state.processes == ONE_PROCESS


def test_gpus_command_runs_both_queries_and_separates_them() -> None:
    assert "--query-gpu=" in GPUS_COMMAND
    assert "--query-compute-apps=" in GPUS_COMMAND
    assert "echo @@apps" in GPUS_COMMAND


@pytest.mark.parametrize(
    ("exit_code", "output", "message"),
    [
        (127, "nvidia-smi: command not found\n", "nvidia-smi: command not found"),
        (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n\n",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
        ),
        (2, capture("bogus-field.txt"), 'Field "bogus" is not a valid field to query. rc=2'),
        (9, "", "nvidia-smi exited 9"),
        (1, "  \n\n", "nvidia-smi exited 1"),
    ],
)
def test_parse_gpus_command_failure_carries_nvidia_smis_message(
    exit_code: int, output: str, message: str
) -> None:
    with pytest.raises(ParseError) as info:
        parse_gpus_command(exit_code, output)
    assert str(info.value) == message


def test_parse_gpus_command_failure_message_is_bounded() -> None:
    with pytest.raises(ParseError) as info:
        parse_gpus_command(1, "x" * 5000)
    assert len(str(info.value)) == 300


def test_parse_gpus_command_without_separator_is_incomplete() -> None:
    with pytest.raises(ParseError) as info:
        parse_gpus_command(0, capture("idle-query-gpu.csv"))
    assert str(info.value) == "nvidia-smi output is incomplete"


def test_parse_gpus_command_listing_no_gpu_cannot_be_judged() -> None:
    # Never "clean (0 GPUs)": only the headers came back.
    header = capture("idle-query-gpu.csv").splitlines()[0]
    with pytest.raises(ParseError) as info:
        parse_gpus_command(0, header + "\n@@apps\n" + capture("idle-query-compute-apps.csv"))
    assert str(info.value) == "nvidia-smi listed no GPU"


def test_a_process_path_holding_the_separator_is_still_a_process() -> None:
    apps = capture("busy-query-compute-apps.csv").replace("python3", "/srv/@@apps/python3")
    state = parse_gpus_command(0, capture("busy-query-gpu.csv") + "@@apps\n" + apps)
    assert state.gpus == [h200(used=8811)]
    assert state.processes == [GpuProcess(419, "/srv/@@apps/python3", 8802, UUID_A)]


# --- probe scripts ---------------------------------------------------------------------------


def run_script(script: str) -> str:
    result = subprocess.run(
        ["/bin/sh", "-c", script], capture_output=True, text=True, timeout=10, check=False
    )
    assert result.stderr == "", result.stderr
    return result.stdout


def test_probe_script_round_trip_through_a_real_shell() -> None:
    probes = {
        "version": "echo 0.5.23",
        "blank-lines": "echo first; echo; echo; echo last",
        "fails": "echo partial; echo oops >&2; exit 3",
        "silent": "true",
        "no-final-newline": "printf 'no newline'",
        "stderr-only": "echo warning >&2",
        "quote's name": "echo quoted",
        "subshell-exit": "exit 0; echo never",
    }
    outputs = parse_probe_output(run_script(probe_script(probes)))
    assert outputs == {
        "version": ProbeOutput(0, "0.5.23"),
        "blank-lines": ProbeOutput(0, "first\n\n\nlast"),
        "fails": ProbeOutput(3, "partial", "oops"),  # stderr kept apart from the data
        "silent": ProbeOutput(0, ""),
        "no-final-newline": ProbeOutput(0, "no newline"),
        "stderr-only": ProbeOutput(0, "", "warning"),
        "quote's name": ProbeOutput(0, "quoted"),
        "subshell-exit": ProbeOutput(0, ""),
    }
    assert list(outputs) == list(probes)


def test_what_the_login_prints_around_the_probes_is_ignored() -> None:
    script = probe_script({"a": "echo data; echo warn >&2", "b": "echo more"})
    noisy = f'echo "Welcome!"; echo "{{\\"motd\\": 1}}"; {script}; echo "bye"'
    assert parse_probe_output(run_script(noisy)) == {
        "a": ProbeOutput(0, "data", "warn"),
        "b": ProbeOutput(0, "more"),
    }


def test_a_failing_probe_does_not_stop_the_next_one() -> None:
    outputs = parse_probe_output(run_script(probe_script({"a": "exit 3", "b": "echo still"})))
    assert outputs["a"].exit_code == 3
    assert outputs["b"] == ProbeOutput(0, "still")


def test_probe_on_a_captured_file_keeps_its_content() -> None:
    path = CAPTURES / "busy-query-compute-apps.csv"
    (out,) = parse_probe_output(run_script(probe_script({"apps": f"cat '{path}'"}))).values()
    assert out.exit_code == 0
    assert parse_gpu_processes(out.output) == ONE_PROCESS


def test_parse_probe_output_ignores_a_probe_that_never_reported() -> None:
    text = "@@deployctl-probe@@ a\nhalf\n"
    assert parse_probe_output(text) == {}
    assert parse_probe_output("noise before\n" + text) == {}


def test_parse_probe_output_drops_a_frame_without_its_exit_code() -> None:
    # The name and end marks but no rc mark: no exit code, so no result to trust.
    text = "@@deployctl-probe@@ a\nhalf\n@@deployctl-probe@@ end\n"
    assert parse_probe_output(text) == {}


def test_parse_probe_output_drops_a_frame_without_its_name() -> None:
    # Output cut at the front: an exit code and an end with no probe named before them.
    text = "data\n@@deployctl-probe@@ rc=0\n@@deployctl-probe@@ end\n"
    assert parse_probe_output(text) == {}


def test_a_probe_cut_before_its_end_mark_does_not_swallow_the_next_one() -> None:
    script = probe_script({"b": "echo still"})
    cut = "@@deployctl-probe@@ a\npartial\n@@deployctl-probe@@ rc=0\n"
    assert parse_probe_output(cut + run_script(script)) == {"b": ProbeOutput(0, "still")}


def test_a_probe_whose_exit_status_is_blank_counts_as_failed() -> None:
    text = "@@deployctl-probe@@ a\nout\n@@deployctl-probe@@ rc=\n@@deployctl-probe@@ end\n"
    assert parse_probe_output(text) == {"a": ProbeOutput(1, "out")}


# --- the clean/dirty verdict -----------------------------------------------------------------


def state_of(gpu_file: str, apps_file: str) -> tuple[list[Gpu], list[GpuProcess]]:
    return parse_gpus(capture(gpu_file)), parse_gpu_processes(capture(apps_file))


@pytest.mark.parametrize(
    ("gpu_file", "apps_file", "max_used", "clean", "verdict"),
    [
        ("idle-query-gpu.csv", "idle-query-compute-apps.csv", 16, True, "clean (1 GPU)"),
        ("idle-query-gpu.csv", "idle-query-compute-apps.csv", 0, True, "clean (1 GPU)"),
        (
            "busy-query-gpu.csv",
            "busy-query-compute-apps.csv",
            16,
            False,
            "dirty: PIDs 419 hold GPU memory",
        ),
        # A listed process makes the host dirty whatever the memory threshold.
        (
            "busy-query-gpu.csv",
            "busy-query-compute-apps.csv",
            100_000,
            False,
            "dirty: PIDs 419 hold GPU memory",
        ),
        (
            "busy-query-gpu.csv",
            "idle-query-compute-apps.csv",
            16,
            False,
            "dirty: memory in use with no process listed: GPU0 8811 MiB",
        ),
        (
            "busy-query-gpu.csv",
            "idle-query-compute-apps.csv",
            8810,
            False,
            "dirty: memory in use with no process listed: GPU0 8811 MiB",
        ),
        ("busy-query-gpu.csv", "idle-query-compute-apps.csv", 8811, True, "clean (1 GPU)"),
    ],
)
def test_gpu_report_verdict(
    gpu_file: str, apps_file: str, max_used: int, clean: bool, verdict: str
) -> None:
    gpus, processes = state_of(gpu_file, apps_file)
    report = GpuReport(gpus, processes, max_used_mib=max_used)
    assert report.clean is clean
    assert report.verdict() == verdict
    assert gpus_json(report)["clean"] is clean


def test_gpu_report_on_eight_gpus_names_each_busy_one() -> None:
    idle = parse_gpus(capture("idle-query-gpu.csv"))[0]
    busy = parse_gpus(capture("busy-query-gpu.csv"))[0]
    gpus = [
        Gpu(
            i, f"{idle.uuid[:-2]}{i:02x}", idle.name, idle.memory_used_mib, idle.memory_total_mib, 0
        )
        for i in range(8)
    ]
    assert GpuReport(gpus, [], DEFAULT_MAX_USED_MIB).verdict() == "clean (8 GPUs)"
    gpus[3] = Gpu(3, "GPU-3", busy.name, busy.memory_used_mib, busy.memory_total_mib, 0)
    gpus[6] = Gpu(6, "GPU-6", busy.name, 17, busy.memory_total_mib, 0)
    report = GpuReport(gpus, [], DEFAULT_MAX_USED_MIB)
    assert [g.index for g in report.busy_gpus] == [3, 6]
    assert report.verdict() == (
        "dirty: memory in use with no process listed: GPU3 8811 MiB, GPU6 17 MiB"
    )


def test_gpu_report_lists_each_pid_once_in_order() -> None:
    (process,) = parse_gpu_processes(capture("busy-query-compute-apps.csv"))
    (other,) = parse_gpu_processes(capture("busy3-query-gpu-noheader-nounits.csv"))
    processes = [process, other, GpuProcess(419, "python3", 100, "GPU-other")]
    report = GpuReport(parse_gpus(capture("busy-query-gpu.csv")), processes, DEFAULT_MAX_USED_MIB)
    assert report.pids == [418, 419]
    assert report.verdict() == "dirty: PIDs 418, 419 hold GPU memory"
    doc = gpus_json(report)
    assert [p["pid"] for p in doc["processes"]] == [419, 418, 419]
    assert doc["gpus"][0]["memory_used_mib"] == 8811


def test_gpu_report_from_the_combined_command_output() -> None:
    state = parse_gpus_command(0, combined("busy-query-gpu.csv", "busy-query-compute-apps.csv"))
    report = gpu_report(state, DEFAULT_MAX_USED_MIB)
    assert (report.clean, report.pids) == (False, [419])
    idle = parse_gpus_command(0, combined("idle-query-gpu.csv", "idle-query-compute-apps.csv"))
    assert gpu_report(idle, DEFAULT_MAX_USED_MIB).clean is True


DEPLOYCTL_CAPTURES = Path(__file__).parent / "data" / "nvidia-smi" / "h200-deployctl"


@pytest.mark.parametrize(
    ("prefix", "used", "pids", "names"),
    [
        ("idle", 0, [], []),
        ("busy-torch", 4715, [476], ["python3"]),
        ("busy-standin", 3691, [553], ["sglang::scheduler"]),
    ],
)
def test_parsers_on_captures_of_deployctls_own_queries(
    prefix: str, used: int, pids: list[int], names: list[str]
) -> None:
    gpus = parse_gpus((DEPLOYCTL_CAPTURES / f"{prefix}-query-gpu.csv").read_text())
    processes = parse_gpu_processes(
        (DEPLOYCTL_CAPTURES / f"{prefix}-query-compute-apps.csv").read_text()
    )
    assert [(g.index, g.name, g.memory_used_mib, g.memory_total_mib) for g in gpus] == [
        (0, "NVIDIA H200", used, 143771)
    ]
    assert gpus[0].compute_cap == "9.0"
    assert [p.pid for p in processes] == pids and [p.name for p in processes] == names
    assert all(p.gpu_uuid == gpus[0].uuid for p in processes)
    report = GpuReport(gpus, processes, 16)
    assert report.clean is (not pids)


TWO_GPU_CAPTURES = Path(__file__).parent / "data" / "nvidia-smi" / "h200x2-deployctl"


@pytest.mark.parametrize(
    ("prefix", "used", "processes"),
    [
        ("idle", [0, 0], []),
        ("busy-torch", [4715, 4715], [(595, "python3", 0), (595, "python3", 1)]),
        (
            "busy-standin",
            [3691, 3691],
            [(698, "sglang::scheduler_TP0", 0), (699, "sglang::scheduler_TP1", 1)],
        ),
    ],
)
def test_parsers_on_a_two_gpu_host(
    prefix: str, used: list[int], processes: list[tuple[int, str, int]]
) -> None:
    gpus = parse_gpus((TWO_GPU_CAPTURES / f"{prefix}-query-gpu.csv").read_text())
    found = parse_gpu_processes((TWO_GPU_CAPTURES / f"{prefix}-query-compute-apps.csv").read_text())
    assert [g.index for g in gpus] == [0, 1]
    assert [g.memory_used_mib for g in gpus] == used
    uuid_index = {g.uuid: g.index for g in gpus}
    assert [(p.pid, p.name, uuid_index[p.gpu_uuid]) for p in found] == processes
    report = GpuReport(gpus, found, 16)
    assert report.pids == sorted({pid for pid, _, _ in processes})
    assert report.clean is (not processes)


def two_gpu_state(prefix: str) -> GpuState:
    return parse_gpus_command(
        0,
        (TWO_GPU_CAPTURES / f"{prefix}-query-gpu.csv").read_text()
        + "@@apps\n"
        + (TWO_GPU_CAPTURES / f"{prefix}-query-compute-apps.csv").read_text(),
    )


def test_a_deployments_gpus_are_judged_alone() -> None:
    state = two_gpu_state("busy-standin")  # rank 0 (PID 698) on GPU 0, rank 1 (699) on GPU 1
    report = gpu_report(state, DEFAULT_MAX_USED_MIB, only=[1])
    assert [(g.index, g.memory_used_mib) for g in report.gpus] == [(1, 3691)]
    assert report.pids == [699]
    assert report.verdict() == "dirty: PIDs 699 hold GPU memory"
    # The threshold still applies to the GPUs asked about.
    assert gpu_report(state, 3691, only=[1]).busy_gpus == []
    assert gpu_report(state, 3690, only=[0]).busy_gpus == [state.gpus[0]]
    both = gpu_report(state, DEFAULT_MAX_USED_MIB, only=[0, 1])
    assert (both.gpus, both.processes) == (state.gpus, state.processes)


def test_a_deployments_gpus_are_clean_while_another_gpu_is_busy() -> None:
    state = two_gpu_state("busy-standin")
    idle = two_gpu_state("idle")
    mixed = GpuState([idle.gpus[0], state.gpus[1]], state.processes[1:])
    assert gpu_report(mixed, DEFAULT_MAX_USED_MIB).clean is False
    alone = gpu_report(mixed, DEFAULT_MAX_USED_MIB, only=[0])
    assert (alone.clean, alone.verdict()) == (True, "clean (1 GPU)")
    assert gpu_report(mixed, DEFAULT_MAX_USED_MIB, only=[]).gpus == []


def test_gpu_report_json_names_the_run_holding_each_process() -> None:
    state = two_gpu_state("busy-standin")
    report = GpuReport(state.gpus, state.processes, DEFAULT_MAX_USED_MIB, {698: "main (srv_v1)"})
    assert [(p["pid"], p["held_by"]) for p in gpus_json(report)["processes"]] == [
        (698, "main (srv_v1)"),
        (699, None),
    ]


# --- asking a host ---------------------------------------------------------------------------


class ScriptedConnection(Connection):
    """Runs commands through /bin/sh with a stand-in nvidia-smi first on PATH, or answers
    every command with `answer` (exit code, stdout[, stderr]); records every command."""

    def __init__(
        self, bin_dir: Path | None = None, answer: tuple[int, str] | tuple[int, str, str] = (1, "")
    ) -> None:
        super().__init__("here", 30)
        self.bin_dir, self.answer = bin_dir, answer
        self.commands: list[str] = []

    def _exec(
        self, command: str, stdin: bytes | None, timeout: float, shown: str
    ) -> tuple[int, bytes, bytes]:
        self.commands.append(command)
        if self.bin_dir is None:
            code, out, err = (*self.answer, "")[:3]
            return code, out.encode(), err.encode()
        path = f"{self.bin_dir}:{os.environ['PATH']}"
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            capture_output=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "PATH": path},
        )
        return done.returncode, done.stdout, done.stderr


def stand_in_nvidia_smi(tmp_path: Path, captures: Path, prefix: str) -> Path:
    """A nvidia-smi that answers deployctl's two queries with one capture's files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'echo "nvidia-smi: warning: setlocale" >&2\n'
        'case "$1" in\n'
        f"  --query-gpu=*) cat '{captures}/{prefix}-query-gpu.csv' ;;\n"
        f"  --query-compute-apps=*) cat '{captures}/{prefix}-query-compute-apps.csv' ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return bin_dir


def test_probes_that_never_reported_are_named_with_what_the_login_said() -> None:
    # The login printed a banner and failed: no probe frame at all in its output.
    banner = "Welcome!\n" + "x" * 400 + "\n"
    conn = ScriptedConnection(answer=(2, banner))
    with pytest.raises(ParseError) as info:
        run_probes(conn, {"gpus": "true", "version": "true"})
    assert str(info.value) == "probe gpus gave no result (exit 2): " + "x" * 300
    conn = ScriptedConnection(answer=(127, "Welcome!\n", "sh: 1: python3: not found\n"))
    with pytest.raises(ParseError) as info:
        run_probes(conn, {"gpus": "true"})
    assert str(info.value) == "probe gpus gave no result (exit 127): sh: 1: python3: not found"


def test_a_probe_that_kills_its_shell_leaves_the_later_probes_unreported(tmp_path: Path) -> None:
    conn = ScriptedConnection(tmp_path)
    probes = {"first": "echo one", "second": "kill -9 $$", "third": "echo three"}
    with pytest.raises(ParseError, match=r"^probe second gave no result \(exit -9\): "):
        run_probes(conn, probes)


def gpu_host(tmp_path: Path) -> Host:
    return Host(
        "here", {**DEFAULT_VARS, "python": sys.executable, "state_dir": str(tmp_path / "state")}
    )


@pytest.mark.parametrize(
    ("prefix", "only", "clean", "verdict"),
    [
        ("idle", None, True, "clean (2 GPUs)"),
        ("busy-standin", None, False, "dirty: PIDs 698, 699 hold GPU memory"),
        ("busy-standin", [1], False, "dirty: PIDs 699 hold GPU memory"),
    ],
)
def test_check_gpus_asks_the_host_once_and_judges(
    tmp_path: Path, prefix: str, only: list[int] | None, clean: bool, verdict: str
) -> None:
    conn = ScriptedConnection(stand_in_nvidia_smi(tmp_path, TWO_GPU_CAPTURES, prefix))
    report = check_gpus(gpu_host(tmp_path), conn, only=only)
    assert (report.clean, report.verdict()) == (clean, verdict)
    assert report.max_used_mib == DEFAULT_MAX_USED_MIB
    assert conn.round_trips == 1


def test_check_gpus_applies_the_memory_threshold(tmp_path: Path) -> None:
    conn = ScriptedConnection(stand_in_nvidia_smi(tmp_path, DEPLOYCTL_CAPTURES, "busy-torch"))
    # Memory in use (4715 MiB) with its process hidden: only the threshold decides.
    (tmp_path / "bin" / "nvidia-smi").write_text(
        (tmp_path / "bin" / "nvidia-smi")
        .read_text()
        .replace("busy-torch-query-compute-apps", "idle-query-compute-apps")
    )
    host = gpu_host(tmp_path)
    assert check_gpus(host, conn, max_used_mib=4714).verdict() == (
        "dirty: memory in use with no process listed: GPU0 4715 MiB"
    )
    assert check_gpus(host, conn, max_used_mib=4715).clean is True
    assert check_gpus(host, conn).max_used_mib == DEFAULT_MAX_USED_MIB


def test_check_gpus_when_nvidia_smi_fails_carries_its_words(tmp_path: Path) -> None:
    bin_dir = stand_in_nvidia_smi(tmp_path, TWO_GPU_CAPTURES, "idle")
    failing = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho "{failing}"\necho warned >&2\nexit 9\n')
    with pytest.raises(ParseError) as info:
        check_gpus(gpu_host(tmp_path), ScriptedConnection(bin_dir))
    assert str(info.value) == f"{failing} warned"


def runs_reply(*runs: dict[str, object]) -> tuple[int, str]:
    return 0, "Welcome!\n" + REPLY_MARK + json.dumps({"live_runs": list(runs)}) + "\n"


def live_run(run_id: str, deployment: str | None, members: list[int]) -> dict[str, object]:
    return {
        "id": run_id,
        "pid": members[0],
        "deployment": deployment,
        "gpus": None,
        "port": 30000,
        "members": members,
    }


def busy_two_gpu_report() -> GpuReport:
    return gpu_report(two_gpu_state("busy-standin"), DEFAULT_MAX_USED_MIB)


def test_find_holders_names_our_run_and_its_deployment(tmp_path: Path) -> None:
    conn = ScriptedConnection(
        answer=runs_reply(live_run("srv_v3", "main", [698, 699]), live_run("solo_v1", None, [1234]))
    )
    host = gpu_host(tmp_path)
    report = find_holders(host, conn, busy_two_gpu_report())
    assert report.holders == {698: "main (srv_v3)", 699: "main (srv_v3)", 1234: "solo_v1"}
    assert [p["held_by"] for p in gpus_json(report)["processes"]] == ["main (srv_v3)"] * 2
    (command,) = conn.commands
    assert " runs " in command
    assert json.dumps({"state_dir": str(tmp_path / "state")}) in command


def test_find_holders_leaves_processes_that_are_not_ours_unnamed(tmp_path: Path) -> None:
    conn = ScriptedConnection(answer=runs_reply(live_run("solo_v1", None, [699])))
    report = find_holders(gpu_host(tmp_path), conn, busy_two_gpu_report())
    assert [p["held_by"] for p in gpus_json(report)["processes"]] == [None, "solo_v1"]
    assert report.verdict() == "dirty: PIDs 698, 699 hold GPU memory"


def test_find_holders_costs_no_round_trip_on_a_clean_host(tmp_path: Path) -> None:
    conn = ScriptedConnection(answer=runs_reply(live_run("solo_v1", None, [699])))
    clean = gpu_report(two_gpu_state("idle"), DEFAULT_MAX_USED_MIB)
    assert find_holders(gpu_host(tmp_path), conn, clean) is clean
    assert conn.round_trips == 0


def test_find_holders_still_shows_the_gpus_when_the_agent_fails(tmp_path: Path) -> None:
    conn = ScriptedConnection(answer=(1, "Traceback: boom\n"))
    report = busy_two_gpu_report()
    assert find_holders(gpu_host(tmp_path), conn, report) is report
    assert conn.round_trips == 1
