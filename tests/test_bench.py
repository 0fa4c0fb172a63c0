"""bench: load sweeps from the deployment's own host, kept results, comparison, threshold.

The stand-in's decode model (tests/standin/README.md) gives analytic throughputs: a step
over a batch of b requests takes step_ms + per_req_ms * b and gives each one token; with
speculation spec_step_ms + spec_per_req_ms * b for accept_len tokens each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployctl.errors import DeployctlError, UsageError
from deployctl.ops.bench import (
    BenchResult,
    Comparison,
    drift_of,
    merged_sweeps,
    parse_levels,
    spread_of,
    suggest_threshold,
    t975,
    with_figures,
)
from deployctl.present.views import BENCH, COMPARISON, SUGGESTION, render_result
from deployctl.remote.bench import bench_serving_module, percentile, rounds_of
from tests.conftest import CLI
from tests.sglang_wheel import bench_serving_venv, write_tokenizer
from tests.sshd_hosts import SSHLab, sh
from tests.test_deployments import run_json
from tests.test_lifecycle import prepare

MODEL = {"step_ms": 20.0, "per_req_ms": 1.0, "spec_step_ms": 28.0, "spec_per_req_ms": 4.0,
         "accept_len": 3}  # fmt: skip
LEVELS = [1, 4, 16, 64]


def plain_tps(c: int) -> float:
    return c * 1000 / (MODEL["step_ms"] + MODEL["per_req_ms"] * c)


def spec_tps(c: int) -> float:
    return c * MODEL["accept_len"] * 1000 / (MODEL["spec_step_ms"] + MODEL["spec_per_req_ms"] * c)


def assert_paced(level: Any, modelled: float) -> None:
    """A bench level of a stand-in measured at its model's pace. The stand-in keeps to its
    model's clock, so a bench can measure it slower, never faster: up to 5 % over (rounding).
    Its best round (one request a stream, summed) is at most 30 % under, as a loaded 2-core
    machine cannot carry its chunks at pace (CI measured 673 against 762 tok/s at 64
    streams, 77.6 against 93.75 at one; at load 6 the levels gave 0.86-0.98 of the model).
    The level's own figure counts the gaps between requests too: beside a busy loop per core
    it read 0.63 of the model at one stream (rounds 0.89 and 0.99), so it gets 50 %."""
    tps, best = level["output_tokens_per_s"], max(level["rounds_tokens_per_s"])
    said = f"concurrency {level['concurrency']}, model {modelled:.1f} tok/s: {level}"
    assert 0.7 * modelled <= best <= 1.05 * modelled, (
        f"best round {best:.1f} tok/s, {best / modelled:.3f} of the model, bounds 0.7 to "
        f"1.05; {said}"
    )
    assert 0.5 * modelled <= tps <= 1.05 * modelled, (
        f"{tps:.1f} tok/s, {tps / modelled:.3f} of the model, bounds 0.5 to 1.05; {said}"
    )


def test_percentiles_interpolate_like_numpy() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0 and percentile([], 50) is None


def test_a_levels_rounds_give_its_spread_and_drift() -> None:
    # Requests in the order they ended, one round a `concurrency` of them, in level units.
    assert rounds_of([10.0, 11.0, 12.0, 13.0, 14.0], 2) == [21.0, 25.0]  # a part round is none
    assert rounds_of([10.0], 1) == [10.0] and rounds_of([10.0], 2) == []
    # The 95 % interval of the mean, Student's t: few rounds are wide.
    assert t975(1) == 12.706 and t975(30) == 2.042 and t975(120) == pytest.approx(1.98, abs=0.002)
    assert spread_of([98.0, 102.0, 100.0, 100.0]) == pytest.approx(3.182 * (8 / 3) ** 0.5 / 2 / 100)
    assert spread_of([98.0, 102.0]) == pytest.approx(12.706 * 8**0.5 / 2**0.5 / 100)
    assert spread_of([100.0]) is None and spread_of([]) is None and drift_of([100.0]) is None
    # The second half against the first (an odd middle round in neither), over the mean.
    assert drift_of([90.0, 95.0, 100.0, 105.0]) == pytest.approx(10 / 97.5)
    assert drift_of([90.0, 0.0, 110.0]) == pytest.approx(20 / (200 / 3))


def swept_level(
    rounds: list[float], warmup_s: float | None = None, first: float | None = None
) -> dict[str, Any]:
    level = sweep(sum(rounds) / len(rounds))["levels"][0]
    return {**level, "rounds_tokens_per_s": rounds, "warmup_s": warmup_s,
            "first_sample_tokens_per_s": first}  # fmt: skip


def test_a_level_says_how_far_its_cold_first_sample_was_and_whether_it_still_drifts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.inventory import Host

    warm = with_figures(swept_level([99.0, 101.0, 100.0, 100.0], 1.25, 40.0))  # type: ignore[arg-type]
    assert warm["first_sample_bias"] == pytest.approx(-0.6) and not warm["drifting"]
    assert warm["spread"] == pytest.approx(spread_of([99.0, 101.0, 100.0, 100.0]))
    moving = with_figures(swept_level([80.0, 90.0, 100.0, 110.0, 120.0, 130.0]))  # type: ignore[arg-type]
    assert moving["first_sample_bias"] is None and moving["drift"] == pytest.approx(0.3 / 1.05)
    assert moving["drifting"]  # 29 % from half to half, beyond its ±19 %
    assert not with_figures(swept_level([80.0, 120.0]))["drifting"]  # type: ignore[arg-type]

    params = {"tool": "builtin", "input_len": 16, "output_len": 30, "warmup": True}
    doc = {"run": "baseline_v1", "params": params, "levels": [warm, {**moving, "concurrency": 8}]}
    render_result(BENCH, FleetResult([HostResult(Host("alpha"), BenchResult(doc, "k"))]), False)
    out, err = capsys.readouterr()
    assert "warm-up, first sample" in out and "1.2 s, first -60.0 %" in out and "±1.3 %" in out
    assert (
        "alpha: note: concurrency 8: its rounds still drift (+28.6 % from the first half to the "
        "second, beyond their spread ±18.7 %)"
    ) in err
    assert "alpha: hint: more --requests-per-stream" in err
    doc["params"] = {**params, "warmup": False}
    render_result(BENCH, FleetResult([HostResult(Host("alpha"), BenchResult(doc, "k"))]), False)
    out, err = capsys.readouterr()
    assert "warm-up" not in out and "alpha: hint: bench with --warmup, or more" in err


def test_a_runs_sweeps_are_merged_newest_level_first_and_only_of_one_load_shape() -> None:
    def kept(output_len: int, *levels: tuple[int, float]) -> dict[str, Any]:
        doc = sweep(0.0)
        doc["params"] = {"tool": "builtin", "input_len": 32, "output_len": output_len}
        doc["levels"] = [
            {**doc["levels"][0], "concurrency": c, "output_tokens_per_s": tps} for c, tps in levels
        ]
        return doc

    whole = kept(128, (1, 200.0), (4, 700.0), (64, 5000.0))
    other_shape = kept(512, (16, 1.0), (64, 2.0))
    again = kept(128, (64, 5100.0))  # tune measuring one level again
    merged = merged_sweeps([whole, other_shape, again])
    assert [(lv["concurrency"], lv["output_tokens_per_s"]) for lv in merged["levels"]] == [
        (1, 200.0),
        (4, 700.0),
        (64, 5100.0),
    ]
    assert merged["params"]["output_len"] == 128
    assert merged_sweeps([whole]) == whole


@pytest.mark.parametrize("text", ["", "0,4", "1,x", "-1"])
def test_bad_concurrency_lists_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="not a list of positive numbers"):
        parse_levels(text)


def kept(*pairs: tuple[int, float]) -> dict[str, Any]:
    return {"levels": [{"concurrency": c, "output_tokens_per_s": t} for c, t in pairs]}


def test_the_threshold_is_the_largest_level_where_speculation_still_wins() -> None:
    runs = {
        "base": kept((1, 50), (4, 180), (16, 600), (64, 1500)),
        "spec": kept((1, 140), (4, 400), (16, 900), (64, 1200)),
    }
    suggestion = suggest_threshold(Comparison(runs), "base", "spec")
    assert suggestion.threshold == 16
    assert suggestion.rows[-1] == (64, 1500, 1200)
    never = Comparison({"base": runs["base"], "spec": kept((1, 40), (4, 100))})
    assert suggest_threshold(never, "base", "spec").threshold is None
    with pytest.raises(DeployctlError, match="no kept bench results for gone_v1"):
        suggest_threshold(Comparison(runs, missing=["gone_v1"]), "base", "gone_v1")


def test_a_tie_is_not_a_win() -> None:
    runs = {
        "base": kept((1, 50), (4, 180), (16, 600)),
        "spec": kept((1, 140), (4, 180), (16, 500)),
    }
    suggestion = suggest_threshold(Comparison(runs), "base", "spec")
    assert suggestion.threshold == 1 and suggestion.between == (1, 4)


def test_a_win_after_a_loss_does_not_move_the_threshold_past_the_loss() -> None:
    runs = {
        "base": kept((1, 50), (4, 180), (16, 600), (64, 1500)),
        "spec": kept((1, 140), (4, 150), (16, 900), (64, 1200)),
    }
    suggestion = suggest_threshold(Comparison(runs), "base", "spec")
    assert suggestion.threshold == 1 and suggestion.between == (1, 4)
    assert suggestion.wins_after_loss == [16]


def test_the_crossover_bracket_says_whether_levels_between_were_measured() -> None:
    base = kept((1, 50), (4, 180), (5, 220), (16, 600))
    spread = Comparison({"base": base, "spec": kept((1, 140), (4, 400), (16, 500))})
    assert suggest_threshold(spread, "base", "spec").between == (4, 16)
    assert suggest_threshold(spread, "base", "spec").crossover_unresolved
    adjacent = Comparison({"base": base, "spec": kept((1, 140), (4, 400), (5, 200))})
    assert suggest_threshold(adjacent, "base", "spec").between == (4, 5)
    assert not suggest_threshold(adjacent, "base", "spec").crossover_unresolved
    always = Comparison({"base": base, "spec": kept((1, 140), (4, 400), (16, 900))})
    assert suggest_threshold(always, "base", "spec").between == (16, None)
    assert not suggest_threshold(always, "base", "spec").crossover_unresolved


def test_a_speculative_run_with_its_own_threshold_is_not_measured_above_it() -> None:
    """Above its --threshold the run does not speculate: its curve is the baseline's."""
    base = kept((1, 50), (4, 180), (16, 600))
    throttled = {**kept((1, 140), (4, 400), (16, 610)), "threshold": 5}  # 610: noise
    suggestion = suggest_threshold(Comparison({"base": base, "spec": throttled}), "base", "spec")
    assert suggestion.threshold == 4 and suggestion.between == (4, None)
    assert suggestion.speculative_threshold == 5 and suggestion.unmeasured == [16]
    below_all = {**kept((4, 400), (16, 610)), "threshold": 2}
    with pytest.raises(DeployctlError, match="no level both runs share is at or below it"):
        suggest_threshold(Comparison({"base": base, "spec": below_all}), "base", "spec")


