"""`tune --live` on two traffic mixes: the live crossover moves with what is served.

Stand-ins whose acceptance depends on the prompt's class (code-like prompts accept 4.5
tokens a speculative step, chat 1.3; any other prompt, as a synthetic bench's, 2.1), behind
the real router, under a mixed load whose concurrency sweeps. A plain step over b requests
takes 10 + 0.5 b ms; a speculative one 11.92 + 2.73 b ms. A mix's served accept length is
its tokens over its steps: 2.79 for 3 code requests to 1 chat, 1.58 for 1 to 3. So the
crossover, (10 a - 11.92) / (2.73 - 0.5 a), is 11.9 for the code-heavy mix and 2.0 for the
chat-heavy one, and a synthetic bench (a = 2.1, crossover 5.4) would have written T = 5, the
last level it measured a gain at: too low for the first (speculation gains 28 % at 6), too
high for the second (it loses 23 % at 5).

The window reads the replicas once a second, behind a router that balances by requests in
flight (with round robin the two replicas seldom share a bucket: 13 to 72 samples a bucket,
and neither crossover found in 3 minutes).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deployctl.canary_stats import CUDA_GRAPH_SIZES
from deployctl.ops.bench import Comparison, suggest_threshold
from tests.load_mix import CHAT_MATCH, CHAT_PROMPT, CODE_MATCH, CODE_PROMPT, LoadMix, PromptClass
from tests.test_tune_live import launched_fleet, templates

PLAIN_MS, PLAIN_PER_REQ_MS, SPEC_MS, SPEC_PER_REQ_MS = 10.0, 0.5, 11.92, 2.73
CODE, CHAT, OTHER = 4.5, 1.3, 2.1
KNOBS = {
    "startup_s": 0.05, "step_ms": PLAIN_MS, "per_req_ms": PLAIN_PER_REQ_MS,
    "spec_step_ms": SPEC_MS, "spec_per_req_ms": SPEC_PER_REQ_MS, "accept_len": OTHER,
    "accept_by_class": [{"match": CODE_MATCH, "accept_len": CODE},
                        {"match": CHAT_MATCH, "accept_len": CHAT}],
    "drain_s": 0.3,
}  # fmt: skip
TOKENS = 56
# The real router as a join-the-shortest-queue balancer: cache_aware balances by load when
# any two workers' requests in flight differ, and with a cache threshold no match exceeds, its
# ties go by tree size, not by content. Round robin leaves the slower replica more requests,
# so the two sides rarely share a bucket where they differ most (power_of_two, which would
# balance too, refuses to start without two workers, and deployctl starts the router first).
SHORTEST_QUEUE = {
    "router_policy": "cache_aware",
    "extra_args": ["--cache-threshold", "1.0", "--balance-abs-threshold", "0",
                   "--balance-rel-threshold", "1.0"],
}  # fmt: skip
# The concurrency through the router, stepped up; the router balances by requests in flight,
# so each replica holds about half: 2, 5, 6, 7 and 11. Either side of the synthetic T (5), 5
# (where the chat-heavy mix loses 23 %) and 6 (where the code-heavy one gains 28 %) are held
# longest. (At 9, 4.5 each, two windows matched bucket 5 in 50 samples and in none, and
# left the chat-heavy mix undecided there. Held 80 s at 6 each, beside a busy loop per core,
# the code-heavy mix's bucket 6 once read 1.15 over 101 samples, 1.00-1.32: undecided.)
SWEEP = [(15.0, 4), (80.0, 10), (120.0, 12), (25.0, 14), (15.0, 22)]


def served_accept(code: float, chat: float) -> float:
    """Tokens per request-step of a mix: each class's requests weighted by their steps."""
    steps = code * TOKENS / CODE + chat * TOKENS / CHAT
    return (code + chat) * TOKENS / steps


def crossover(accept: float) -> float:
    """The batch where a speculative step's tokens per request equal a plain step's."""
    return (PLAIN_MS * accept - SPEC_MS) / (SPEC_PER_REQ_MS - PLAIN_PER_REQ_MS * accept)


