"""Check the SM120 gates of the sm120-support patch set without torch or a GPU.

Run as `<python> sm120_gates.py` with DEPLOYCTL_SITE=<site-packages holding sglang/>.
The touched modules import torch, so they are only compiled (not imported). The
gate functions themselves are lifted from the installed source with `ast` and
executed against a stand-in platform built from a compute capability:
`_check_cuda_device_version` and the `is_sm90/100/120_supported` probes come
from the installed `utils/common.py`, so capability (12, 0) reaches the gates
through SGLang's own probe logic. The workspace preflight runs the same way,
against a stand-in CUDA driver of a PCIe part without multicast, whose
multicast granularity query fails as it does on such hardware. Stdlib only.
Exit 0 on success; otherwise one line on stderr and exit 1.
"""

from __future__ import annotations
import __future__

import ast
import functools
import logging
import os
import sys
import types
from typing import Optional

FUSION = ("sglang", "srt", "layers", "flashinfer_comm_fusion.py")
ADD_NORM = ("sglang", "srt", "layers", "layer_boundary", "residual", "add_norm.py")
COMMON = ("sglang", "srt", "utils", "common.py")
PROBES = {
    "is_sm90": "is_sm90_supported",
    "is_sm100": "is_sm100_supported",
    "is_sm120": "is_sm120_supported",
}


class CheckError(Exception):
    pass


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckError(message)


class Source:
    """One installed source file: compiled once, top-level nodes executable on demand."""

    def __init__(self, site: str, parts: tuple[str, ...]):
        self.path = os.path.join(site, *parts)
        expect(os.path.isfile(self.path), f"missing {self.path}")
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        try:
            compile(text, self.path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise CheckError(f"{self.path} does not compile: {exc}") from exc
        self.tree = ast.parse(text, filename=self.path)

    def node(self, name: str) -> ast.stmt:
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return node
        raise CheckError(f"{os.path.basename(self.path)} has no top-level {name}")

    def run(self, names: list[str], namespace: dict) -> dict:
        module = ast.Module(body=[self.node(n) for n in names], type_ignores=[])
        code = compile(
            module, self.path, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
        )
        exec(code, namespace)
        return namespace


def platform_for(
    common: Source, capability: tuple[int, int], cuda: str = "12.8"
) -> types.SimpleNamespace:
    """Evaluate SGLang's own capability probes for a given (major, minor)."""
    fake_torch = types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda))
    ns = {
        "is_cuda": lambda: True,
        "get_device_sm": lambda: capability[0] * 10 + capability[1],
        "torch": fake_torch,
        "lru_cache": functools.lru_cache,
        "partial": functools.partial,
        "List": list,
        "Tuple": tuple,
    }
    common.run(["_check_cuda_device_version", *PROBES.values()], ns)
    return types.SimpleNamespace(**{fact: ns[probe]() for fact, probe in PROBES.items()})


def resolve(fusion: Source, platform, backend: str, multi_node: bool = False):
    ns = fusion.run(["_mnnvl_supported", "_resolve_backend"], {"get_platform": lambda: platform})
    try:
        return ns["_resolve_backend"](backend, multi_node)
    except ValueError:
        return "error"


def ar_fusion_applies(add_norm: Source, platform, backend, batch_size: int = 16) -> bool:
    ns = {
        "_is_cuda": True,
        "get_platform": lambda: platform,
        "_is_flashinfer_available": True,
        "is_dp_attention_enabled": lambda: False,
        "get_exec": lambda: types.SimpleNamespace(
            comm=types.SimpleNamespace(flashinfer_allreduce_fusion_backend=backend)
        ),
        "uses_cutedsl_ar_fusion": lambda: backend == "cutedsl",
        "is_flashinfer_allreduce_unavailable": lambda: False,
    }
    names = [
        "_is_sm90_supported",
        "_is_sm100_supported",
        "_is_sm120_supported",
        "FUSE_ALLREDUCE_MAX_BATCH_SIZE",
        "flashinfer_ar_fusion_applies",
    ]
    add_norm.run(names, ns)
    return bool(ns["flashinfer_ar_fusion_applies"](batch_size))


class PcieDriver:
    """Stand-in CUDA driver bindings of a GPU without multicast: allocation works,
    cuMulticastGetGranularity fails. Records the calls the preflight makes."""

    GRANULARITY = 1 << 21

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.CUresult = types.SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_NOT_SUPPORTED=801)
        self.CUmemAllocationGranularity_flags = types.SimpleNamespace(
            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1
        )
        self.CUmulticastGranularity_flags = types.SimpleNamespace(
            CU_MULTICAST_GRANULARITY_RECOMMENDED=1
        )
        self.CUmulticastObjectProp = types.SimpleNamespace

    def cuMemGetAllocationGranularity(self, prop, flags):
        self.calls.append("cuMemGetAllocationGranularity")
        return self.CUresult.CUDA_SUCCESS, self.GRANULARITY

    def cuMulticastGetGranularity(self, prop, flags):
        self.calls.append("cuMulticastGetGranularity")
        return self.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0

    def cuMemCreate(self, size, prop, flags):
        self.calls.append("cuMemCreate")
        return self.CUresult.CUDA_SUCCESS, object()

    def cuMemRelease(self, handle):
        self.calls.append("cuMemRelease")


