"""Check the batch-size threshold: its decisions, hysteresis, graph pruning and bounded switching.

Run as `<python> threshold_decision.py` with DEPLOYCTL_SITE=<site-packages holding sglang/>.
Needs the stdlib and msgspec (an SGLang dependency), no torch. The policy module,
`adaptive_runtime_state.py`, `runtime_context.py` and `cuda_graph_config.py` import
nothing heavy, so they are imported for real. `EAGLEWorkerV2` imports torch, so its
`apply_runtime_state` and `_override_worker_state` are lifted from the installed
source with `ast` and run on a worker without a GPU, against a real `RuntimeContext`
holding the config leaves they touch.
Exit 0 on success; otherwise one line on stderr and exit 1.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import os
import sys
import tracemalloc
import types

N = 5  # the threshold under test
STEPS = 3  # --speculative-num-steps
GRAPH_BS = [1, 2, 4, 8, 16, 32]  # the decode sizes capture reads
LONG_RUN = 10_000
POLICY_MODULE = "sglang.srt.speculative.spec_disable_policy"


class CheckError(Exception):
    pass


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckError(message)


def _stub_packages(site: str) -> None:
    """Register bare `sglang` and `sglang.srt` packages so their heavy __init__ is skipped."""
    for name in ("sglang", "sglang.srt"):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(site, *name.split("."))]
        sys.modules[name] = module


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def worker_method_node(site: str, name: str) -> tuple[str, ast.FunctionDef]:
    """The source path and syntax tree of one method of the installed EAGLEWorkerV2."""
    path = os.path.join(site, "sglang", "srt", "speculative", "eagle_worker_v2.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EAGLEWorkerV2":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return path, item
    raise CheckError(f"eagle_worker_v2.py has no EAGLEWorkerV2.{name}")


def worker_method(site: str, name: str, namespace: dict):
    """One method of EAGLEWorkerV2, compiled from the installed eagle_worker_v2.py."""
    path, node = worker_method_node(site, name)
    module = ast.Module(body=[node], type_ignores=[])
    flags = __future__.annotations.compiler_flag  # leave annotations unevaluated
    exec(compile(module, path, "exec", flags=flags, dont_inherit=True), namespace)
    return namespace[name]


def init_states_input(site: str, ctx) -> object:
    """Evaluate the cuda_graph_bs that EAGLEWorkerV2.init_cuda_graphs hands to
    init_states, against the given context, with decode graphs enabled."""
    path, method = worker_method_node(site, "init_cuda_graphs")
    for node in ast.walk(method):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "init_states"
        ):
            for keyword in node.keywords:
                if keyword.arg == "cuda_graph_bs":
                    code = compile(ast.Expression(keyword.value), path, "eval")
                    return eval(
                        code,
                        {
                            "check_cuda_graph_backend": lambda phase, backend: False,
                            "Phase": types.SimpleNamespace(DECODE="decode"),
                            "Backend": types.SimpleNamespace(DISABLED="disabled"),
                            "get_exec": lambda: ctx.config_bag("exec"),
                            "get_spec": lambda: ctx.config_bag("spec"),
                        },
                    )
    raise CheckError("init_cuda_graphs no longer passes cuda_graph_bs to init_states")


def published_context(threshold: int | None):
    """A real RuntimeContext with the spec and exec.graph leaves the worker touches."""
    import msgspec
    from sglang.srt import runtime_context as rc
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig

    leaves = {
        "speculative_num_steps": ("spec", STEPS),
        "speculative_num_draft_tokens": ("spec", STEPS + 1),
        "speculative_disable_batch_threshold": ("spec", threshold),
        "cuda_graph_bs_decode": ("exec.graph", None),
        "disable_cuda_graph": ("exec.graph", False),
        "cuda_graph_config": (
            "exec.graph",
            CudaGraphConfig(
                decode=PhaseConfig(backend=Backend.FULL, bs=list(GRAPH_BS)),
                prefill=PhaseConfig(backend=Backend.DISABLED),
            ),
        ),
    }
    args_type = msgspec.defstruct("ServerArgs", [(name, object, None) for name in leaves])
    args_type._NS_BY_FIELD = {name: path for name, (path, _) in leaves.items()}
    spec, exec_, graph = rc._ConfigBag("spec"), rc._ConfigBag("exec"), rc._ConfigBag("exec.graph")
    exec_._set_sub("graph", graph)
    for name, (path, value) in leaves.items():
        (spec if path == "spec" else graph)._set(name, value)
    ctx = rc.RuntimeContext(types.SimpleNamespace())
    ctx._server_args = args_type()
    ctx._config_bags = {"spec": spec, "exec": exec_}
    return ctx


class Worker:
    """The AdaptiveSpecWorker side of EAGLEWorkerV2 without a GPU: the installed
    apply_runtime_state and _override_worker_state, on stand-in runners."""

    def __init__(self, site: str, ctx, switch_log):
        from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase
        from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

        self.log_lines: list[str] = []
        self.speculative_num_steps = STEPS
        self.speculative_num_draft_tokens = STEPS + 1
        self._draft_worker = types.SimpleNamespace(
            draft_runner=types.SimpleNamespace(),
            _rebuild_topk1_chain_buffers=lambda: None,
            speculative_num_steps=STEPS,
            speculative_num_draft_tokens=STEPS + 1,
        )
        self._target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace())
        for name in ("draft_attn_backend", "draft_extend_attn_backend", "cuda_graph_runner"):
            setattr(self._draft_worker, name, None)
        self._draft_worker.cuda_graph_runner_for_draft_extend = None
        self._draft_worker.draft_runner.draft_attn_backend = None
        self._draft_worker.draft_runner.attn_backend = None
        self.ctx = ctx
        self.captured: dict[int, object] = {}
        self._spec_state = SpecRuntimeState
        namespace = {
            "contextlib": contextlib,
            "logger": None,
            "log_info_on_rank0": lambda _logger, message: self.log_lines.append(message),
            "get_context": lambda: ctx,
            "get_spec": lambda: ctx.config_bag("spec"),
            "get_exec": lambda: ctx.config_bag("exec"),
            "with_phase": with_phase,
            "Phase": Phase,
            "Backend": Backend,
        }
        self._apply = worker_method(site, "apply_runtime_state", namespace)
        self._override = worker_method(site, "_override_worker_state", namespace)
        self._switch_log = switch_log

    def apply_runtime_state(self, state) -> None:
        self._apply(self, state)

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ):
        with self._override(
            self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs
        ):
            # What a graph runner built here would read (get_batch_sizes_to_capture).
            self.captured[speculative_num_steps] = self.ctx.config_bag(
                "exec"
            ).graph.cuda_graph_config.decode
        return self._spec_state(
            speculative_num_steps=speculative_num_steps,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
            draft_attn_backend=None,
            cuda_graph_runner=None,
            target_attn_backend=None,
            target_graph_runner=None,
            draft_extend_attn_backend=None,
            cuda_graph_runner_for_draft_extend=None,
        )

    def startup_state(self):
        return self._spec_state(STEPS, STEPS + 1, None, None, None, None, None, None)


def drive(site: str, policy, batches, clock: FakeClock, on_step=None):
    """Run the real AdaptiveController over a batch-size sequence, as EAGLEWorkerV2
    does: activate_step_by_batch before each decode, verify feedback after it, 20 ms
    a step. Returns (worker, steps run per batch, context)."""
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    ctx = published_context(getattr(policy, "threshold", None))
    limiter = getattr(sys.modules.get(POLICY_MODULE), "SwitchLogLimiter", None)
    worker = Worker(site, ctx, limiter and limiter(clock=clock))
    controller = AdaptiveController(worker, policy)
    controller.register(worker.startup_state())
    controller.init_states(cuda_graph_bs=list(GRAPH_BS))
    trace = []
    for i, bs in enumerate(batches):
        controller.activate_step_by_batch(bs)
        trace.append(worker.speculative_num_steps)
        controller.on_verify_complete([0] * bs, batch_size=bs)
        clock.now += 0.02
        if on_step is not None:
            on_step(i)
    return worker, trace, ctx


def check_policy(policy_mod) -> None:
    should_speculate = policy_mod.should_speculate
    expect(should_speculate(N, N), "batch == N must be on the drafting side")
    expect(not should_speculate(N + 1, N), "batch == N+1 must run plain decode")
    expect(should_speculate(10_000, None), "threshold None must always speculate")

    policy = policy_mod.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=N, resume_after=3)
    expect(policy.candidate_steps == [0, STEPS], f"candidate_steps {policy.candidate_steps}")
    got = [policy.get_steps_for_batch(b) for b in (1, N, N + 1, N, N, N + 7, N, N, N, 1)]
    want = [STEPS, STEPS, 0, 0, 0, 0, 0, 0, STEPS, STEPS]
    expect(got == want, f"hysteresis (resume after 3) gave {got}, expected {want}")
    expect(policy.on_verify_complete([0, 0, 0], 3) is None, "acceptance must not switch")
    for bad in (0, -1, None):
        try:
            policy_mod.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=bad)
        except ValueError:
            pass
        else:
            raise CheckError(f"threshold {bad!r} was accepted")

    policy.set_cuda_graph_bs(GRAPH_BS)
    expect(policy.cuda_graph_bs_for_step(0) == [8, 16, 32], "steps=0 captures only sizes above N")
    expect(
        policy.cuda_graph_bs_for_step(STEPS) == GRAPH_BS, "the startup state keeps the full list"
    )
    policy.set_cuda_graph_bs(None)
    expect(policy.cuda_graph_bs_for_step(0) is None, "graphs disabled -> None")

    clock = FakeClock()
    limiter = policy_mod.SwitchLogLimiter(interval_s=60.0, clock=clock)
    admitted = []
    for second in range(0, 200, 10):  # a switch every 10 s
        clock.now = float(second)
        admitted.append(limiter.admit())
    expect(
        admitted == [0, *[None] * 5, 5, *[None] * 5, 5, *[None] * 5, 5, None],
        f"switch log admissions {admitted}",
    )


def check_graph_pruning(site: str, policy_mod) -> None:
    from sglang.srt.model_executor.cuda_graph_config import Backend

    handed = init_states_input(site, published_context(N))
    expect(
        handed == GRAPH_BS,
        f"init_states receives {handed}, not the decode sizes capture reads {GRAPH_BS}",
    )
    handed = init_states_input(site, published_context(None))
    expect(handed is None, f"stock adaptive now receives {handed}; it must keep upstream's input")

    clock = FakeClock()
    policy = policy_mod.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=N)
    worker, _, ctx = drive(site, policy, [], clock)
    expect(
        list(worker.captured) == [0],
        f"init_states built {sorted(worker.captured)}, expected steps=0",
    )
    expect(
        worker.captured[0].bs == [8, 16, 32] and worker.captured[0].backend == Backend.FULL,
        f"the steps=0 capture read {worker.captured[0]}, expected bs [8, 16, 32]",
    )
    restored = ctx.config_bag("exec").graph.cuda_graph_config.decode
    expect(restored.bs == GRAPH_BS, f"the capture list was not restored: {restored.bs}")

    above_all = policy_mod.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=max(GRAPH_BS))
    worker, _, ctx = drive(site, above_all, [], clock)
    expect(
        worker.captured[0].backend == Backend.DISABLED,
        "with no captured size above N the steps=0 state must capture no graphs",
    )
    expect(
        ctx.config_bag("exec").graph.cuda_graph_config.decode.backend == Backend.FULL,
        "decode graphs were not re-enabled after the steps=0 capture",
    )


def check_long_run(site: str, policy_mod) -> dict:
    """10,000 decode steps around N: bounded log, bounded memory, the hysteresis rule.
    Returns the figures it checked."""
    resume = policy_mod.RESUME_AFTER_STEPS
    clock = FakeClock()

    # A batch oscillating N+1, N every step switches once, then never resumes.
    hovering = [N + 1 if i % 2 == 0 else N for i in range(LONG_RUN)]
    policy = policy_mod.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=N)
    worker, trace, ctx = drive(site, policy, hovering, clock)
    switches = sum(1 for a, b in zip([STEPS, *trace], trace, strict=False) if a != b)
    expect(switches == 1, f"a batch hovering at N switched {switches} times in {LONG_RUN} steps")

    # A burst above N every (resume + 9) steps: drafting stops at each burst and
    # resumes exactly `resume` batches at or below N later.
    period = resume + 9
    bursty = [N + 2 if i % period == period - 1 else N - 1 for i in range(LONG_RUN)]
    snapshots = []

    def snapshot(i: int) -> None:
        if i in (999, LONG_RUN - 1):
            snapshots.append(tracemalloc.take_snapshot())

    tracemalloc.start()
    try:
        policy = policy_mod.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=N)
        worker, trace, ctx = drive(site, policy, bursty, clock, on_step=snapshot)
    finally:
        tracemalloc.stop()
    # This script's own records (the trace) grow by design; SGLang's must not.
    early, late = (snap.filter_traces([tracemalloc.Filter(False, __file__)]) for snap in snapshots)
    growth = sum(stat.size_diff for stat in late.compare_to(early, "filename"))
    expect(growth < 64 * 1024, f"memory grew by {growth} bytes over steps 1,000..10,000")

    for i, (bs, steps) in enumerate(zip(bursty, trace, strict=True)):
        if bs > N:
            expect(steps == 0, f"step {i}: batch {bs} > N drafted")
        elif steps == 0 and i >= resume and all(b <= N for b in bursty[i - resume + 1 : i + 1]):
            raise CheckError(f"step {i}: still not drafting after {resume} batches at or below N")
        elif steps == STEPS and i and trace[i - 1] == 0:
            calm = bursty[i - resume + 1 : i + 1]
            expect(
                len(calm) == resume and all(b <= N for b in calm) and bursty[i - resume] > N,
                f"step {i}: drafting resumed after a calm run other than {resume}",
            )
    switches = sum(1 for a, b in zip([STEPS, *trace], trace, strict=False) if a != b)
    bursts = sum(1 for b in bursty if b > N)
    expect(switches in (2 * bursts - 1, 2 * bursts), f"{switches} switches for {bursts} bursts")

    entries = [source for source, _ in ctx.overrides_log() if source == "adaptive_spec.restore"]
    expect(
        len(entries) <= 1,
        f"the override log holds {len(entries)} switch entries after {switches} switches",
    )
    expect(
        ctx.resolved_server_args_dict({})["speculative_num_steps"] == trace[-1],
        "/server_info's overlay no longer shows the current step count",
    )
    minutes = clock.now / 60.0
    expect(
        len(worker.log_lines) <= minutes + 2,
        f"{len(worker.log_lines)} switch log lines in {minutes:.1f} minutes of {switches} switches",
    )
    expect(
        any("more since the last line" in line for line in worker.log_lines),
        "the switch log does not count the switches it left out",
    )
    return {
        "steps": len(trace),
        "bursts": bursts,
        "switches": switches,
        "switch_log_entries": len(entries),
        "log_lines": len(worker.log_lines),
        "memory_growth_bytes": growth,
    }


def check(site: str) -> None:
    path = os.path.join(site, "sglang", "srt", "speculative", "spec_disable_policy.py")
    expect(os.path.isfile(path), f"missing {path}")
    _stub_packages(site)
    from sglang.srt.speculative import spec_disable_policy as policy_mod

    heavy = sorted(m for m in ("torch", "triton") if m in sys.modules)
    expect(not heavy, f"policy import pulled in {heavy}")
    check_policy(policy_mod)
    check_graph_pruning(site, policy_mod)
    check_long_run(site, policy_mod)


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
    except Exception as exc:  # an import or API change is a failure too
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
