"""Unit-test the batch-size threshold decision and its wiring into SGLang's adaptive controller.

Run as `<python> threshold_decision.py` with DEPLOYCTL_SITE=<site-packages holding sglang/>.
Stdlib only, no torch: `speculative/spec_disable_policy.py` and
`speculative/adaptive_runtime_state.py` import nothing heavy at runtime.
Exit 0 on success; otherwise one line on stderr and exit 1.
"""

from __future__ import annotations

import os
import sys
import types


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


class FakeWorker:
    """Implements the AdaptiveSpecWorker protocol the way EAGLEWorkerV2 does, minus the GPU."""

    def __init__(self, steps: int):
        self.speculative_num_steps = steps
        self.speculative_num_draft_tokens = steps + 1
        self.built: dict[int, list[int] | None] = {}
        self.switches: list[int] = []

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ):
        from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

        self.built[speculative_num_steps] = cuda_graph_bs
        return SpecRuntimeState(
            speculative_num_steps=speculative_num_steps,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
            draft_attn_backend=None,
            cuda_graph_runner=None,
            target_attn_backend=None,
            target_graph_runner=None,
            draft_extend_attn_backend=None,
            cuda_graph_runner_for_draft_extend=None,
        )

    def apply_runtime_state(self, state) -> None:
        if self.speculative_num_steps == state.speculative_num_steps:
            return
        self.speculative_num_steps = state.speculative_num_steps
        self.speculative_num_draft_tokens = state.speculative_num_draft_tokens
        self.switches.append(state.speculative_num_steps)


def check(site: str) -> None:
    path = os.path.join(site, "sglang", "srt", "speculative", "spec_disable_policy.py")
    expect(os.path.isfile(path), f"missing {path}")
    _stub_packages(site)
    from sglang.srt.speculative import spec_disable_policy as policy_mod
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState

    heavy = sorted(m for m in ("torch", "triton") if m in sys.modules)
    expect(not heavy, f"policy import pulled in {heavy}")

    should_speculate = policy_mod.should_speculate
    n = 5
    expect(should_speculate(n, n), "batch == N must speculate")
    expect(not should_speculate(n + 1, n), "batch == N+1 must run plain decode")
    expect(should_speculate(1, n), "batch 1 must speculate")
    expect(should_speculate(10_000, None), "threshold None must always speculate")
    sequence = [1, n, n + 1, n + 7, n + 1, n, n - 1, n + 1, n]
    got = [should_speculate(b, n) for b in sequence]
    want = [True, True, False, False, False, True, True, False, True]
    expect(got == want, f"decision over {sequence} was {got}, expected {want}")

    steps = 3
    policy = policy_mod.BatchThresholdSpecPolicy(num_steps=steps, threshold=n)
    expect(policy.candidate_steps == [0, steps], f"candidate_steps {policy.candidate_steps}")
    expect(policy.get_steps_for_batch(n) == steps, "N -> num_steps")
    expect(policy.get_steps_for_batch(n + 1) == 0, "N+1 -> 0 draft steps")
    expect(policy.on_verify_complete([0, 0, 0], 3) is None, "acceptance must not trigger switches")
    for bad in (0, -1, None):
        try:
            policy_mod.BatchThresholdSpecPolicy(num_steps=steps, threshold=bad)
        except ValueError:
            pass
        else:
            raise CheckError(f"threshold {bad!r} was accepted")

    # CUDA-graph batch sizes each state must capture (a batch pads up to the
    # smallest captured size that fits it).
    policy.set_cuda_graph_bs([1, 2, 4, 8, 16, 32])
    expect(
        policy.cuda_graph_bs_for_step(0) == [8, 16, 32],
        f"steps=0 graphs {policy.cuda_graph_bs_for_step(0)}",
    )
    expect(
        policy.cuda_graph_bs_for_step(steps) == [1, 2, 4, 8],
        f"steps>0 graphs {policy.cuda_graph_bs_for_step(steps)}",
    )
    exact = policy_mod.BatchThresholdSpecPolicy(num_steps=steps, threshold=8)
    exact.set_cuda_graph_bs([1, 2, 4, 8, 16, 32])
    expect(
        exact.cuda_graph_bs_for_step(steps) == [1, 2, 4, 8],
        "N on a captured size needs no larger graph",
    )
    expect(exact.cuda_graph_bs_for_step(0) == [16, 32], "steps=0 graphs above N=8")
    policy.set_cuda_graph_bs(None)
    expect(policy.cuda_graph_bs_for_step(0) is None, "graphs disabled -> None")

    # Drive SGLang's real AdaptiveController with the policy, as EAGLEWorkerV2 does.
    worker = FakeWorker(steps)
    controller = AdaptiveController(
        worker, policy_mod.BatchThresholdSpecPolicy(num_steps=steps, threshold=n)
    )
    controller.register(worker.build_adaptive_runtime_state(steps, steps + 1, cuda_graph_bs=None))
    worker.built.clear()
    controller.init_states(cuda_graph_bs=[1, 2, 4, 8, 16, 32])
    expect(
        list(worker.built) == [0],
        f"init_states built {sorted(worker.built)}, expected only steps=0",
    )
    expect(worker.built[0] == [8, 16, 32], f"steps=0 state captured {worker.built[0]}")
    expect(worker.speculative_num_steps == steps, "controller must start on the configured steps")
    trace = []
    for bs in (n, n + 1, n + 30, n, 1):
        controller.activate_step_by_batch(bs)
        trace.append(worker.speculative_num_steps)
        controller.on_verify_complete([0] * bs, batch_size=bs)
        expect(worker.speculative_num_steps == trace[-1], "verify feedback changed the step count")
    expect(trace == [steps, 0, 0, steps, steps], f"steps per batch {trace}")
    expect(worker.switches == [0, steps], f"state switches {worker.switches}")
    expect(isinstance(controller._states[0], SpecRuntimeState), "steps=0 state missing")


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