class FakeTorch(types.ModuleType):
    """Just enough of torch (and torch.distributed) for the preflight's CPU vote."""

    float32, bfloat16, int32 = "float32", "bfloat16", "int32"

    def __init__(self) -> None:
        super().__init__("torch")
        self.distributed = types.ModuleType("torch.distributed")
        self.distributed.ReduceOp = types.SimpleNamespace(BAND="band")
        self.distributed.all_reduce = lambda tensor, op=None, group=None: None
        self.distributed.get_rank = lambda group=None: 0

    def tensor(self, values, dtype=None):
        return types.SimpleNamespace(item=lambda: values[0])


def preflight(fusion: Source, platform, backend: str | None) -> tuple[bool, PcieDriver, list[int]]:
    """Run the installed workspace preflight for a 2-rank group on a GPU without multicast.
    backend=None calls it as upstream does, without the backend."""
    driver = PcieDriver()
    fake_torch = FakeTorch()
    sizes: list[int] = []
    group = types.SimpleNamespace(world_size=2, cpu_group="cpu")
    ns = {
        "torch": fake_torch,
        "Optional": Optional,
        "logger": logging.getLogger("sm120_gates"),
        "get_platform": lambda: platform,
        "get_parallel": lambda: types.SimpleNamespace(tp_group=group),
        "get_cuda_driver_bindings": lambda: driver,
        "_make_flashinfer_workspace_allocation_prop": lambda drv: types.SimpleNamespace(
            requestedHandleTypes="posix_fd"
        ),
        "ceil_align": lambda x, y: (x + y - 1) // y * y,
    }
    names = [
        "_flashinfer_trtllm_workspace_allocation_sizes",
        "_probe_cumem_create_sequence",
        "_preflight_check_workspace_memory",
    ]
    if backend is not None:
        names.append("_workspace_uses_multicast")
    fusion.run(names, ns)
    real_sizes = ns["_flashinfer_trtllm_workspace_allocation_sizes"]

    def recording_sizes(*args, **kwargs):
        sizes.extend(real_sizes(*args, **kwargs))
        return sizes

    ns["_flashinfer_trtllm_workspace_allocation_sizes"] = recording_sizes
    saved = {name: sys.modules.get(name) for name in ("torch", "torch.distributed")}
    sys.modules["torch"], sys.modules["torch.distributed"] = fake_torch, fake_torch.distributed
    logging.disable(logging.WARNING)  # the upstream fallback warns; only the verdict matters
    try:
        ok = ns["_preflight_check_workspace_memory"](
            world_size=2,
            max_token_num=2048,
            hidden_dim=4096,
            dtype=fake_torch.bfloat16,
            **({} if backend is None else {"backend": backend}),
        )
    finally:
        logging.disable(logging.NOTSET)
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return ok, driver, sizes


def allreduce_path_lines(
    fusion: Source, backend, fusion_ready: bool, tp_rank: int, tp_size: int = 2
):
    """Run the installed _log_allreduce_path on one rank; return (level, message) lines."""
    records: list[tuple[int, str]] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((record.levelno, record.getMessage()))

    log = logging.Logger("sm120_gates.path")
    log.addHandler(Recorder())
    group = types.SimpleNamespace(
        world_size=tp_size,
        rank_in_group=tp_rank,
        pcie_ipc_comm=None,
        ca_comm=types.SimpleNamespace(disabled=True),
    )
    ns = {
        "Optional": Optional,
        "logger": log,
        "_allreduce_path_logged": False,
        "get_parallel": lambda: types.SimpleNamespace(tp_group=group),
        "resolve_flashinfer_allreduce_fusion_backend": lambda: backend,
        "get_exec": lambda: types.SimpleNamespace(
            comm=types.SimpleNamespace(flashinfer_allreduce_fusion_backend=backend)
        ),
    }
    fusion.run(["allreduce_path_message", "_log_allreduce_path"], ns)
    ns["_log_allreduce_path"](fusion_ready=fusion_ready)
    ns["_log_allreduce_path"](fusion_ready=fusion_ready)  # once per process
    return records


