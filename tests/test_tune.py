"""tune: baseline and unthrottled speculative sweeps, the crossover narrowed down, the tuned
run checked against the better of both, left serving.

The stand-in's decode model (tests/standin/README.md) gives analytic curves: a plain step over
b requests takes step_ms + per_req_ms * b for one token each, a speculative one
spec_step_ms + spec_per_req_ms * b for accept_len tokens each, so speculation wins while
b < (accept_len * step_ms - spec_step_ms) / (spec_per_req_ms - accept_len * per_req_ms).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deployctl.ops.bench import per_token_ms, with_figures
from deployctl.ops.tune import (
    Levels,
    LevelVerdict,
    Objective,
    Phase,
    PhaseRun,
    Search,
    TuneOptions,
    TuneResult,
    best_stable,
    envelope_ratios,
    judge,
    spaced,
    speculative_graph_sizes,
)
from deployctl.remote.measures import BenchLevel
from tests.conftest import CLI
from tests.sshd_hosts import STANDIN, SSHLab, TestHost
from tests.test_lifecycle import prepare


def crossover(model: dict[str, float]) -> float:
    step, per = model["step_ms"], model["per_req_ms"]
    spec_step, spec_per, accept = (
        model["spec_step_ms"],
        model["spec_per_req_ms"],
        model["accept_len"],
    )
    return (accept * step - spec_step) / (spec_per - accept * per)


def model_for(cross: float, scale: float = 1.0) -> dict[str, float]:
    """Plain 10 + 0.1 b ms a step, speculative 2 + x b ms for 3 tokens, crossing at `cross`:
    a steep crossing (about 13 % a level at 6.5, 3 % at 24.5), so a busy test machine's
    jitter does not move T; `scale` stretches every time (the crossover stays). Use an output
    length that is a multiple of 3 (every speculative step then brings 3 tokens, as the
    analytic curve assumes)."""
    return {"step_ms": 10.0 * scale, "per_req_ms": 0.1 * scale, "spec_step_ms": 2.0 * scale,
            "spec_per_req_ms": (0.3 + 28.0 / cross) * scale, "accept_len": 3}  # fmt: skip


# The lab tests' models step 3 times slower than model_for's times, with answers of 21
# tokens (a multiple of 3): a level takes about 1.3 s, with a third of the chunks a second.
# Past about 16 streams a 2-core machine cannot carry a plain server's one-token chunks at
# 10 ms a step (measured: the baseline fell 10-30 % below its curve at 25-32 streams, and T
# moved by up to 3; a loaded machine had the tune at 6.5 not hold, 0.82 of the better
# curve): the search tests bracket crossovers at 2.5 and 9, at 12 streams at most, and
# narrow them down with one round of splits (at 6.5 and 24.5, up to 32 streams and two
# rounds, they took 45 and 65 s).
SCALE = 3.0
OUTPUT_LEN = 21
# One request a stream where the tuned run's ratio is not pinned tight: a second round of
# a level's streams doubled its time. The search tests keep 2: with one, the tuned run's
# lowest level (one or 7 requests, judged on the median of 3 sweeps) measured 0.86-0.89 of
# the better curve on a machine at load 10-13 (min-ratio 0.9 there).
PER_STREAM = 1
# The tests that are not about the search itself take its shortest form: speculation wins
# at 4 by half and loses at 10 by a third (model_for(6.5)), and no launch is left to narrow
# that down, so T is 4 at once (the speculative server does not measure the split: the
# baseline's could not be compared with it).
QUICK = ("--concurrency", "4,10", "--max-launches", "2")
QUICK_MODEL = model_for(6.5, SCALE)
# A stopped stand-in exits at once (SGLang's drain has nothing in flight to finish here), and
# a started one is ready in 0.05 s (0.3 by default; a tune launches 3 to 5 times).
QUICK_STANDIN = {"drain_s": 0.0, "startup_s": 0.05}
# T within one measured level of the crossover at 2.5 (2 exactly: speculation wins there by
# 22 % and loses at 3 by 15 %). A busy machine slows the plain server's one-token chunks
# more than the speculative server's (measured in CI: 570 against 580 tok/s at 7, where the
# curves of model_for(6.5) give 654 against 613), so 3 can measure a win.
NEAR_2_5 = (1, 2, 3)


def level(concurrency: int, tokens_per_s: float) -> BenchLevel:
    spread = {"p50": 10.0, "p99": 12.0}
    return {
        "concurrency": concurrency, "prompts": concurrency, "completed": concurrency,
        "failed": 0, "errors": [], "duration_s": 1.0, "output_tokens": 16 * concurrency,
        "output_tokens_per_s": tokens_per_s, "requests_per_s": 1.0, "ttft_ms": spread,
        "itl_ms": spread, "e2e_ms": spread,
    }  # fmt: skip


def drive(
    search: Search, curves: dict[Phase, Any], limit: int = 40
) -> list[tuple[Phase, list[int]]]:
    """Run the search against curves (level -> tok/s, or a list of values taken in turn),
    alternating servers as tune does; return each measurement asked for."""
    asked: list[tuple[Phase, list[int]]] = []
    taken: dict[tuple[Phase, int], int] = {}
    up: Phase | None = None
    order = [Phase.BASELINE, Phase.SPECULATIVE]
    while len(asked) < limit:
        nxt = next((p for p in ([up] if up else []) + order if search.owed(p)), None)
        if nxt is None:
            return asked
        up = nxt
        while wanted := search.owed(nxt):
            asked.append((nxt, wanted))
            measured = []
            for c in wanted:
                value = curves[nxt](c)
                if isinstance(value, list):
                    i = taken.get((nxt, c), 0)
                    taken[(nxt, c)] = i + 1
                    value = value[min(i, len(value) - 1)]
                measured.append(level(c, value))
            search.add(nxt, measured)
        order = [p for p in order if p is not nxt] + [nxt]
    raise AssertionError(f"the search did not end: {asked}")


def analytic(model: dict[str, float]) -> dict[Phase, Any]:
    def plain(c: int) -> float:
        return c * 1000 / (model["step_ms"] + model["per_req_ms"] * c)

    def spec(c: int) -> float:
        return (
            c * model["accept_len"] * 1000 / (model["spec_step_ms"] + model["spec_per_req_ms"] * c)
        )

    return {Phase.BASELINE: plain, Phase.SPECULATIVE: spec}


# ---- the search, on curves -------------------------------------------------------------------


@pytest.mark.parametrize("cross", [6.5, 24.5, 41.5])
def test_the_search_narrows_the_crossover_to_adjacent_levels(cross: float) -> None:
    search = Search([1, 4, 16, 64])
    drive(search, analytic(model_for(cross)))
    assert search.threshold == int(cross)
    assert search.bracket() == (int(cross), int(cross) + 1)
    assert search.speculation == "up_to"
    # Far fewer levels than every integer up to the top one.
    measured = {c for p in search.samples.values() for c in p}
    assert len(measured) < 16


def test_adaptive_mode_narrows_to_adjacent_cuda_graph_sizes() -> None:
    levels = Levels(tuple(speculative_graph_sizes(256)))
    search = Search([1, 4, 16, 64], levels)
    drive(search, analytic(model_for(25.0)))
    # 24 wins, 26 is the next graph size (a batch of 25 pads to 26): T is a graph size.
    assert search.bracket() == (24, 26) and search.threshold == 24
    assert all(c in levels.graph_sizes for c in search.refined)


def test_a_tie_is_not_a_win() -> None:
    base = [level(8, 100.0)] * 3
    close = [level(8, v) for v in (99.5, 100.5, 101.0)]
    judged = judge(8, base, close, Objective(), noise=0.03, repeats=3)
    assert judged.verdict is LevelVerdict.TIE and judged.settled
    # Levels 1..4 win, 8 ties: T is 4, not 8.
    curves = {
        Phase.BASELINE: lambda c: 100.0 * c,
        Phase.SPECULATIVE: lambda c: 100.0 * c * (1.5 if c < 8 else 1.0),
    }
    search = Search([1, 4, 8], Levels((1, 4, 8)))  # switch points only at those: no refining
    drive(search, curves)
    assert search.threshold == 4 and search.bracket() == (4, 8)


def test_a_close_level_is_measured_again_and_its_spread_reported() -> None:
    curves = {
        Phase.BASELINE: lambda c: [100.0, 101.0, 99.0] if c == 4 else 50.0 * c,
        Phase.SPECULATIVE: lambda c: (
            [102.0, 104.0, 103.0] if c == 4 else (60.0 * c if c < 4 else 40.0 * c)
        ),
    }
    search = Search([1, 4, 16], Levels((1, 4, 16)))
    drive(search, curves)
    judged = search.judged()[4]
    assert judged.samples == {Phase.BASELINE: 3, Phase.SPECULATIVE: 3}
    assert judged.spread[Phase.BASELINE] == pytest.approx(0.02)
    # Every speculative sample beats every baseline one: a win, so T is 4.
    assert judged.verdict is LevelVerdict.WIN and search.threshold == 4


def rounded(
    concurrency: int, rounds: list[float], warmup_s: float | None = None, first: float | None = None
) -> BenchLevel:
    """A level whose rounds measured these tok/s (its throughput, their mean), after a
    warm-up of `warmup_s` whose first sample measured `first`."""
    measured = {**level(concurrency, sum(rounds) / len(rounds)), "rounds_tokens_per_s": rounds,
                "warmup_s": warmup_s, "first_sample_tokens_per_s": first}  # fmt: skip
    return with_figures(measured)  # type: ignore[arg-type]


# 10 % apart, past the 3 % noise, but each server's rounds spread wider than that (±15 %,
# ±13 %): one sample of each does not decide it.
WIDE_BASE = [90.0, 110.0, 95.0, 105.0]
WIDE_SPEC = [100.0, 120.0, 105.0, 115.0]


def test_a_level_inside_its_rounds_spread_is_measured_again_and_said() -> None:
    base, spec = rounded(4, WIDE_BASE), rounded(4, WIDE_SPEC)
    judged = judge(4, [base], [spec], Objective(), noise=0.03, repeats=3)
    assert judged.within_spread and not judged.settled
    assert judged.verdict is LevelVerdict.WIN  # so far
    assert judged.level_spread["baseline"] == pytest.approx(base["spread"])
    steady = judge(
        4, [rounded(4, [99.0, 101.0, 100.0, 100.0])], [rounded(4, [109.0, 111.0, 110.0, 110.0])],
        Objective(), noise=0.03, repeats=3,
    )  # fmt: skip
    assert not steady.within_spread and steady.settled
    # Measured up to --repeats times on each server: all their rounds together (12 each,
    # ±6 %) now decide it.
    search = Search([4], Levels((4,)))
    search.add(Phase.BASELINE, [base])
    search.add(Phase.SPECULATIVE, [spec])
    assert search.owed(Phase.BASELINE) == [4] and search.owed(Phase.SPECULATIVE) == [4]
    search.add(Phase.BASELINE, [base, base])
    search.add(Phase.SPECULATIVE, [spec, spec])
    assert search.owed(Phase.BASELINE) == [] and search.owed(Phase.SPECULATIVE) == []
    judged = search.judged()[4]
    assert judged.settled and not judged.within_spread and judged.verdict is LevelVerdict.WIN


def test_a_tune_record_says_how_warm_and_steady_each_level_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Per phase and level: the warm-up, its first sample against the level, the spread and
    drift of all the level's rounds; a level its samples do not decide is said, in the
    record (checked against the schema) and in the report."""
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.inventory import Host
    from deployctl.ops.tune import TuneReport, tune_record
    from deployctl.present.documents import tune_document
    from deployctl.present.views import TUNE
    from tests.json_contract import check_document

    # At 8 the baseline's rounds rise by 29 % from their first half to their second (±14 %).
    base = [
        rounded(4, WIDE_BASE, 2.5, 40.0),
        rounded(8, [100.0, 120.0, 105.0, 115.0, 140.0, 150.0, 145.0, 155.0], 3.0, 100.0),
    ]
    spec = [
        rounded(4, WIDE_SPEC, 1.5, 110.0),
        rounded(8, [60.0, 61.0, 60.0, 61.0]),
    ]
    result = TuneResult("alpha", None, "patch", TuneOptions([4, 8]))
    result.search = Search([4, 8], Levels((4, 8)))
    result.phases = {
        Phase.BASELINE: PhaseRun(Phase.BASELINE, "baseline", None, state="ready", measured=base),
        Phase.SPECULATIVE: PhaseRun(Phase.SPECULATIVE, "eagle3", None, state="ready",
                                    measured=spec),
    }  # fmt: skip
    result.search.add(Phase.BASELINE, base)
    result.search.add(Phase.SPECULATIVE, spec)
    record = tune_record(result)
    figures = record["phases"]["baseline"]["per_level"]["4"]
    assert figures["warmup_s"] == 2.5 and figures["rounds"] == 4
    assert figures["first_sample_bias"] == pytest.approx(-0.6)
    assert figures["spread"] is not None and not figures["drifting"]
    assert record["phases"]["speculative"]["per_level"]["4"]["first_sample_bias"] == 0.0
    verdict = record["verdicts"]["4"]
    assert verdict["within_spread"] and set(verdict["level_spread"]) == {"baseline", "speculative"}
    assert record["params"]["warmup"] is True
    report = TuneReport(FleetResult([HostResult(Host("alpha"), result)]))
    check_document(["tune", "--json"], {"schema": 1, **tune_document(report)})

    TUNE.human(report)
    out = capsys.readouterr().out
    assert "2.5 s, first -60.0 %; ±" in out and "1.5 s, first +0.0 %; ±" in out
    ratio = record["verdicts"]["4"]["speculative"] / record["verdicts"]["4"]["baseline"]
    assert (
        f"note: at 4 speculative ÷ baseline is {ratio:.3f}, inside the spread of their rounds"
        in out
    )
    assert (
        "note: baseline at 8: its rounds still drift (+29.1 % from the first half to the "
        "second, beyond their spread ±13.9 %)"
    ) in out
    assert "at 4: its rounds still drift" not in out and "note: at 8 speculative" not in out