def test_a_baseline_that_speculates_is_told_apart() -> None:
    spec = kept((1, 140), (4, 400))
    for command, speculates in (
        ("python3 -m sglang.launch_server --model-path m --speculative-algorithm EAGLE3", True),
        ("python3 -m sglang.launch_server --model-path m --tp 8", False),
        ("python3 -m sglang.launch_server --served-model-name 'it''s", False),  # unbalanced
    ):
        base = {**kept((1, 50), (4, 180)), "command": command}
        runs = Comparison({"base": base, "spec": spec})
        assert suggest_threshold(runs, "base", "spec").baseline_speculates is speculates


def test_the_suggestion_says_what_it_cannot_see(capsys: pytest.CaptureFixture[str]) -> None:
    base = kept((1, 50), (4, 180), (16, 600))
    # Issue 30's new user: a baseline, a --threshold 5 run, levels 1, 4, 16.
    throttled = {**kept((1, 140), (4, 400), (16, 600)), "threshold": 5}
    found = Comparison({"base_v1": base, "spec_v1": throttled})
    render_result(SUGGESTION, suggest_threshold(found, "base_v1", "spec_v1"), as_json=False)
    out, err = capsys.readouterr()
    assert "deployctl launch --threshold 4" in out and "not measured" in out
    assert (
        "warning: spec_v1 ran with --threshold 5: above concurrency 5 its curve is the "
        "baseline's, not speculation's (not measured: 16); the suggestion cannot exceed 5"
    ) in err
    assert "crossover" not in err

    speculating = {**base, "command": "sglang serve --speculative-algorithm EAGLE3"}
    unthrottled = kept((1, 140), (4, 400), (16, 600))
    found = Comparison({"base_v1": speculating, "spec_v2": unthrottled})
    render_result(SUGGESTION, suggest_threshold(found, "base_v1", "spec_v2"), as_json=False)
    out, err = capsys.readouterr()
    assert "no (tie)" in out and "deployctl launch --threshold 4" in out
    assert "warning: base_v1 is not a baseline: its command has --speculative-algorithm" in err
    assert "note: the crossover lies somewhere between concurrency 4 and 16" in err
    assert "hint: deployctl tune narrows it down" in err
    assert "ran with --threshold" not in err

    longer = kept((1, 50), (4, 180), (16, 600), (64, 1500))
    again = kept((1, 40), (4, 400), (16, 500), (64, 1600))
    found = Comparison({"base_v1": longer, "spec_v2": again})
    render_result(SUGGESTION, suggest_threshold(found, "base_v1", "spec_v2"), as_json=False)
    out, err = capsys.readouterr()
    assert "never beats the baseline" in out
    assert "speculation wins again at 4, 64 after losing at 1: a threshold cannot use them" in err
    assert "crossover" not in err  # lost at 1: no level below it to measure