def check_preflight(fusion: Source, sm120, sm90) -> None:
    ok, driver, sizes = preflight(fusion, sm120, "trtllm")
    expect(
        "cuMulticastGetGranularity" not in driver.calls,
        "the SM120 trtllm preflight still queries multicast granularity",
    )
    expect(ok, "the SM120 trtllm preflight fails on a GPU without multicast")
    expect(
        len(sizes) == 3 and all(size % PcieDriver.GRANULARITY == 0 for size in sizes),
        f"SM120 trtllm workspace sizes {sizes} are not three allocation-granular buffers",
    )
    expect(
        driver.calls.count("cuMemCreate") == 3 == driver.calls.count("cuMemRelease"),
        f"the probe must create and release three buffers, made {driver.calls}",
    )
    # SM90 keeps upstream's probe: multicast is queried, so a part without it skips fusion.
    ok, driver, _ = preflight(fusion, sm90, "trtllm")
    expect(
        "cuMulticastGetGranularity" in driver.calls and not ok,
        "the SM90 preflight changed: it must still query multicast",
    )

    lines = allreduce_path_lines(fusion, "trtllm", fusion_ready=True, tp_rank=0)
    expect(
        len(lines) == 1 and lines[0][0] == logging.INFO and "engaged" in lines[0][1],
        f"rank 0 with fusion engaged logged {lines}",
    )
    lines = allreduce_path_lines(fusion, "trtllm", fusion_ready=False, tp_rank=0)
    expect(
        len(lines) == 1
        and lines[0][0] == logging.WARNING
        and "NOT in use" in lines[0][1]
        and "NCCL" in lines[0][1],
        f"rank 0 with fusion fallen back logged {lines}",
    )
    expect(
        not allreduce_path_lines(fusion, "trtllm", fusion_ready=True, tp_rank=1),
        "only TP rank 0 may log the all-reduce path",
    )
    message = fusion.run(["allreduce_path_message"], {"Optional": Optional})[
        "allreduce_path_message"
    ]("trtllm", False, pcie_ipc=True, custom_ar=False)
    expect("PCIe-IPC" in message, f"the PCIe-IPC fallback is not named: {message}")


def check(site: str) -> None:
    common = Source(site, COMMON)
    fusion = Source(site, FUSION)
    add_norm = Source(site, ADD_NORM)

    sm120 = platform_for(common, (12, 0))
    expect(
        (sm120.is_sm90, sm120.is_sm100, sm120.is_sm120) == (False, False, True),
        f"capability (12, 0) probes as {vars(sm120)}",
    )
    sm90 = platform_for(common, (9, 0))
    sm100 = platform_for(common, (10, 0))
    sm89 = platform_for(common, (8, 9))

    # SM120: trtllm single-node only; mnnvl, cutedsl and multi-node stay rejected.
    got = {
        "trtllm": resolve(fusion, sm120, "trtllm"),
        "auto": resolve(fusion, sm120, "auto"),
        "auto multi-node": resolve(fusion, sm120, "auto", True),
        "trtllm multi-node": resolve(fusion, sm120, "trtllm", True),
        "mnnvl": resolve(fusion, sm120, "mnnvl"),
        "cutedsl": resolve(fusion, sm120, "cutedsl"),
    }
    want = {
        "trtllm": "trtllm",
        "auto": "trtllm",
        "auto multi-node": "error",
        "trtllm multi-node": "error",
        "mnnvl": "error",
        "cutedsl": "error",
    }
    expect(got == want, f"SM120 backend resolution {got}, expected {want}")

    # Unchanged elsewhere.
    expect(resolve(fusion, sm90, "auto") == "trtllm", "SM90 auto must stay trtllm")
    expect(resolve(fusion, sm100, "auto") == "mnnvl", "SM100 auto must stay mnnvl")
    expect(resolve(fusion, sm100, "cutedsl") == "cutedsl", "SM100 cutedsl must stay allowed")
    expect(resolve(fusion, sm89, "trtllm") == "error", "SM89 must stay rejected")

    expect(
        ar_fusion_applies(add_norm, sm120, "trtllm"),
        "fused AR+RMSNorm must apply on SM120 with trtllm",
    )
    expect(
        not ar_fusion_applies(add_norm, sm120, None),
        "fusion must stay off on SM120 without the opt-in",
    )
    expect(
        not ar_fusion_applies(add_norm, sm120, "trtllm", batch_size=4096),
        "batch bound must still hold",
    )
    expect(ar_fusion_applies(add_norm, sm100, "mnnvl"), "SM100 must keep the fusion")
    expect(not ar_fusion_applies(add_norm, sm89, "trtllm"), "SM89 must stay excluded")

    check_preflight(fusion, sm120, sm90)


def main() -> int:
    sys.dont_write_bytecode = True  # leave the host's site-packages untouched
    site = os.environ.get("DEPLOYCTL_SITE")
    if not site:
        print("DEPLOYCTL_SITE is not set", file=sys.stderr)
        return 1
    try:
        check(site)
    except CheckError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except Exception as exc:  # a changed function shape is a failure too
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