def test_a_win_after_a_loss_is_measured_again_not_averaged_away() -> None:
    # Speculation wins at 1 and 2, loses at 4, wins again at 8 (a real bump), loses at 16.
    wins = {1: 2.0, 2: 1.5, 4: 0.8, 8: 1.3, 16: 0.5}
    curves = {Phase.BASELINE: lambda c: 100.0 * c, Phase.SPECULATIVE: lambda c: 100.0 * c * wins[c]}
    search = Search([1, 2, 4, 8, 16], Levels((1, 2, 4, 8, 16)))
    drive(search, curves)
    assert search.samples[Phase.BASELINE][8] and len(search.samples[Phase.SPECULATIVE][8]) == 3
    assert len(search.samples[Phase.SPECULATIVE][4]) == 3
    assert search.wins_again() == [8]
    assert search.threshold == 2  # the threshold can only turn speculation off above T


def test_speculation_that_never_or_always_wins_gives_no_threshold() -> None:
    never = Search([1, 4])
    drive(never, {Phase.BASELINE: lambda c: 200.0 * c, Phase.SPECULATIVE: lambda c: 100.0 * c})
    assert never.threshold is None and never.speculation == "never"
    assert never.bracket() == (0, 1)
    always = Search([1, 4])
    drive(always, {Phase.BASELINE: lambda c: 100.0 * c, Phase.SPECULATIVE: lambda c: 200.0 * c})
    assert always.threshold is None and always.speculation == "always"


