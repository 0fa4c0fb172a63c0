"""The kept agent's GPU query through NVML (remote/gpus.py) writes what nvidia-smi writes.

This machine has no GPU: NVML is replaced by a stand-in with the library's calling
conventions (values written through the pointers it is given, status codes returned), fed
the figures of real H200 captures; the text must equal the captured nvidia-smi output. The
same comparison against nvidia-smi on a real H200 is in benchmarks/README.md (kept agent).
"""

from __future__ import annotations

import ctypes
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deployctl.facts import parse_gpus_command
from deployctl.remote import gpus

CAPTURES = Path(__file__).parent / "data" / "nvidia-smi"
MIB = 1 << 20
NOT_SUPPORTED = 3
INSUFFICIENT_SIZE = 7


@dataclass
class FakeGpu:
    uuid: str
    used_mib: float
    utilization: int | None = 0
    temperature: int | None = 38
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, MiB)


class FakeNvml:
    """libnvidia-ml's calls that remote/gpus.py makes, over fixed figures."""

    def __init__(self, devices: list[FakeGpu], driver: str = "580.159.04") -> None:
        self.devices, self.driver = devices, driver
        self.open = 0  # initialised and not shut down yet

    def nvmlInit_v2(self) -> int:
        self.open += 1
        return 0

    def nvmlShutdown(self) -> int:
        self.open -= 1
        return 0

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = len(self.devices)
        return 0

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: int) -> int:
        buffer.value = self.driver.encode()
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, handle: Any) -> int:
        handle._obj.value = index + 1
        return 0

    def _gpu(self, handle: ctypes.c_void_p) -> FakeGpu:
        assert handle.value is not None
        return self.devices[handle.value - 1]

    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: int) -> int:
        buffer.value = self._gpu(handle).uuid.encode()
        return 0

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, size: int) -> int:
        buffer.value = b"NVIDIA H200"
        return 0

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, memory: Any) -> int:
        assert memory._obj.version == ctypes.sizeof(memory._obj) | (2 << 24)
        memory._obj.total = 143771 * MIB
        memory._obj.reserved = 615 * MIB
        memory._obj.used = int(self._gpu(handle).used_mib * MIB)
        return 0

    def nvmlDeviceGetUtilizationRates(self, handle: Any, rates: Any) -> int:
        value = self._gpu(handle).utilization
        if value is None:
            return NOT_SUPPORTED
        rates._obj.gpu = value
        return 0

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int, value: Any) -> int:
        degrees = self._gpu(handle).temperature
        if degrees is None:
            return NOT_SUPPORTED
        value._obj.value = degrees
        return 0

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        major._obj.value, minor._obj.value = 9, 0
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, table: Any) -> int:
        found = self._gpu(handle).processes
        if count._obj.value < len(found):
            count._obj.value = len(found)
            return INSUFFICIENT_SIZE
        for slot, (pid, mib) in zip(table, found, strict=False):
            slot.pid, slot.used = pid, (mib * MIB if mib >= 0 else 0xFFFFFFFFFFFFFFFF)
        count._obj.value = len(found)
        return 0


def titled(title: str) -> subprocess.Popen[bytes]:
    """A process whose argv[0] is `title` (SGLang titles its ranks `sglang::scheduler_TP0`),
    once /proc shows it."""
    proc = subprocess.Popen([title, "60"], executable="/bin/sleep")
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    while not cmdline.read_bytes().startswith(title.encode()):
        time.sleep(0.01)
    return proc


@pytest.fixture
def named_process() -> Iterator[int]:
    proc = titled("sglang::scheduler_TP0")
    yield proc.pid
    proc.kill()
    proc.wait()


