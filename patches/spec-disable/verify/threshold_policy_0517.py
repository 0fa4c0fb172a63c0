"""Check the 0.5.17 variant of spec-disable on the installed files, without torch.

Run as `<python> threshold_policy_0517.py` with DEPLOYCTL_SITE=<site-packages holding sglang/>.
0.5.17 declares its server arguments in one dataclass in `server_args.py` (no
`arg_groups/fields/`), its `AdaptiveController` builds its own policy, and it has no
`with_phase`, so the 0.5.23 verify scripts do not apply. This one checks, on the real files:
- `ServerArgs` declares `speculative_disable_batch_threshold: Optional[int]` in the `spec`
  namespace, and `handle_speculative_decoding` calls the validator after the dispatcher;
- the real policy module's decisions and hysteresis, and the sizes its steps=0 state captures;
- the real `AdaptiveController` (sglang.srt.utils stubbed: it imports torch) driven by the
  policy through a worker without a GPU: a burst above N switches to 0 steps at once and back
  after 32 calm batches, and the states it builds capture the pruned list for steps=0;
- `EAGLEWorkerV2` builds the controller with the policy, and its capture override writes the
  pruned list into `cuda_graph_config` and restores it.
Exit 0 on success; otherwise one line on stderr and exit 1.
"""

from __future__ import annotations

import ast
import os
import sys
import types

N, STEPS = 4, 3
GRAPH_BS = [1, 2, 4, 8, 12, 16, 24, 32]


class CheckError(Exception):
    pass


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckError(message)


def source(site: str, rel: str) -> str:
    with open(os.path.join(site, "sglang", "srt", rel), encoding="utf-8") as handle:
        return handle.read()


def check_declaration(site: str) -> None:
    tree = ast.parse(source(site, "server_args.py"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "speculative_disable_batch_threshold"
        ):
            text = ast.unparse(node.annotation)
            expect("Optional[int]" in text, f"the field is declared as {text}, not Optional[int]")
            expect('NS("spec")' in text or "NS('spec')" in text, "the field is not in NS('spec')")
            break
    else:
        raise CheckError("ServerArgs does not declare speculative_disable_batch_threshold")
    hook = ast.parse(source(site, "arg_groups/speculative_hook.py"))
    funcs = {n.name: n for n in hook.body if isinstance(n, ast.FunctionDef)}
    expect(
        "_validate_speculative_disable_batch_threshold" in funcs,
        "speculative_hook.py has no _validate_speculative_disable_batch_threshold",
    )
    last = funcs["handle_speculative_decoding"].body[-1]
    expect(
        "_validate_speculative_disable_batch_threshold" in ast.unparse(last),
        "handle_speculative_decoding does not end with the threshold's validation",
    )


def load_modules(site: str) -> tuple[types.ModuleType, types.ModuleType]:
    # Bare packages, so their heavy __init__ files (torch) are skipped.
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(site, *name.split("."))]
        sys.modules[name] = package
    utils = types.ModuleType("sglang.srt.utils")
    utils.log_info_on_rank0 = lambda logger, message: None  # type: ignore[attr-defined]
    sys.modules["sglang.srt.utils"] = utils
    sys.path.insert(0, site)
    import importlib

    policy = importlib.import_module("sglang.srt.speculative.spec_disable_policy")
    runtime = importlib.import_module("sglang.srt.speculative.adaptive_runtime_state")
    return policy, runtime


def check_policy(policy: types.ModuleType) -> None:
    p = policy.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=N)
    expect(p.candidate_steps == [0, STEPS], f"candidate steps {p.candidate_steps}")
    expect(p.get_steps_for_batch(N) == STEPS, "a batch of N stopped drafting")
    expect(p.get_steps_for_batch(N + 1) == 0, "a batch of N+1 kept drafting")
    calm = [p.get_steps_for_batch(1) for _ in range(policy.RESUME_AFTER_STEPS)]
    expect(calm[:-1] == [0] * (policy.RESUME_AFTER_STEPS - 1), "drafting resumed too early")
    expect(
        calm[-1] == STEPS, f"drafting did not resume after {policy.RESUME_AFTER_STEPS} calm batches"
    )
    p.set_cuda_graph_bs(GRAPH_BS)
    expect(
        p.cuda_graph_bs_for_step(0) == [8, 12, 16, 24, 32],
        f"steps=0 captures {p.cuda_graph_bs_for_step(0)}",
    )
    expect(p.cuda_graph_bs_for_step(STEPS) == GRAPH_BS, "the drafting state's list was pruned")


def check_controller(policy: types.ModuleType, runtime: types.ModuleType) -> None:
    class Worker:
        speculative_num_steps = STEPS

        def __init__(self) -> None:
            self.built: dict[int, list[int] | None] = {}
            self.switches: list[tuple[int, int]] = []

        def build_adaptive_runtime_state(
            self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
        ):
            self.built[speculative_num_steps] = cuda_graph_bs
            return types.SimpleNamespace(speculative_num_steps=speculative_num_steps)

        def apply_runtime_state(self, state) -> None:
            if state.speculative_num_steps != self.speculative_num_steps:
                self.switches.append((self.speculative_num_steps, state.speculative_num_steps))
                self.speculative_num_steps = state.speculative_num_steps

    worker = Worker()
    try:
        controller = runtime.AdaptiveController(
            worker, params=policy.BatchThresholdSpecPolicy(num_steps=STEPS, threshold=N)
        )
    except TypeError as exc:
        raise CheckError(f"AdaptiveController takes no policy: {exc}") from None
    controller.register(types.SimpleNamespace(speculative_num_steps=STEPS))
    controller.init_states(cuda_graph_bs=GRAPH_BS)
    expect(worker.built == {0: [8, 12, 16, 24, 32]}, f"states built: {worker.built}")
    for _ in range(10):  # a burst of 16, then 40 batches of 1
        controller.activate_step_by_batch(16)
        expect(worker.speculative_num_steps == 0, "a batch above N drafted")
        for _ in range(40):
            controller.activate_step_by_batch(1)
        expect(worker.speculative_num_steps == STEPS, "drafting did not resume after the burst")
    expect(len(worker.switches) == 20, f"{len(worker.switches)} switches for 10 bursts, not 20")


def check_worker(site: str) -> None:
    text = source(site, "speculative/eagle_worker_v2.py")
    expect("BatchThresholdSpecPolicy(" in text, "EAGLEWorkerV2 never builds the threshold policy")
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_override_worker_state":
            body = ast.unparse(node)
            expect(
                "cuda_graph_config=replace(" in body,
                "the capture override does not prune cuda_graph_config",
            )
            expect(
                "cuda_graph_config=backup[14]" in body,
                "the capture override does not restore cuda_graph_config",
            )
            return
    raise CheckError("eagle_worker_v2.py has no _override_worker_state")


def main() -> int:
    site = os.environ.get("DEPLOYCTL_SITE") or sys.exit("DEPLOYCTL_SITE is not set")
    try:
        check_declaration(site)
        policy, runtime = load_modules(site)
        check_policy(policy)
        check_controller(policy, runtime)
        check_worker(site)
    except (CheckError, ImportError, OSError) as exc:
        print(f"threshold_policy_0517: {exc}", file=sys.stderr)
        return 1
    print("threshold_policy_0517: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