def test_a_latency_bound_makes_the_one_that_meets_it_win() -> None:
    fast, slow = dict(level(4, 100.0)), dict(level(4, 300.0))
    fast["e2e_ms"] = {"p50": 160.0, "p99": 170.0}  # (160 - 10) / 15 = 10 ms a token
    slow["e2e_ms"] = {"p50": 460.0, "p99": 470.0}  # 30 ms a token
    bound = Objective("max_itl_ms", 20.0)
    assert bound.latency(fast) == pytest.approx(10.0)  # type: ignore[arg-type]
    # The baseline is faster in tok/s here but misses the bound: speculation wins.
    judged = judge(4, [slow], [fast], bound, 0.03, 3)  # type: ignore[list-item]
    assert judged.verdict is LevelVerdict.WIN


def test_with_no_launch_left_the_server_up_measures_only_what_the_other_measured() -> None:
    """--max-launches reached: the bracket's split measured on one server alone would never
    be compared (the tuned run measured it again, to no end), so it is not asked for; a
    level inside the noise still is (the other server measured it)."""
    search = Search([4, 10])
    curves = analytic(model_for(6.5))
    for phase in (Phase.BASELINE, Phase.SPECULATIVE):
        search.add(phase, [level(c, curves[phase](c)) for c in search.owed(phase)])
    split = search.owed(Phase.SPECULATIVE)
    assert split and all(4 < c < 10 for c in split)  # with a launch left: the split
    assert search.owed(Phase.SPECULATIVE, last_visit=True) == []
    search.stop()
    assert search.planned == [4, 10] and search.refined == []
    assert search.threshold == 4 and not search.narrowed
    close = Search([4])
    close.add(Phase.BASELINE, [level(4, 100.0)])
    close.add(Phase.SPECULATIVE, [level(4, 101.0)])
    assert close.owed(Phase.SPECULATIVE, last_visit=True) == [4]


def searched(base: dict[int, float], spec: dict[int, float]) -> Search:
    """A search whose two servers measured these throughputs (one sample a level)."""
    search = Search(sorted(base))
    search.add(Phase.BASELINE, [level(c, v) for c, v in base.items()])
    search.add(Phase.SPECULATIVE, [level(c, v) for c, v in spec.items()])
    return search


def test_a_phase_whose_server_crashed_is_never_the_stable_one_relaunched() -> None:
    # Speculation is ahead at the top level it measured, but its server crashed later.
    result = TuneResult("alpha", None, "adaptive", TuneOptions([4, 16]))
    result.search = searched({4: 100.0, 16: 300.0}, {4: 200.0, 16: 400.0})
    result.phases = {
        Phase.BASELINE: PhaseRun(Phase.BASELINE, "baseline", None, state="ready"),
        Phase.SPECULATIVE: PhaseRun(Phase.SPECULATIVE, "eagle3", None, state="crashed"),
    }
    assert best_stable(result) is Phase.BASELINE
    result.phases[Phase.SPECULATIVE].state = "ready"  # both stable: the faster one at 16
    assert best_stable(result) is Phase.SPECULATIVE


def test_a_re_measured_tuned_level_is_judged_on_its_median_not_its_last_sample() -> None:
    result = TuneResult("alpha", None, "adaptive", TuneOptions([4, 16]))
    result.search = searched({4: 100.0, 16: 300.0}, {4: 200.0, 16: 250.0})
    tuned = PhaseRun(Phase.TUNED, "eagle3", 4, state="ready")
    # 16 was low once (a slow sample) and measured again: 300, then 200, then 300.
    tuned.measured = [level(4, 200.0), *(level(16, v) for v in (300.0, 200.0, 300.0))]
    result.phases = {Phase.TUNED: tuned}
    assert envelope_ratios(result) == {4: 1.0, 16: 1.0}
    tuned.measured.append(level(16, 150.0))  # now 300, 200, 300, 150: the median is 250
    assert envelope_ratios(result)[16] == pytest.approx(250.0 / 300.0)


def test_split_points_and_graph_sizes() -> None:
    assert spaced(list(range(5, 16)), 3) == [7, 10, 13]
    assert spaced([5, 6], 3) == [5, 6]
    sizes = speculative_graph_sizes(160)
    assert sizes[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12] and sizes[-2:] == [152, 160]
    assert Levels(tuple(sizes)).snap(25) == 24 and Levels(tuple(sizes)).snap(200) == 200


