"""tune --live buckets its samples by the replicas' own decode CUDA-graph sizes: SGLang pads a
batch to the next captured size and steps it at that size, so a server captured at 1, 4, 16,
32, 64 and 128 runs 17 to 32 requests alike. Checked against a real window on the H200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl.canary_stats import CUDA_GRAPH_SIZES, MIN_CELL, Judge, Sample
from deployctl.errors import UsageError
from deployctl.ops.tune.live import (
    SIDE,
    LiveCrossover,
    check_resumable,
    live_crossover,
    rejudge,
    sample_of,
    window_judge,
)
from deployctl.ops.tune.race import PolicyRace
from deployctl.ops.tune.search import speculative_graph_sizes
from deployctl.ops.tune.tuner import decode_graph_sizes
from deployctl.present.documents import live_record_json
from deployctl.remote.server_argv import CommandValues

REPO = Path(__file__).resolve().parent.parent
# A real tune --live window (scripts/gpu-threshold-check, phase live): two SGLang 0.5.17
# replicas of the 6.7 B known-acceptance pair (accept length 2) sharing one H200 at 0.35
# each behind sglang-router 0.3.2, EAGLE3 against none, CUDA graphs captured at the sizes
# below, a closed-loop load sweeping 2 to 256 streams through the router; 421 s, 415 samples.
WINDOW = REPO / "tests" / "data" / "real-sglang-0.5.17" / "live-window.json"
H200_ARGV = [
    "--speculative-algorithm", "EAGLE3", "--cuda-graph-max-bs-decode=128",
    "--max-running-requests=128", "--cuda-graph-bs-decode", "1", "4", "16", "32", "64", "128",
]  # fmt: skip
# The same pair alone on the GPU, swept at those levels (benchmarks/h200-threshold).
SWEEP = REPO / "benchmarks" / "h200-threshold" / "large-sweep.json"


def test_the_buckets_are_the_servers_list_else_sglangs_sizes_up_to_its_max() -> None:
    assert decode_graph_sizes(CommandValues(H200_ARGV)) == (1, 4, 16, 32, 64, 128)
    listed = ["--cuda-graph-bs-dec", "16", "4", "4", "--port", "1"]  # a prefix, unsorted
    assert decode_graph_sizes(CommandValues(listed)) == (4, 16)
    at_most = CommandValues(["--cuda-graph-max-bs-decode", "16"])
    assert decode_graph_sizes(at_most) == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
    assert decode_graph_sizes(CommandValues([])) == tuple(speculative_graph_sizes(256))
    # Without graphs, or without their padding, every batch size is its own.
    assert decode_graph_sizes(CommandValues([*H200_ARGV, "--disable-cuda-graph"])) is None
    assert decode_graph_sizes(CommandValues(["--disable-cuda-graph-padding"])) is None


def test_a_judge_and_a_race_bucket_samples_at_the_sizes_they_are_given() -> None:
    judge = Judge("throughput", 0.03, 0.95, 0, adjust_load=True, sizes=[16, 4])
    race = PolicyRace(["threshold", "off"], 0.95, 0, sizes=(4, 16))
    for i in range(8):
        for side, policy, value in (("candidate", "threshold", 90.0), ("control", "off", 100.0)):
            sample = Sample(5.0 + i % 3, value + i, 10, side)  # 5 to 7 running: bucket 16
            judge.add(side, sample)
            race.add(policy, sample)
    assert [b.bucket for b in judge.bucket_intervals(min_cell=MIN_CELL)] == [16]
    assert [row.bucket for row in race.result().buckets] == [16]
    default = Judge("throughput", 0.03, 0.95, 0, adjust_load=True)
    default.add("control", Sample(5.0, 100.0, 10, "x"))
    assert default.verdict().buckets[0].bucket == 5  # SGLang's own sizes: 5 is one


def judged(sizes: tuple[int, ...]) -> tuple[list[tuple[int, float]], LiveCrossover]:
    """The H200 window judged at `sizes`: each bucket's speculative ÷ plain, the crossover."""
    record = json.loads(WINDOW.read_text())
    judge = window_judge(record["confidence"], 20, sizes)
    for kept in record["samples"]:
        judge.add(SIDE[kept["side"]], sample_of(kept))
    # The window's end (its precision not reached): the fixed look at half the error rate.
    intervals = judge.bucket_intervals(0.5, MIN_CELL)
    crossover = live_crossover(intervals, sizes)
    return [(b.bucket, round(1 / b.ratio, 2)) for b in intervals], crossover