def answer_of(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> str | None:
    monkeypatch.setattr(gpus, "_loaded", [nvml])
    return gpus.gpus_answer()


def capture(folder: str, name: str, pid: int | None = None) -> str:
    gpu = (CAPTURES / folder / f"{name}-query-gpu.csv").read_text()
    apps = (CAPTURES / folder / f"{name}-query-compute-apps.csv").read_text()
    return gpu + "@@apps\n" + apps


def test_an_idle_gpu_reads_as_nvidia_smi_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([FakeGpu("GPU-291534dd-0f54-d546-64bc-f93e119388e6", 0, 0, 37)])
    answer = answer_of(nvml, monkeypatch)
    expected = capture("h200-deployctl", "idle")
    assert answer == expected
    assert nvml.open == 0  # no GPU device is held open between rounds


def test_two_busy_gpus_with_their_processes_read_as_nvidia_smi_writes_them(
    monkeypatch: pytest.MonkeyPatch, named_process: int
) -> None:
    second = titled("sglang::scheduler_TP1")
    try:
        nvml = FakeNvml(
            [
                FakeGpu("GPU-a283a5ec-2e94-1085-4635-836404cd95dc", 3691, 0, 37,
                        [(named_process, 3682)]),
                FakeGpu("GPU-1ce9164d-afa9-1258-6c4c-61a55ec33547", 3691, 0, 36,
                        [(second.pid, 3682)]),
            ]
        )  # fmt: skip
        answer = answer_of(nvml, monkeypatch)
    finally:
        second.kill()
        second.wait()
    expected = (
        capture("h200x2-deployctl", "busy-standin")
        .replace("698,", f"{named_process},")
        .replace("699,", f"{second.pid},")
    )
    assert answer == expected
    state = parse_gpus_command(0, answer or "")
    assert [p.used_memory_mib for p in state.processes] == [3682, 3682]


def test_memory_is_rounded_up_to_a_mib_as_nvidia_smi_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seen on an H200 in one moment: NVML's 22027239424 bytes used, nvidia-smi's 21007 MiB.
    nvml = FakeNvml([FakeGpu("GPU-x", 22027239424 / MIB)])
    assert ", 21007 MiB, 143771 MiB," in (answer_of(nvml, monkeypatch) or "")


def test_figures_a_gpu_does_not_report_are_not_available_and_a_long_process_list_is_read_whole(
    monkeypatch: pytest.MonkeyPatch, named_process: int
) -> None:
    many = [(named_process, 10)] * 69 + [(named_process, -1)]  # more than the first table holds
    nvml = FakeNvml([FakeGpu("GPU-x", 700, None, None, many)])
    answer = answer_of(nvml, monkeypatch) or ""
    assert "GPU-x, NVIDIA H200, 700 MiB, 143771 MiB, [N/A], [N/A], 9.0" in answer
    # NVML_VALUE_NOT_AVAILABLE for a process's memory: [N/A], as nvidia-smi shows it.
    assert answer.endswith(", [N/A], GPU-x\n")
    state = parse_gpus_command(0, answer)
    assert state.gpus[0].utilization_pct is None and len(state.processes) == 70


def test_without_nvml_or_after_a_failed_query_nvidia_smi_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpus, "_loaded", [None])
    assert gpus.gpus_answer() is None
    broken = FakeNvml([FakeGpu("GPU-x", 0)])
    monkeypatch.setattr(broken, "nvmlDeviceGetMemoryInfo_v2", lambda handle, memory: 15)
    assert answer_of(broken, monkeypatch) is None
    assert broken.open == 0
    surprising = FakeNvml([FakeGpu("GPU-x", 0)])
    monkeypatch.setattr(surprising, "nvmlDeviceGetUUID", lambda *args: 1 / 0)
    assert answer_of(surprising, monkeypatch) is None


class OldDriverNvml(FakeNvml):
    """A driver older than R510: no nvmlDeviceGetMemoryInfo_v2 (ctypes: AttributeError)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "nvmlDeviceGetMemoryInfo_v2":
            raise AttributeError("undefined symbol: nvmlDeviceGetMemoryInfo_v2")
        return super().__getattribute__(name)


def test_a_driver_without_a_function_read_is_left_to_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = OldDriverNvml([FakeGpu("GPU-x", 0)])
    monkeypatch.setattr(gpus.ctypes, "CDLL", lambda name: old)
    monkeypatch.setattr(gpus, "_loaded", [])
    assert gpus.gpus_answer() is None and gpus._loaded == [None]
    assert old.open == 0
