"""The GPUs' state through NVML, for the kept agent: the answer nvidia-smi gives to
`GPUS_COMMAND`, in its own CSV, without starting nvidia-smi.

Measured on an H200 host (driver 580): the two nvidia-smi queries of a status cost 33–41 ms
of CPU each round; NVML answers the same text in about 0.15 ms once initialised (about 2 ms
to initialise again). Where the library cannot be loaded or a query fails, nvidia-smi answers
as before.
"""

from __future__ import annotations

import ctypes
from typing import Any

_MIB = 1 << 20
_SUCCESS = 0
_NOT_AVAILABLE = "[N/A]"
_GPU_HEADER = (
    "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], "
    "temperature.gpu, compute_cap, driver_version"
)
_APPS_HEADER = "pid, process_name, used_gpu_memory [MiB], gpu_uuid"


class _MemoryV2(ctypes.Structure):
    # nvmlMemory_v2_t: `used` leaves out what the driver reserves, as nvidia-smi shows it.
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Process(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("used", ctypes.c_ulonglong),
        ("gpu_instance", ctypes.c_uint),
        ("compute_instance", ctypes.c_uint),
    ]


_MEMORY_V2 = ctypes.sizeof(_MemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)
_NOT_AVAILABLE_BYTES = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE: a process's memory unknown
# Every function read, so a driver older than one of them (R510 for the _v2/_v3 ones) is
# seen at load, and nvidia-smi answers instead.
_FUNCTIONS = (
    "nvmlInit_v2", "nvmlShutdown", "nvmlDeviceGetCount_v2", "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetComputeRunningProcesses_v3",
)  # fmt: skip
_loaded: list[Any] = []  # the library once loaded; [None] when it cannot be


def _library() -> Any:
    if not _loaded:
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            for name in _FUNCTIONS:
                getattr(nvml, name)
            _loaded.append(nvml)
        except (OSError, AttributeError):
            _loaded.append(None)
    return _loaded[0]


class _Failed(Exception):
    pass


def _ok(code: int) -> None:
    if code != _SUCCESS:
        raise _Failed(code)


def _text(read: Any, *args: Any) -> str:
    buffer = ctypes.create_string_buffer(96)
    _ok(read(*args, buffer, 96))
    return buffer.value.decode(errors="replace")


def _optional(read: Any, handle: Any, value: Any, *args: Any) -> Any:
    """A figure some GPUs do not report: None where NVML says so."""
    return value if read(handle, *args, ctypes.byref(value)) == _SUCCESS else None


def gpus_answer() -> str | None:
    """GPUS_COMMAND's output (both queries, `@@apps` between) read through NVML; None where
    NVML cannot answer (no library, an old driver, a GPU that fails a query): nvidia-smi
    answers then. NVML is shut down after each answer, so the kept agent holds no GPU device
    open between rounds (a GPU reset or a MIG change is never blocked by it); initialising
    it again costs about 2 ms of CPU, against 33-41 ms for nvidia-smi."""
    nvml = _library()
    if nvml is None or nvml.nvmlInit_v2() != _SUCCESS:
        return None
    try:
        return _read(nvml)
    except Exception:  # _Failed, or anything the library did that we did not expect
        return None
    finally:
        nvml.nvmlShutdown()


def _read(nvml: Any) -> str:
    count = ctypes.c_uint()
    _ok(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)))
    driver = _text(nvml.nvmlSystemGetDriverVersion)
    gpus, apps = [_GPU_HEADER], [_APPS_HEADER]
    for index in range(count.value):
        handle = ctypes.c_void_p()
        _ok(nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)))
        uuid = _text(nvml.nvmlDeviceGetUUID, handle)
        memory = _MemoryV2(version=_MEMORY_V2)
        _ok(nvml.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory)))
        busy = _optional(nvml.nvmlDeviceGetUtilizationRates, handle, _Utilization())
        temperature = _optional(nvml.nvmlDeviceGetTemperature, handle, ctypes.c_uint(), 0)
        major, minor = ctypes.c_int(), ctypes.c_int()
        _ok(
            nvml.nvmlDeviceGetCudaComputeCapability(
                handle, ctypes.byref(major), ctypes.byref(minor)
            )
        )
        fields = [
            str(index),
            uuid,
            _text(nvml.nvmlDeviceGetName, handle),
            _mib(memory.used),
            _mib(memory.total),
            _NOT_AVAILABLE if busy is None else f"{busy.gpu} %",
            _NOT_AVAILABLE if temperature is None else str(temperature.value),
            f"{major.value}.{minor.value}",
            driver,
        ]
        gpus.append(", ".join(fields))
        for process in _processes(nvml, handle):
            apps.append(
                f"{process.pid}, {_process_name(process.pid)}, {_mib(process.used)}, {uuid}"
            )
    return "\n".join(gpus) + "\n@@apps\n" + "\n".join(apps) + "\n"


def _mib(size: int) -> str:
    # nvidia-smi rounds up (seen on an H200: 22027239424 bytes used shown as 21007 MiB).
    return _NOT_AVAILABLE if size == _NOT_AVAILABLE_BYTES else f"{-(-size // _MIB)} MiB"


def _processes(nvml: Any, handle: Any) -> list[_Process]:
    size = 64
    while True:  # the table grows until it holds every process (NVML says how many)
        count = ctypes.c_uint(size)
        table = (_Process * size)()
        code = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), table)
        if code == _SUCCESS:
            return list(table[: count.value])
        if count.value <= size:
            raise _Failed(code)
        size = count.value + 8


def _process_name(pid: int) -> str:
    """The process's argv[0], as nvidia-smi shows it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().split(b"\0", 1)[0].decode(errors="replace") or "[Not Found]"
    except OSError:
        return "[Not Found]"