def test_the_h200_window_at_its_servers_sizes_brackets_the_swept_crossover() -> None:
    sizes = decode_graph_sizes(CommandValues(H200_ARGV))
    assert sizes is not None
    gains, crossover = judged(sizes)
    # Speculative ÷ plain output tokens/s per running request, as the sweep alone on the GPU
    # measured it (1.48, 1.40, 1.21, 1.05, 0.89, 0.81 at these levels).
    assert gains == [(1, 1.0), (4, 1.65), (16, 1.32), (32, 1.09), (64, 0.87), (128, 0.76)]
    assert crossover.wins == (4, 16) and crossover.losses == (64, 128)
    assert crossover.threshold == 16 and crossover.width == 2
    sweep = json.loads(SWEEP.read_text())
    assert (sweep["last_better"], sweep["first_worse"]) == (32, 64)
    # Within one bucket: the first loss is the sweep's; the last win one size below its own.
    assert crossover.first_loss == sweep["first_worse"]
    assert sizes.index(sweep["last_better"]) - sizes.index(crossover.threshold) == 1
    # SGLang's default sizes spread the same samples over 29 buckets, 4 of them with 5 a
    # side: the bracket was 2 to 40, nineteen buckets wide, and T = 2.
    gains, crossover = judged(CUDA_GRAPH_SIZES)
    assert [b for b, _ in gains] == [1, 2, 40, 48]
    assert (crossover.threshold, crossover.first_loss, crossover.width) == (2, 40, 19)


def test_a_kept_window_is_judged_again_at_the_sizes_it_kept() -> None:
    record = json.loads(WINDOW.read_text())
    assert "sizes" not in record  # kept before windows said theirs: SGLang's own sizes
    assert [b.bucket for b in rejudge(record)] == [1, 2, 40, 48]
    record["sizes"] = [1, 4, 16, 32, 64, 128]
    assert [b.bucket for b in rejudge(record)] == record["sizes"]
    shown = live_record_json(record)
    assert [b["bucket"] for b in shown["buckets"]] == record["sizes"]
    assert shown["sizes"] == shown["crossover"]["sizes"] == record["sizes"]


def test_a_window_is_resumed_only_at_the_sizes_its_samples_were_bucketed_by() -> None:
    record = json.loads(WINDOW.read_text())
    check_resumable(record, CUDA_GRAPH_SIZES)  # kept before windows said theirs: no sizes
    record["sizes"] = [128, 1, 4, 16, 32, 64]
    check_resumable(record, (1, 4, 16, 32, 64, 128))
    with pytest.raises(UsageError, match=r"bucketed by CUDA-graph sizes \[1, 4, 16, 32, 64, 128\]"):
        check_resumable(record, (1, 2, 4, 8, 16))


# The second H200 window (the same fleet and load, the code that buckets by the servers'
# sizes): as kept on the router's host, 205 + 210 samples; the window's own verdict: wins at
# 1, 4 and 16, a loss at 64, T = 16 (benchmarks/h200-threshold/live2-tune.json).
WINDOW_2 = REPO / "tests" / "data" / "real-sglang-0.5.17" / "live-window-2.json"


def test_a_window_that_ended_is_reported_as_its_end_look_judged_it() -> None:
    """Its --precision 1 not reached: the window's end was the fixed look at half the error
    rate. Its report is that look again (the same samples: no look more), not the always-
    valid intervals of a window still running, which decide no bucket here."""
    record = json.loads(WINDOW_2.read_text())
    assert "end_look" not in record  # kept before records said it: judged always-valid
    assert live_crossover(rejudge(record)).threshold is None
    record["end_look"] = {"always_valid": False, "error_share": 0.5}  # as windows keep it now
    shown = live_record_json(record)
    verdicts = {b["bucket"]: (b["gain"], b["verdict"]) for b in shown["buckets"]}
    assert verdicts == {
        1: (1.5555, "win"), 4: (1.5295, "win"), 16: (1.2376, "win"),
        32: (0.9423, "undecided"), 64: (0.8552, "loss"), 128: (0.9439, "undecided"),
    }  # fmt: skip
    assert (shown["crossover"]["last_win"], shown["crossover"]["first_loss"]) == (16, 64)
    assert shown["crossover"]["threshold"] == record["threshold"] == 16
    # The same samples while the window ran: a report is one look more, always-valid.
    record["state"] = "running"
    assert {b["verdict"] for b in live_record_json(record)["buckets"]} == {"undecided"}


# The third H200 window (the same fleet and load; samples as spans of three finished requests,
# not reads with any finish): 202 + 202 samples, T = 32 where window 2 said 16; the sweep alone
# on the GPU put the crossover between 32 and 64 (benchmarks/README.md, the window's table;
# the window's document is benchmarks/h200-threshold/live3-tune.json).
WINDOW_3 = REPO / "tests" / "data" / "real-sglang-0.5.17" / "live-window-3.json"


def test_the_window_sampled_by_spans_is_reported_as_it_decided_at_the_sweeps_crossover() -> None:
    record = json.loads(WINDOW_3.read_text())
    assert record["end_look"] == {"always_valid": False, "error_share": 0.5}
    shown = live_record_json(record)
    verdicts = {b["bucket"]: (round(b["gain"], 2), b["verdict"]) for b in shown["buckets"]}
    assert verdicts == {
        4: (1.42, "win"), 16: (1.36, "win"), 32: (1.16, "win"),
        64: (0.85, "loss"), 128: (0.65, "loss"),
    }  # fmt: skip
    assert (shown["crossover"]["last_win"], shown["crossover"]["first_loss"]) == (32, 64)
    assert shown["crossover"]["threshold"] == record["threshold"] == 32