def synthetic_threshold() -> int:
    """What `bench --suggest-threshold` says of a bench whose prompts accept OTHER."""

    def curve(accept: float | None) -> dict[str, Any]:
        levels = []
        for c in (*range(1, 9), 10, 12, 16, 24, 32):
            step = (
                PLAIN_MS + PLAIN_PER_REQ_MS * c if accept is None else SPEC_MS + SPEC_PER_REQ_MS * c
            )
            levels.append(
                {"concurrency": c, "output_tokens_per_s": c * (accept or 1) * 1000 / step}
            )
        return {"levels": levels}

    found = suggest_threshold(
        Comparison(runs={"plain": curve(None), "spec": curve(OTHER)}), "plain", "spec"
    )
    assert found.threshold is not None
    return found.threshold


def neighbours(value: float) -> tuple[int, int]:
    """The CUDA-graph buckets either side of a crossover."""
    below = max(b for b in CUDA_GRAPH_SIZES if b <= value)
    return below, min(b for b in CUDA_GRAPH_SIZES if b > value)


def test_the_two_mixes_cross_over_either_side_of_the_synthetic_threshold() -> None:
    code, chat = crossover(served_accept(3, 1)), crossover(served_accept(1, 3))
    assert (round(served_accept(3, 1), 2), round(served_accept(1, 3), 2)) == (2.79, 1.58)
    assert (round(code, 1), round(chat, 1)) == (11.9, 2.0)
    assert chat < synthetic_threshold() == 5 < code


@pytest.mark.lab
@pytest.mark.window(minutes=5.5)
@pytest.mark.parametrize(
    ("weights", "verdict"),
    [((3, 1), "too low"), ((1, 3), "too high")],
    ids=["code-heavy", "chat-heavy"],
)
def test_a_live_window_finds_each_mixs_crossover_and_says_the_synthetic_t_is_wrong_for_it(
    hosts: Any, cli: Any, tmp_path: Path, weights: tuple[int, int], verdict: str
) -> None:
    true = crossover(served_accept(*weights))
    below, above = neighbours(true)
    synthetic = synthetic_threshold()
    inv, url = launched_fleet(
        hosts, cli, tmp_path, KNOBS, router_settings=SHORTEST_QUEUE, template="eagle3",
        threshold=synthetic,
    )  # fmt: skip
    replicas = ("r1", "r2")
    before = templates(cli, inv, strict=False)
    proc = cli.popen(
        "tune", "--live", "--no-promote", "-i", str(inv), "--json", "--interval", "1",
        "--max-duration", "300", "--min-samples", "20", "--drain-timeout", "10",
        "--timeout", "60",
    )  # fmt: skip
    # The sweep starts once both replicas serve the window's runs (the relaunch under way
    # takes tens of seconds on a loaded machine: the low loads would be lost).
    relaunched = False
    deadline = time.monotonic() + 120
    while not relaunched and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
        now = templates(cli, inv, strict=False)
        relaunched = all(now[n][0] != before[n][0] and now[n][1] == "ready" for n in replicas)
    assert relaunched and proc.poll() is None, (templates(cli, inv, strict=False), proc.poll())
    mix = [
        PromptClass("code", CODE_PROMPT, weights[0]),
        PromptClass("chat", CHAT_PROMPT, weights[1]),
    ]
    seed = 10 * weights[0] + weights[1]
    outcomes = LoadMix(url, mix, SWEEP, TOKENS, seed=seed, model="m").run()
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in err, err
    doc = json.loads(out)
    seen = {
        b["bucket"]: (b["verdict"], b["samples"], b["gain"], b["low"], b["high"])
        for b in doc["buckets"]
    }
    verdicts = {bucket: verdict for bucket, (verdict, *_) in seen.items()}
    said = (
        f"true crossover {true:.1f} ({below}-{above}); {doc['decision']}: {doc['reason']}; "
        f"crossover {doc['crossover']}; buckets {seen}; stderr {err[-1500:]}"
    )
    lost = [o.error for o in outcomes if not o.completed]
    assert outcomes and not lost, (lost[:3], said)
    assert doc["ok"] and proc.returncode == 0, said
    # Within one bucket: no win decided above the bucket past the crossover, no loss below
    # the bucket before it (the loads either side of T decide the verdict below).
    assert all(b <= above for b, v in verdicts.items() if v == "win"), said
    assert all(b >= below for b, v in verdicts.items() if v == "loss"), said
    # The synthetic bench's T against this traffic: wrong, and which way.
    assert doc["inventory_threshold"] == synthetic, said
    assert doc["inventory_verdict"] == verdict, said
    cli("stop", "-i", str(inv))