# ---- over a real sshd host, with the stand-in --------------------------------------------------
# No test stops what it launched: the next test's `hosts` reset ends every process of each
# host's user (a `stop` was 1-2 s a test).


def verdicts(entry: dict[str, Any]) -> str:
    """The record's comparisons, one line per level, for a failing assertion."""
    return "\n".join(
        f"{c}: {v['verdict']} {v['baseline']:.0f} vs {v['speculative']:.0f} {v['samples']}"
        for c, v in sorted(entry["verdicts"].items(), key=lambda item: int(item[0]))
    )


def status_of(cli: CLI, inv: Path, host: str) -> dict[str, Any]:
    """What `status --json` says of the host's current run."""
    entry: dict[str, Any] = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"][
        host
    ]
    return entry


def assert_put_back(
    cli: CLI, inv: Path, host: TestHost, entry: dict[str, Any], before: str, template: str
) -> None:
    """What serves after the tune is a relaunch of `before` (its template, no threshold)."""
    status = status_of(cli, inv, host.name)
    assert status["run"] == entry["serving"] and status["state"] == "ready"
    record = json.loads((host.home / ".deployctl" / "runs" / f"{status['run']}.json").read_text())
    assert record["restart_of"] == before and record["template"] == template
    assert record["threshold"] is None