def test_comparing_runs_of_both_tools_says_what_their_itl_means(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def swept(tool: str) -> dict[str, Any]:
        level = {"concurrency": 4, "output_tokens_per_s": 180.0, "itl_ms": {"p50": 12.0}}
        return {"params": {"tool": tool}, "levels": [level]}

    render_result(COMPARISON, Comparison({"base_v1": swept("builtin")}), as_json=False)
    assert "note:" not in capsys.readouterr().err
    both = Comparison({"base_v1": swept("builtin"), "eagle3_v2": swept("sglang")})
    render_result(COMPARISON, both, as_json=False)
    out, err = capsys.readouterr()
    assert "180.0" in out and "(base_v1: builtin, eagle3_v2: sglang)" in err
    assert "sglang's ITL is per token and the builtin's per chunk" in err


def test_the_serving_benchmark_is_found_under_either_name(tmp_path: Path) -> None:
    """0.5.23 moved it to sglang.benchmark.serving (the old name is a deprecated alias)."""
    (tmp_path / "sglang").mkdir()
    assert bench_serving_module(str(tmp_path)) is None
    (tmp_path / "sglang" / "bench_serving.py").write_text("")
    assert bench_serving_module(str(tmp_path)) == "sglang.bench_serving"
    (tmp_path / "sglang" / "benchmark").mkdir()
    (tmp_path / "sglang" / "benchmark" / "serving.py").write_text("")
    assert bench_serving_module(str(tmp_path)) == "sglang.benchmark.serving"


# ---- over real sshd hosts --------------------------------------------------------------------


def bench_json(cli: CLI, inv: Path, *extra: str) -> dict[str, Any]:
    code, doc, err = run_json(
        cli, "bench", "-i", str(inv), "--concurrency", ",".join(map(str, LEVELS)),
        "--input-len", "16", "--output-len", "60", "--requests-per-stream", "2", *extra,
    )  # fmt: skip
    assert code == 0, (err, json.dumps(doc)[:1500])
    return doc


def test_bench_agrees_with_the_model_and_suggests_its_crossover(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    variables = {**prepare(alpha, tp=1, **MODEL), "template": "baseline"}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    runs = {}
    for template in ("baseline", "eagle3"):
        code, doc, err = run_json(cli, "launch", "-i", str(inv), "-t", template, "--replace")
        assert code == 0, err
        runs[template] = doc["hosts"]["alpha"]["run"]
        result = bench_json(cli, inv)
        entry = result["hosts"]["alpha"]
        assert entry["run"] == runs[template] and entry["deployment"] is None
        model = plain_tps if template == "baseline" else spec_tps
        for level in entry["levels"]:
            c = level["concurrency"]
            assert level["failed"] == 0 and level["completed"] == level["prompts"] == 2 * c
            assert level["output_tokens"] == 60 * 2 * c
            assert_paced(level, model(c))
            assert level["ttft_ms"]["p50"] > 0 and level["itl_ms"]["p99"] >= level["itl_ms"]["p50"]
        saved = Path(entry["saved"])
        assert saved == alpha.home / ".deployctl" / "runs" / f"{runs[template]}.bench" / "1.json"
        assert json.loads(saved.read_text())["params"]["output_len"] == 60

    # Kept results, side by side, and the threshold their crossover gives (the model's is 32).
    compare = cli("bench", "-i", str(inv), "--compare", f"{runs['baseline']},{runs['eagle3']}")
    assert compare.returncode == 0, compare.stderr
    assert (
        f"{runs['baseline']} tok/s" in compare.stdout
        and f"{runs['eagle3']} tok/s" in compare.stdout
    )
    code, doc, err = run_json(
        cli, "bench", "-i", str(inv), "--suggest-threshold", runs["baseline"], runs["eagle3"]
    )
    assert code == 0, err
    assert doc["threshold"] == 16
    human = cli("bench", "-i", str(inv), "--suggest-threshold", runs["baseline"], runs["eagle3"])
    assert "deployctl launch --threshold 16" in human.stdout

    # The curves as pictures; a format matplotlib is not asked for is refused first.
    both = f"{runs['baseline']},{runs['eagle3']}"
    for name, magic in (("curves.png", b"\x89PNG"), ("curves.svg", b"<?xml")):
        picture = tmp_path / name
        drawn = cli("bench", "-i", str(inv), "--compare", both, "--plot", str(picture))
        assert drawn.returncode == 0, drawn.stderr
        assert picture.read_bytes().startswith(magic)
    refused = cli("bench", "-i", str(inv), "--compare", both, "--plot", str(tmp_path / "c.pdf"))
    assert refused.returncode != 0 and "must end in .png or .svg" in refused.stderr
    assert not (tmp_path / "c.pdf").exists()
    cli("stop", "-i", str(inv))


def test_a_warm_up_takes_a_cold_start_out_of_the_level_and_says_how_cold_it_was(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """The stand-in's `cold` knob: a server's first 30 decode steps at each batch size take 3
    times longer (kernels compiled at first use, CUDA graphs first replayed). A level of 2
    answers a stream of 30 tokens is 60 steps at its batch size: cold, half of them, the
    level reads about half the model. With --warmup, the warm-up's request a stream at the
    level's batch size takes the cold steps: the level reads the model, and its first
    sample, a third of it, is reported."""
    alpha = hosts.hosts["alpha"]
    cold = {"factor": 3.0, "steps": 30}
    variables = {**prepare(alpha, tp=1, **MODEL, cold=cold), "template": "baseline"}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    sweep = ["bench", "-i", str(inv), "--concurrency", "1,4", "--input-len", "16",
             "--output-len", "30", "--requests-per-stream", "2"]  # fmt: skip
    for warmup in ([], ["--warmup"]):
        code, doc, err = run_json(cli, "launch", "-i", str(inv), "--replace")  # a cold server
        assert code == 0, err
        code, doc, err = run_json(cli, *sweep, *warmup)
        assert code == 0, err
        levels = doc["hosts"]["alpha"]["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 4], levels
        for level in levels:
            model = plain_tps(level["concurrency"])
            if not warmup:
                assert level["output_tokens_per_s"] < 0.65 * model, (level, model)
                assert level["warmup_s"] is None and level["first_sample_bias"] is None
                continue
            assert_paced(level, model)
            assert level["warmup_s"] > 0 and level["first_sample_bias"] < -0.4, level
            assert len(level["rounds_tokens_per_s"]) == 2 and level["spread"] is not None
    kept = json.loads(Path(doc["hosts"]["alpha"]["saved"]).read_text())
    assert kept["params"]["warmup"] is True and kept["levels"][0]["first_sample_bias"] < -0.4
    cli("stop", "-i", str(inv))


def test_sglang_tool_runs_the_hosts_own_serving_benchmark(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """`--tool sglang`: SGLang 0.5.23's real benchmark code (tests/standin/bench_serving_shim.py
    says what it spares it) drives the stand-in from alpha; bravo has no SGLang and fails
    alone, with one line."""
    venv = bench_serving_venv()
    alpha, bravo = hosts.hosts["alpha"], hosts.hosts["bravo"]
    host_vars = {
        "alpha": {**prepare(alpha, tp=1, **MODEL), "python": str(venv / "bin" / "python")},
        "bravo": prepare(bravo, tp=1, **MODEL),
    }
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"], host_vars)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--replace")
    assert code == 0, err
    levels = [1, 4, 16]
    sweep = ["bench", "-i", str(inv), "--tool", "sglang", "--concurrency", "1,4,16",
             "--input-len", "16", "--output-len", "60", "--requests-per-stream", "2"]  # fmt: skip

    # Without a tokenizer in the model folder SGLang's benchmark cannot make its prompts.
    code, doc, err = run_json(cli, *sweep)
    assert code != 0
    said = doc["hosts"]["alpha"]["error"]
    assert said.startswith("sglang.benchmark.serving exited 1: ") and "tokenizer" in said, said
    assert not list((alpha.home / ".deployctl" / "runs").glob("*.bench"))

    write_tokenizer(venv, alpha.home / "model")
    code, doc, err = run_json(cli, *sweep)
    assert code != 0
    assert doc["hosts"]["bravo"]["error"] == (
        "SGLang is not installed for /usr/bin/python3; --tool builtin needs only the "
        "standard library"
    )
    assert not list((bravo.home / ".deployctl" / "runs").glob("*.bench"))
    entry = doc["hosts"]["alpha"]
    assert [level["concurrency"] for level in entry["levels"]] == levels
    for level in entry["levels"]:
        c = level["concurrency"]
        assert level["failed"] == 0 and level["completed"] == level["prompts"] == 2 * c
        assert level["output_tokens"] == 60 * 2 * c
        assert_paced(level, spec_tps(c))
        # Its requests' details (tokens, TTFT, ITLs) make the level's rounds: two a stream.
        assert len(level["rounds_tokens_per_s"]) == 2 and level["spread"] is not None, level
    # bench_serving's ITL is per token: a chunk's gap divided by the tokens it brought.
    step_ms = MODEL["spec_step_ms"] + MODEL["spec_per_req_ms"]
    per_token = step_ms / MODEL["accept_len"]
    itl = entry["levels"][0]["itl_ms"]["p50"]
    assert itl == pytest.approx(per_token, rel=0.2), (
        f"ITL p50 {itl:.2f} ms: {itl / per_token:.3f} of the model's {per_token:.2f}, bound ±0.2"
    )
    kept = json.loads(Path(entry["saved"]).read_text())
    assert kept["params"]["tool"] == "sglang"
    # The requests really came from SGLang's client: native /generate, a flush per level.
    log = (alpha.home / "logs" / f"{entry['run']}.log").read_text()
    assert log.count('"POST /flush_cache?timeout=60.0 HTTP/1.1" 200') == len(levels)
    assert '"POST /generate HTTP/1.1" 200' in log and "/v1/completions" not in log
    cli("stop", "-i", str(inv))


@pytest.mark.parametrize("given", ["", ",", " , "])
def test_compare_naming_no_run_is_refused_before_any_host_is_asked(cli: CLI, given: str) -> None:
    example = str(Path(__file__).resolve().parent.parent / "inventories" / "example.yml")
    result = cli("bench", "-i", example, "--compare", given)  # its hosts do not exist
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and result.stdout == ""
    assert lines[0] == f"error: --compare {given!r} names no run" and len(lines) == 2, lines


def sweep(tokens_per_s: float) -> dict[str, Any]:
    spread = {"p50": 9.0, "p99": 9.5}
    level = {"concurrency": 4, "prompts": 8, "completed": 8, "failed": 0, "errors": [],
             "duration_s": 1.0, "output_tokens": 480, "output_tokens_per_s": tokens_per_s,
             "requests_per_s": 8.0, "ttft_ms": spread, "itl_ms": spread, "e2e_ms": spread}  # fmt: skip
    return {"run": "r", "levels": [level]}


def test_a_corrupt_kept_bench_file_is_named_and_the_others_are_shown(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    runs = alpha.home / ".deployctl" / "runs"
    files = {
        "base_v1.bench/1.json": json.dumps(sweep(111.0)),
        "base_v1.bench/2.json": '{"levels": [',  # cut short: not JSON
        "spec_v2.bench/1.json": json.dumps(sweep(222.0)),
        "spec_v2.bench/2.json": json.dumps({"levels": [{"concurrency": "4"}]}),  # not a sweep
        "spec_v2.bench/3.json": json.dumps(["not", "a", "sweep"]),
        "spec_v2.bench/4.json": json.dumps(
            {"levels": [{**sweep(1.0)["levels"][0], "itl_ms": None}]}
        ),
    }
    for name, text in files.items():
        (runs / name).parent.mkdir(parents=True, exist_ok=True)
        (runs / name).write_text(text)
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", str(alpha.home / ".deployctl"))
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    bad = [str(runs / n) for n in files if not n.endswith("/1.json")]

    result = cli("bench", "-i", str(inv), "--compare", "base_v1,spec_v2")
    assert result.returncode == 0, result.stderr
    assert "111.0" in result.stdout and "222.0" in result.stdout  # the newest readable ones
    assert result.stderr.splitlines() == [
        f"alpha: warning: {path} is not a readable bench result; skipped" for path in bad
    ]
    code, doc, _ = run_json(cli, "bench", "-i", str(inv), "--compare", "base_v1,spec_v2")
    assert code == 0 and doc["unreadable"] == {"alpha": bad}
    assert doc["runs"]["spec_v2"]["levels"][0]["output_tokens_per_s"] == 222.0