def tune_json(
    cli: CLI, inv: Path, *extra: str, output_len: int = OUTPUT_LEN, per_stream: int = PER_STREAM
) -> tuple[int, dict[str, Any], str]:
    result = cli(
        "tune", "-i", str(inv), "--json", "--input-len", "8", "--output-len", str(output_len),
        "--requests-per-stream", str(per_stream), "--timeout", "60", *extra, timeout=600,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


@pytest.mark.long
def test_tune_finds_the_crossover_and_leaves_the_tuned_run_serving(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    from tests.sglang_wheel import install_on

    model = model_for(2.5, SCALE)
    alpha = hosts.hosts["alpha"]
    variables = {**prepare(alpha, tp=1, **model, **QUICK_STANDIN), "template": "baseline"}
    variables["python"] = install_on(alpha, sglang_template, standin=STANDIN)
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    # 1 and 4 bracket the crossover and one round of splits, 2 and 3, narrows it down: 4
    # launches and 12 levels at 4 streams at most (4,12 around 6.5 took 5 and 18, 12 being
    # where a loss was clear: 9 measured a win on a machine at load 30). --min-ratio 0.8:
    # the tuned run is measured minutes after the curves it is held to, and a loaded machine
    # moves in between; it measured 0.94 at 5 once, and 0.847 at 1 (the median of its 3
    # sweeps) beside a busy loop per core. The ratio's own check is
    # test_a_tune_below_min_ratio_at_one_level_does_not_hold.
    code, doc, err = tune_json(cli, inv, "--concurrency", "1,4", "--min-ratio", "0.8", per_stream=2)
    entry = doc["hosts"]["alpha"]
    assert code == 0, (err, entry["envelope_ratio"], verdicts(entry))
    t = entry["threshold"]
    assert t in NEAR_2_5, verdicts(entry)
    assert entry["outcome"] == "tuned" and entry["held"], verdicts(entry)
    ratios = entry["envelope_ratio"]
    assert min(ratios.values()) >= 0.8, f"envelope ratios {ratios}, bound 0.8"
    assert entry["serving"] == entry["phases"]["tuned"]["run"] == f"eagle3_t{t}_v1"
    assert entry["patches"] == ["spec-disable 1.2.0 (applied)"]
    # Narrowed to adjacent levels: T and the level above it were both measured.
    assert {t, t + 1} - {1, 4} <= set(entry["refined_levels"])
    status = status_of(cli, inv, "alpha")
    assert status["run"] == f"eagle3_t{t}_v1" and status["state"] == "ready"
    kept = Path(entry["phases"]["baseline"]["sweeps"][0])
    assert kept.is_file()
    record = alpha.home / ".deployctl" / "tunes" / "1.json"
    assert json.loads(record.read_text())["threshold"] == t


def adaptive_host(
    lab: SSHLab, name: str, model: dict[str, float], **knobs: object
) -> dict[str, object]:
    """A stand-in host in adaptive threshold mode: stock SGLang's flags, no patch to apply."""
    return {**prepare(lab.hosts[name], tp=1, **model, **QUICK_STANDIN, **knobs),
            "template": "baseline", "threshold_mode": "adaptive"}  # fmt: skip


@pytest.mark.long
def test_tune_in_adaptive_mode_finds_a_crossover_near_9_at_cuda_graph_sizes(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    model = model_for(9.0, SCALE)
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["bravo"], {"bravo": adaptive_host(hosts, "bravo", model)}
    )
    # 7 and 12 bracket the crossover (12 a clear loss: 18 %). The CUDA-graph sizes between
    # them are 8 and 10 (9 pads to 10, 11 to 12): one round of splits measures the two, where
    # every batch size (patch mode) would split 8..11 at 8, 9 and 10. --min-ratio 0.9: a
    # loaded 2-core machine moves the plain server's curve between two sweeps (CI once saw a
    # tune at 16-32 streams not hold at 0.95).
    code, doc, err = tune_json(
        cli, inv, "--concurrency", "7,12", "--min-ratio", "0.9", per_stream=2
    )
    entry = doc["hosts"]["bravo"]
    assert code == 0, (err, entry["envelope_ratio"], verdicts(entry))
    sizes = speculative_graph_sizes(256)
    # Within one measured level of the analytic crossover (9, a tie: 8 wins by 11 %, 10 loses
    # by 9 %), and a CUDA-graph size: 8, or the size on either side (CI measured 612 against
    # 634 tok/s at 26 where the curves gave 688 against 657: a busy machine slows the plain
    # server's one-token chunks most).
    assert entry["threshold"] in (7, 8, 10), verdicts(entry)
    assert entry["threshold"] in sizes and set(entry["refined_levels"]) <= set(sizes)
    ratios = entry["envelope_ratio"]
    assert entry["held"] and min(ratios.values()) >= 0.9, f"envelope ratios {ratios}, bound 0.9"
    assert entry["threshold_mode"] == "adaptive" and entry["patches"] == []
    run = entry["serving"]
    status = status_of(cli, inv, "bravo")
    assert status["run"] == run and status["state"] == "ready"


@pytest.mark.long
def test_tune_measures_each_level_warm_so_a_cold_first_phase_moves_nothing(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The stand-in's `cold` knob kept across launches (as Triton's cache on disk): on each
    host, the first 15 decode steps at each batch size take 3 times longer, so the first
    phase, the baseline, pays them. Without a warm-up (bravo) 15 of its answers' 21 tokens
    are cold: it reads 0.4 of its curve, speculation seems to win at 10 too (where it has
    0.69 of the baseline's), and tune calls for no threshold. With the warm-up (alpha, the
    default) each level's warm-up pays them: T is 4, as the curves say, and the baseline's
    cold first samples are reported. The two tunes run side by side."""
    cold = {"factor": 3.0, "steps": 15, "persist": True}
    host_vars = {n: adaptive_host(hosts, n, QUICK_MODEL, cold=cold) for n in ("alpha", "bravo")}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"], host_vars)
    # --min-ratio 0: what is pinned here is the decision, not the tuned run's throughput.
    flags = ["--json", "--input-len", "8", "--output-len", str(OUTPUT_LEN),
             "--requests-per-stream", str(PER_STREAM), "--timeout", "60", *QUICK,
             "--min-ratio", "0"]  # fmt: skip
    unwarmed = cli.popen("tune", "-i", str(inv), "-H", "bravo", "--no-warmup", *flags)
    code, doc, err = tune_json(cli, inv, "-H", "alpha", *QUICK, "--min-ratio", "0")
    out, cold_err = unwarmed.communicate(timeout=600)
    entry = doc["hosts"]["alpha"]
    assert code == 0, (err, json.dumps(entry)[:3000])
    assert entry["threshold"] == 4 and entry["speculation"] == "up_to", verdicts(entry)
    assert entry["params"]["warmup"] is True
    for phase in ("baseline", "speculative", "tuned"):
        for c, figures in entry["phases"][phase]["per_level"].items():
            assert figures["warmup_s"] > 0, (phase, c, figures)
    baseline = entry["phases"]["baseline"]["per_level"]
    assert baseline["4"]["first_sample_bias"] < -0.4 and baseline["10"]["first_sample_bias"] < -0.4

    entry = json.loads(out)["hosts"]["bravo"]
    assert unwarmed.returncode == 0, (cold_err, json.dumps(entry)[:3000])
    assert entry["speculation"] == "always" and entry["threshold"] is None, verdicts(entry)
    assert entry["params"]["warmup"] is False
    assert entry["phases"]["baseline"]["per_level"]["10"]["warmup_s"] is None


@pytest.mark.long
def test_a_tuned_server_that_crashes_over_t_is_replaced_by_the_best_stable_one(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The seeds' failure: the first batch over T crashes with the 160-vs-2 tensor mismatch."""
    model = QUICK_MODEL
    variables = adaptive_host(hosts, "charlie", model, crash="above_threshold")
    inv = hosts.inventory(tmp_path / "inv.yml", ["charlie"], {"charlie": variables})
    code, doc, err = tune_json(cli, inv, *QUICK)
    entry = doc["hosts"]["charlie"]
    assert code == 1, (err, json.dumps(entry)[:3000])
    assert entry["outcome"] == "crashed" and entry["threshold"] == 4, verdicts(entry)
    assert entry["phases"]["tuned"]["state"] == "crashed"
    # No launch was left for the baseline: the speculative server measured no split.
    assert set(entry["phases"]["speculative"]["samples"]) == {"4", "10"}
    assert entry["refined_levels"] == [] and entry["narrowed"] is False
    assert entry["min_ratio"] == 0.95  # the default
    crash = entry["crash"]
    assert crash["exception"] == "RuntimeError" and "(160) must match" in crash["message"]
    assert crash["hint"]
    # The best stable configuration, without a threshold: at 10 the baseline is ahead.
    serving = entry["serving"]
    assert serving is not None and serving.startswith("baseline_v")
    status = status_of(cli, inv, "charlie")
    assert status["run"] == serving and status["state"] == "ready"
    # The kept record shows it again, crash report and hint included.
    shown = cli("tune", "-i", str(inv), "--report")
    assert shown.returncode == 0  # the record was shown
    assert "RuntimeError: The size of tensor a (160)" in shown.stderr
    assert crash["hint"].split("\n")[0][:40] in shown.stderr
    assert f"serving: {serving}" in shown.stdout


@pytest.mark.long
def test_keep_none_after_a_crash_puts_back_the_run_that_served_before(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """Not the best stable configuration (the baseline at 10): the speculative run that
    served before the tune, as --keep none promises."""
    variables = adaptive_host(hosts, "bravo", QUICK_MODEL, crash="above_threshold")
    inv = hosts.inventory(tmp_path / "inv.yml", ["bravo"], {"bravo": variables})
    launched = cli("launch", "-i", str(inv), "-t", "eagle3", "--json", "--timeout", "60")
    before = json.loads(launched.stdout)["hosts"]["bravo"]["run"]
    assert before.startswith("eagle3_v"), launched.stderr
    code, doc, err = tune_json(cli, inv, *QUICK, "--keep", "none")
    entry = doc["hosts"]["bravo"]
    assert code == 1 and entry["outcome"] == "crashed", (err, json.dumps(entry)[:3000])
    assert_put_back(cli, inv, hosts.hosts["bravo"], entry, before, "eagle3")


def tune_falling_short(
    cli: CLI, inv: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """QUICK's tune of alpha at --min-ratio 0.8, which must not hold (exit 1, no traceback),
    its human output, and its kept record."""
    result = cli(
        "tune", "-i", str(inv), "--input-len", "8", "--output-len", str(OUTPUT_LEN),
        "--requests-per-stream", str(PER_STREAM), "--timeout", "60", "--min-ratio", "0.8", *QUICK,
        timeout=600,
    )  # fmt: skip
    shown = cli("tune", "-i", str(inv), "--report", "--json")
    entry: dict[str, Any] = json.loads(shown.stdout)["hosts"]["alpha"]["record"]
    said = (entry["envelope_ratio"], entry["phases"], result.stdout, result.stderr)
    assert result.returncode == 1, said
    assert "Traceback" not in result.stderr
    return result, entry


@pytest.mark.long
def test_a_tune_below_min_ratio_at_one_level_does_not_hold(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The tuned run's speculative steps (up to T = 4) take 2.5 times longer: at 4 it falls
    below both curves (about 0.4 of the better), above T it keeps up. One level short is
    enough: exit 1, and no inventory line is offered. --min-ratio 0.8: a loaded machine
    measured the plain steps above T at 0.90 of the baseline's (the median of three samples).
    Not 1.5 times (0.67): the better curve is one sample, and at load 10-16 the speculative
    one measured 14-20 % under its curve, which lifted the ratio at 4 to 0.74 here and to
    0.8 or more in two CI runs (exit 0)."""
    model = QUICK_MODEL
    variables = adaptive_host(hosts, "alpha", model, threshold_slowdown=2.5)
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    result, entry = tune_falling_short(cli, inv)
    ratios = entry["envelope_ratio"]
    assert "the tuned run fell below 0.8 of the better curve at concurrency 4" in result.stderr
    assert "keep it:" not in result.stdout and "threshold: 4" not in result.stdout
    assert entry["outcome"] == "tuned" and entry["held"] is False
    assert ratios["4"] < 0.8 <= ratios["10"], (
        f"envelope ratios {ratios}, bound 0.8 between 4 and 10"
    )
    # The tuned run measured the levels compared, not the split no launch was left for.
    assert set(entry["phases"]["tuned"]["samples"]) == {"4", "10"}


@pytest.mark.long
def test_a_tuned_run_short_above_t_in_patch_mode_is_named_the_off_states_cost_not_remeasured(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    """Real 0.5.17 patched with a threshold still verifies through the speculative worker
    above T (an H200: 0.59 of a plain server's throughput at 64 streams). The stand-in's
    `off_state_slowdown` 1.8 makes the tuned run's plain steps above T = 4 take 1.8 times
    longer: at 10 it reads about 0.56 of the baseline, at 4 it drafts as the speculative
    sweep did. tune says the shortfall is the off state's cost and offers the baseline."""
    from tests.sglang_wheel import install_on

    alpha = hosts.hosts["alpha"]
    variables = {**prepare(alpha, tp=1, **QUICK_MODEL, **QUICK_STANDIN, off_state_slowdown=1.8),
                 "template": "baseline"}  # fmt: skip
    variables["python"] = install_on(alpha, sglang_template, standin=STANDIN)
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    result, entry = tune_falling_short(cli, inv)
    ratios = entry["envelope_ratio"]
    assert entry["threshold_mode"] == "patch" and entry["threshold"] == 4, verdicts(entry)
    assert ratios["10"] < 0.8, f"envelope ratios {ratios}, bound 0.8 at 10"
    # Measured once there: more samples do not cure the off path (on the H200 each cost a
    # level's bench and ran a tune past its device call).
    assert len(entry["phases"]["tuned"]["samples"]["10"]) == 1, entry["phases"]["tuned"]
    assert (
        "above its threshold 4 the tuned run fell below 0.8 of the better curve at "
        "concurrency 10 (" in result.stderr
    ), result.stderr
    assert "(tune --keep baseline)" in result.stderr
    assert "keep it:" not in result.stdout


def test_ctrl_c_puts_back_the_run_that_was_serving(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    """And two tunes of one deployment: the second is refused while the first holds its lock."""
    import signal
    import socket
    import time

    model = QUICK_MODEL
    delta = hosts.hosts["delta"]
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["delta"], {"delta": adaptive_host(hosts, "delta", model)}
    )
    launched = cli("launch", "-i", str(inv), "--json", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr
    before = json.loads(launched.stdout)["hosts"]["delta"]["run"]
    # A tune lock whose holder died (no such pid on this machine: above pid_max) does not hold.
    lock = delta.home / ".deployctl" / "tune-lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 1 << 22,
                                "user": "x", "op": "tune", "expires": time.time() + 3600,
                                "token": "dead"}))  # fmt: skip
    tune = cli.popen(
        "tune", "-i", str(inv), "--json", "--input-len", "8", "--output-len", str(OUTPUT_LEN),
        "--requests-per-stream", str(PER_STREAM), "--timeout", "60", *QUICK,
    )  # fmt: skip
    runs = delta.home / ".deployctl" / "runs"
    deadline = time.monotonic() + 60
    while not list(runs.glob("baseline_v*.bench")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the baseline phase has measured (the run before it has no sweep)
    # A second tune of the deployment meanwhile is refused, naming the first; nothing changes.
    second = cli("tune", "-i", str(inv), "--concurrency", "1,4", "--json")
    refused = json.loads(second.stdout)["hosts"]["delta"]
    assert second.returncode == 1 and refused["ok"] is False
    assert f"another deployctl tune of it is in progress (pid {tune.pid} " in refused["error"]
    tune.send_signal(signal.SIGINT)
    out, err = tune.communicate(timeout=120)
    assert tune.returncode == 130, err
    doc = json.loads(out)
    entry = doc["hosts"]["delta"]
    assert doc["interrupted"] and entry["outcome"] == "interrupted"
    assert entry["previous"] == before
    assert_put_back(cli, inv, delta, entry, before, "baseline")


def test_a_second_ctrl_c_during_a_start_leaves_at_once(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """rollout's twin: tests/test_rollout.py (the driver alone: tests/test_driver.py)."""
    from tests.test_rollout import interrupt_twice_during_a_start

    slow = {**adaptive_host(hosts, "delta", model_for(6.5)), "template": "baseline"}
    (Path(str(slow["model_path"])) / "standin.json").write_text(json.dumps({"startup_s": 40}))
    inv = hosts.inventory(tmp_path / "inv.yml", ["delta"], {"delta": slow})
    tune = cli.popen("tune", "-i", str(inv), "--concurrency", "1,4", "--timeout", "120")
    runs = hosts.hosts["delta"].home / ".deployctl" / "runs"
    # the baseline phase is starting (40 s to its ready line)
    interrupt_twice_during_a_start(cli, inv, tune, runs / "baseline_v*.json")


def test_keep_none_leaves_the_deployment_as_tune_found_it(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    model = QUICK_MODEL
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha"], {"alpha": adaptive_host(hosts, "alpha", model)}
    )
    launched = cli("launch", "-i", str(inv), "--json", "--timeout", "60")
    before = json.loads(launched.stdout)["hosts"]["alpha"]["run"]
    # Speculation wins at both levels: no threshold is needed, the tuned run speculates.
    # --min-ratio 0: the tuned run is the speculative phase's configuration measured again,
    # and a loaded machine had it at 0.94 of itself (twice); what is pinned here is --keep.
    code, doc, err = tune_json(
        cli, inv, "--concurrency", "1,2", "--keep", "none", "--min-ratio", "0"
    )
    entry = doc["hosts"]["alpha"]
    assert code == 0, (err, json.dumps(entry)[:3000])
    assert entry["threshold"] is None and entry["speculation"] == "always"
    assert entry["phases"]["tuned"]["template"] == "eagle3"
    assert entry["previous"] == before and entry["serving"] not in (None, before)
    assert_put_back(cli, inv, hosts.hosts["alpha"], entry, before, "baseline")


def tune_with_host_away(
    cli: CLI, inv: Path, host: TestHost, gone: Callable[[], bool], seconds: float, *extra: str
) -> tuple[int, dict[str, Any], str]:
    """`tune_json` with QUICK, the host's sshd (and tune's session with it) gone for
    `seconds` as soon as `gone()` says so."""
    import threading
    import time

    def away() -> None:
        deadline = time.monotonic() + 90
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        host.go_away()
        time.sleep(seconds)
        host.start()

    dropper = threading.Thread(target=away)
    dropper.start()
    try:
        return tune_json(cli, inv, *QUICK, *extra)
    finally:
        dropper.join()
        host.ensure_running()


def measuring(host: TestHost, run: str) -> Callable[[], bool]:
    """A run whose name starts with `run` has been sent its first benchmark request (its
    access line is in its log): a level is being measured on it."""

    def now() -> bool:
        return any(
            '"POST /v1/completions' in log.read_text(errors="replace")
            for log in (host.home / "logs").glob(f"{run}*.log")
        )

    return now


@pytest.mark.long
def test_a_connection_lost_past_the_retry_window_says_what_serves_and_keeps_the_record(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """sshd is gone, while the baseline phase measures, for longer than stopping tune's run
    retries (--reconnect-window 5: tries at 0, 1, 3 and 5 s): the baseline phase's server
    still serves. Once the host answers again (8 s, within the second window, that of
    reading what serves: tries at 5, 6, 8 and 10 s), tune says so and keeps its record
    there."""
    charlie = hosts.hosts["charlie"]
    variables = adaptive_host(hosts, "charlie", QUICK_MODEL)
    inv = hosts.inventory(tmp_path / "inv.yml", ["charlie"], {"charlie": variables})
    code, doc, err = tune_with_host_away(
        cli, inv, charlie, measuring(charlie, "baseline_v"), 8, "--reconnect-window", "5"
    )
    entry = doc["hosts"]["charlie"]
    assert code == 1 and entry["outcome"] == "failed", (err, json.dumps(entry)[:3000])
    baseline = entry["phases"]["baseline"]
    assert entry["serving"] == baseline["run"] and entry["serving_known"], entry["outcome_note"]
    assert f"the host answered again: {baseline['run']} serving" in entry["outcome_note"]
    # Lost under the sweep in flight: none of its levels was kept, no other phase was begun.
    assert baseline["samples"] == {} and list(entry["phases"]) == ["baseline"], entry["phases"]
    status = status_of(cli, inv, "charlie")
    assert status["run"] == baseline["run"] and status["state"] == "ready"
    kept = json.loads((charlie.home / ".deployctl" / "tunes" / "1.json").read_text())
    assert kept["serving"] == baseline["run"] and kept["outcome"] == "failed"


@pytest.mark.long
def test_a_lost_connection_stops_the_tune_and_puts_back_the_previous_run(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    model = QUICK_MODEL
    bravo = hosts.hosts["bravo"]
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["bravo"], {"bravo": adaptive_host(hosts, "bravo", model)}
    )
    before = json.loads(cli("launch", "-i", str(inv), "--json", "--timeout", "60").stdout)
    runs = bravo.home / ".deployctl" / "runs"
    # Gone once the speculative phase has measured (as the tuned run's launch begins, most
    # often): the launch lock it took cannot be given back, and the put-back's launch breaks
    # it (tune's own; it refused the put-back, in 3 runs of 4). Back after 2 s: before
    # putting back's third try (at 3 s).
    code, doc, err = tune_with_host_away(
        cli, inv, bravo, lambda: any(runs.glob("eagle3_v*.bench")), 2
    )
    entry = doc["hosts"]["bravo"]
    assert code == 1, (err, json.dumps(entry)[:3000])
    # Refused when tune connects again, lost under a call in flight, or reset under one (a
    # machine at load 12): where it was then.
    lost = ("Connection refused", "the SSH connection was lost", "Connection reset by peer")
    assert entry["outcome"] == "failed", (err, json.dumps(entry)[:3000])
    assert any(w in entry["outcome_note"] for w in lost), (err, json.dumps(entry)[:3000])
    assert entry["previous"] == before["hosts"]["bravo"]["run"]
    status = status_of(cli, inv, "bravo")
    assert status["run"] == entry["serving"] and status["state"] == "ready"
    assert status["run"].startswith("baseline_v")


def test_a_replacement_refused_by_its_preflight_stops_nothing(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """tune's phases, restart and watch replace a run through one step: a plan refused (here
    its model folder is gone) is refused before the serving run is stopped."""
    import shutil

    alpha = hosts.hosts["alpha"]
    variables = {**prepare(alpha, tp=1), "template": "baseline"}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    launched = cli("launch", "-i", str(inv), "--json", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr
    before = json.loads(launched.stdout)["hosts"]["alpha"]["run"]
    # The running server has read it already (the next test's reset clears the home).
    shutil.move(alpha.home / "model", alpha.home / "model-moved")
    restarted = cli("restart", "-i", str(inv), "--timeout", "60")
    assert restarted.returncode == 1
    assert f"{alpha.home}/model does not exist on alpha" in restarted.stderr
    status = status_of(cli, inv, "alpha")
    assert status["run"] == before and status["state"] == "ready"


@pytest.mark.long
def test_a_worker_behind_a_router_is_drained_as_rollout_does_and_loses_no_request(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """Each of tune's replacements takes w1 out of the real router, waits for its requests
    to finish, and adds the new run once ready; w2 serves meanwhile. Streamed load through
    the router (answers of 50 tokens: 1 s each, 3 times the stand-in's own drain after
    SIGTERM; checked: --drain-timeout 0 cuts some) loses nothing."""
    from tests.test_rollout import Load
    from tests.test_router import fleet

    knobs = {"step_ms": 20.0, "per_req_ms": 0.5, "drain_s": 0.3, "startup_s": 0.05}
    inv, table = fleet(hosts, tmp_path, workers=2, knobs=knobs)
    launched = cli("launch", "-i", str(inv), "--timeout", "60")
    assert launched.returncode == 0, launched.stderr
    # Speculation wins at 1 and 2 with these knobs: baseline, speculative, tuned: 3 swaps.
    with Load(hosts.hosts["alpha"].address, table["router"]["port"], max_tokens=50) as load:
        code, doc, err = tune_json(
            cli, inv, "-d", "w1", "--concurrency", "1,2", "--min-ratio", "0", output_len=9
        )
    entry = doc["hosts"]["alpha"]["deployments"]["w1"]
    assert code == 0, (err, json.dumps(entry)[:2000])
    assert load.failed == [] and len(load.done) > 3, (load.failed[:3], len(load.done))
    status = json.loads(cli("status", "-i", str(inv), "-d", "w1", "--json").stdout)
    assert status["hosts"]["alpha"]["deployments"]["w1"]["run"] == entry["serving"]


# ---- plans and the `threshold` variable (no host is contacted) -------------------------------


def unreachable_inventory(tmp_path: Path, **variables: object) -> Path:
    """A host nobody listens for: anything that tried to reach it would fail."""
    inv = tmp_path / "inv.yml"
    host = {"ansible_host": "127.0.0.1", "ansible_port": 9, "model_path": "/m",
            "draft_model_path": "/d", **variables}  # fmt: skip
    inv.write_text(json.dumps({"all": {"hosts": {"far": host}}}))
    return inv


def test_the_threshold_variable_is_what_launch_uses_without_the_option(
    cli: CLI, tmp_path: Path
) -> None:
    inv = str(unreachable_inventory(tmp_path, threshold=7))
    shown = cli("render", "-i", inv, "--json")
    assert shown.returncode == 0, shown.stderr
    rendered = json.loads(shown.stdout)["hosts"]["far"]
    assert "--speculative-disable-batch-threshold=7" in rendered["command"]
    assert "--speculative-algorithm=EAGLE3" in rendered["command"]  # eagle3 with a threshold
    assert rendered["threshold_mode"] == "patch"
    given = json.loads(cli("render", "-i", inv, "--threshold", "3", "--json").stdout)
    assert "--speculative-disable-batch-threshold=3" in given["hosts"]["far"]["command"]
    # A plain template stays plain: the variable is for servers that speculate.
    plain = cli("render", "-i", inv, "-t", "baseline", "--json")
    assert plain.returncode == 0, plain.stderr
    assert "threshold" not in json.loads(plain.stdout)["hosts"]["far"]["command"]


def test_a_dry_run_shows_the_plan_and_an_estimate_and_reaches_no_host(
    cli: CLI, tmp_path: Path
) -> None:
    inv = str(unreachable_inventory(tmp_path, threshold=7, template="eagle3"))
    result = cli("tune", "-i", inv, "--dry-run", "--json", "--concurrency", "1,4,16,64")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["hosts"]["far"]
    # The unthrottled phases ignore the inventory's threshold: they measure without one.
    assert "threshold" not in plan["phases"]["speculative"]["command"]
    assert "--speculative-algorithm=EAGLE3" in plan["phases"]["speculative"]["command"]
    assert "--speculative" not in plan["phases"]["baseline"]["command"]
    # 4 levels on 3 servers, and rounds of 3 new levels until the widest gap (17..63) closes.
    assert plan["launches"] == 3 + 3 and plan["levels"] == 4 * 3 + 3 * 3 * 3
    assert plan["estimated_s"] > 0
    human = cli("tune", "-i", inv, "--dry-run")
    assert "about 6 launches and 39 level measurements" in human.stdout


@pytest.mark.parametrize("template", ["router", "mine"])
def test_tune_refuses_a_router_or_another_program_before_any_host_is_touched(
    cli: CLI, tmp_path: Path, template: str
) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "mine.j2").write_text("{{ python }} -m my_proxy --port={{ port }}\n")
    inv = str(unreachable_inventory(tmp_path, template=template))
    result = cli("tune", "-i", inv, "--project", str(tmp_path), "--concurrency", "1,4")
    assert result.returncode == 1, result.stderr
    words = "is a router" if template == "router" else "does not run an SGLang server"
    assert result.stderr.startswith(f"error: far{'' if template == 'router' else ':'}")
    assert words in result.stderr and "hint:" in result.stderr
    assert "connect" not in result.stderr  # refused before any host was reached


@pytest.mark.heavy
def test_a_dry_run_merges_and_bounds_levels_and_its_estimate_keeps_to_max_launches(
    cli: CLI, tmp_path: Path
) -> None:
    inv = str(unreachable_inventory(tmp_path, template="eagle3"))

    def planned(*extra: str) -> dict[str, Any]:
        result = cli("tune", "-i", inv, "--dry-run", "--json", *extra)
        assert result.returncode == 0, result.stderr
        entry: dict[str, Any] = json.loads(result.stdout)["hosts"]["far"]
        return entry

    assert planned("--concurrency", "16,4,1,4,1")["params"]["concurrency"] == [1, 4, 16]
    # 3 splits would close 17..63; 3 launches leave the search 1 after its two servers.
    bounded = planned("--concurrency", "1,4,16,64", "--max-launches", "3")
    assert bounded["launches"] == 3 + 1 and bounded["levels"] == 4 * 3 + 1 * 3 * 3
    absurd = cli("tune", "-i", inv, "--dry-run", "--concurrency", f"1,{10**22}")
    assert absurd.returncode == 1 and "Traceback" not in absurd.stderr
    assert absurd.stderr.startswith(f"error: --concurrency {10**22} is more streams")
    assert "hint:" in absurd.stderr


@pytest.mark.long
def test_a_latency_bound_finds_the_highest_concurrency_that_meets_it(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """Per output token the plain server takes 30 + 0.3 b ms: within 34.5 ms up to b = 15
    (the speculative one only up to b = 7, where speculation still wins anyway). 20 misses
    the bound by more than the noise. --min-ratio 0: the tuned run's throughput is not what is pinned here."""
    model = QUICK_MODEL
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["charlie"], {"charlie": adaptive_host(hosts, "charlie", model)}
    )
    code, doc, err = tune_json(
        cli, inv, "--concurrency", "4,20", "--max-launches", "2", "--max-itl-ms", "34.5",
        "--keep", "baseline", "--min-ratio", "0",
    )  # fmt: skip
    entry = doc["hosts"]["charlie"]
    assert code == 0, (
        err,
        entry["envelope_ratio"],
        verdicts(entry),
        entry["phases"]["tuned"]["samples"],
    )
    # --keep baseline: the plain server serves afterwards.
    assert entry["serving"].startswith("baseline_v")
    status = status_of(cli, inv, "charlie")
    assert status["run"] == entry["serving"] and status["state"] == "ready"
    assert entry["params"]["objective"] == {"kind": "max_itl_ms", "bound": 34.5}
    assert entry["threshold"] == 4, verdicts(entry)  # QUICK's: not narrowed down
    per_token = {lv["concurrency"]: per_token_ms(lv) for lv in entry["phases"]["tuned"]["levels"]}
    # Past T the tuned run is plain: 30 + 0.3 b ms a token, 34.5 at 15, plus the stand-in's
    # own overhead (0.3-1 ms a token), so the edge is where measured. On a busy machine the
    # load's streams fall behind, the server holds fewer than the level's requests and the edge
    # moves up (16 measured 34.19 ms once, beside a busy loop per core and more): below 20,
    # which misses the bound by 1.5 ms, the level that is measured at all is what is pinned.
    capacity = entry["capacity"]
    assert 6 < capacity < 20, (capacity, per_token)
    # Narrowed down to adjacent levels on the tuned run: one meets the bound, the next not.
    assert per_token[capacity] <= 34.5 < per_token[capacity + 1], per_token
