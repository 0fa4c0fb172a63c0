"""The stand-in learns content: acceptance by prompt class (the `accept_by_class` knob), its
accept length on /metrics and in the `Decode batch` lines as real SGLang reports them, and
tests/load_mix.py, a load of mixed prompt classes at a scheduled concurrency.

Speculation's value depends on what is served: a request's accept length sets its tokens per
speculative step, so a batch's throughput follows the accept length of the requests in it, and
the crossover (where speculation falls below plain) moves with the traffic's mix.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deployctl.ops.bench import Comparison, suggest_threshold
from tests.load_mix import (
    CHAT_MATCH,
    CHAT_PROMPT,
    CODE_MATCH,
    CODE_PROMPT,
    LoadMix,
    Outcome,
    PromptClass,
)
from tests.standin.sglang_standin.decoder import Decoder, DecodeRequest, prompt_text
from tests.standin.sglang_standin.knobs import KNOB_DEFAULTS, load_knobs
from tests.test_bench import MODEL, plain_tps
from tests.test_standin import READY, Launch, Server, standin  # noqa: F401 (the fixture)
from tests.test_standin_canary_load import failing_server  # noqa: F401 (the fixture)
from tests.test_standin_metrics import scrape, value

CODE, CHAT = 3.5, 1.6  # code-like prompts accept far more than chat ones
CLASSES = [{"match": CODE_MATCH, "accept_len": CODE}, {"match": CHAT_MATCH, "accept_len": CHAT}]
# 56 tokens are 16 speculative steps of a code request and 35 of a chat one: whole steps.
TOKENS = 56
REAL = Path(__file__).parent / "data" / "real-sglang-0.5.17"


def mix(code: float, chat: float) -> list[PromptClass]:
    return [PromptClass("code", CODE_PROMPT, code), PromptClass("chat", CHAT_PROMPT, chat)]


def knobs(**more: object) -> dict[str, object]:
    return {"startup_s": 0.2, **MODEL, "accept_by_class": CLASSES, **more}


def served_accept(outcomes: list[Outcome]) -> float:
    """Tokens per request-step over a run: the stand-in streams one chunk a step."""
    return sum(o.tokens for o in outcomes) / sum(o.chunks for o in outcomes)


def speculative(c: int, accept: float) -> float:
    """The stand-in's speculative curve (tok/s at concurrency c) at a mean accept length."""
    return c * accept * 1000 / (MODEL["spec_step_ms"] + MODEL["spec_per_req_ms"] * c)


# ---- the knob -------------------------------------------------------------------------------


def test_the_prompt_text_is_read_from_each_request_shape() -> None:
    assert prompt_text({"prompt": "def f(x):"}) == "def f(x):"
    assert prompt_text({"prompt": ["Hi", "there"]}) == "Hi\nthere"
    assert prompt_text({"text": "Hello", "sampling_params": {}}) == "Hello"
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hi!"}]}]}  # fmt: skip
    assert prompt_text(chat) == "Be brief.\nHi!"
    assert prompt_text({"input_ids": [1, 2, 3]}) == "" and prompt_text(None) == ""


def test_the_first_matching_class_sets_a_requests_accept_length() -> None:
    classes = [{"match": "^def ", "accept_len": 3.5}, {"match": "def|Hi", "accept_len": 1.6}]
    decoder = Decoder({**KNOB_DEFAULTS, "accept_len": 2, "accept_by_class": classes}, True, None)
    assert decoder.accept_for("def f():") == 3.5  # both match: the first wins
    assert decoder.accept_for("Hi, def") == 1.6
    assert decoder.accept_for("w123 w456") == 2.0  # none: accept_len


@pytest.mark.parametrize(("accept", "steps", "tokens"), [(3.5, 16, 56), (1.6, 35, 56),
                                                         (2.7, 10, 27), (3.0, 4, 12)])  # fmt: skip
def test_a_fractional_accept_length_carries_its_remainder_and_averages_exactly(
    accept: float, steps: int, tokens: int
) -> None:
    request = DecodeRequest(1000, None, True, accept)
    drawn = [request.drafted() for _ in range(steps)]
    assert sum(drawn) == tokens
    assert set(drawn) <= {int(accept), int(accept) + 1}  # each step a whole number near it


@pytest.mark.parametrize(
    "knob",
    [{"accept_by_class": {"match": "x", "accept_len": 2}},
     {"accept_by_class": [{"match": "x"}]},
     {"accept_by_class": [{"match": "x", "accept_len": 0.5}]},
     {"accept_by_class": [{"match": "x", "accept_len": True}]},
     {"accept_by_class": [{"match": 3, "accept_len": 2}]},
     {"accept_by_class": [{"match": "x", "accept_len": 2, "steps": 3}]},
     {"accept_by_class": [{"match": "(", "accept_len": 2}]},
     {"accept_len": 0}, {"accept_len": "3"}],
)  # fmt: skip
def test_a_bad_accept_knob_is_an_error(tmp_path: Path, knob: dict[str, object]) -> None:
    (tmp_path / "standin.json").write_text(json.dumps(knob))
    with pytest.raises(ValueError, match=r"accept_by_class|accept_len"):
        load_knobs(str(tmp_path))


# ---- served: /metrics and the log -----------------------------------------------------------


def spec_server(standin: Launch, *extra: str) -> Server:  # noqa: F811 (the fixture)
    server = standin(
        None, "--speculative-algorithm", "EAGLE3", "--enable-metrics", *extra,
        tp=1, knobs=knobs(),
    )  # fmt: skip
    server.wait_log(READY)
    return server


def accept_lines(server: Server) -> list[float]:
    return [float(x) for x in re.findall(r"Decode batch, .* accept len: ([\d.]+),", server.text())]


def test_code_prompts_are_served_with_a_higher_accept_length_than_chat(
    standin: Launch,  # noqa: F811 (the fixture)
) -> None:
    """Each mix alone, then read /metrics: sglang:spec_accept_length is the mean over the last
    --decode-log-interval steps' requests (tokens served over request-steps), as 0.5.23's
    MetricsReporter sets it, and the `Decode batch` line says the same."""
    server = spec_server(standin, "--decode-log-interval", "10")
    url = f"http://127.0.0.1:{server.port}"
    read = {}
    for name, one in (("code", mix(1, 0)), ("chat", mix(0, 1))):
        outcomes = LoadMix(url, one, [(1.5, 4)], TOKENS, seed=1).run()
        assert outcomes and all(o.completed and o.tokens == TOKENS for o in outcomes), outcomes
        assert {o.name for o in outcomes} == {name}
        read[name] = value(scrape(server.port), "spec_accept_length")
        assert accept_lines(server)[-1] == pytest.approx(read[name], abs=0.005)
        assert served_accept(outcomes) == pytest.approx({"code": CODE, "chat": CHAT}[name])
    assert read["code"] == pytest.approx(CODE, abs=0.1), read
    assert read["chat"] == pytest.approx(CHAT, abs=0.1), read


def shape(line: str) -> str:
    """A `Decode batch` line with its time and figures taken out."""
    return re.sub(r"\d+(\.\d+)?", "N", line.split("] ", 1)[1])


def test_decode_batch_lines_have_the_real_form(
    standin: Launch,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """The stand-in's lines, with speculation and without, as real 0.5.17 wrote them on the
    H200 (0.5.23 words them alike)."""
    captured = {
        shape(line)
        for name in ("baseline.log", "spec-threshold-switches.log")
        for line in (REAL / name).read_text().splitlines()
        if "Decode batch" in line
    }
    plain = standin(
        tmp_path / "plain", "--enable-metrics", "--decode-log-interval", "5", tp=1, knobs=knobs()
    )
    spec = spec_server(standin, "--decode-log-interval", "5")
    plain.wait_log(READY)
    for server in (plain, spec):
        LoadMix(f"http://127.0.0.1:{server.port}", mix(1, 1), [(0.5, 2)], 20, seed=2).run()
        ours = {shape(line) for line in server.text().splitlines() if "Decode batch" in line}
        assert ours and ours <= captured, (ours, captured)
    assert "accept len" not in plain.text() and accept_lines(spec)
    assert ("sglang:spec_accept_length", None, None) not in scrape(plain.port)


# ---- the mix moves the crossover --------------------------------------------------------------


@contextmanager
def sampling(server: Server, name: str) -> Iterator[list[tuple[float, float]]]:
    """Read the server's gauge ``name`` every 0.1 s while inside: (monotonic time, value)."""
    seen: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append((time.monotonic(), value(scrape(server.port), name)))
            done.wait(0.1)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def throughput_at(server: Server, weights: list[PromptClass], streams: int) -> tuple[float, float]:
    """(tok/s, accept length served) of ``streams`` streams of the mix for 4 s: the median of
    the server's gen_throughput (its tokens of the last second) from 1.5 s to 3.9 s in."""
    load = LoadMix(f"http://127.0.0.1:{server.port}", weights, [(4.0, streams)], TOKENS, seed=3)
    start = time.monotonic()
    with sampling(server, "gen_throughput") as seen:
        outcomes = load.run()
    assert all(o.completed for o in outcomes), [o.error for o in outcomes if o.error]
    steady = [v for t, v in seen if 1.5 <= t - start <= 3.9]
    return statistics.median(steady), served_accept(outcomes)


@pytest.mark.long
def test_the_traffic_mix_moves_the_crossover(
    standin: Launch,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """A code-heavy mix (3 code requests to 1 chat) serves an accept length near 2.7, a
    chat-heavy one (1 to 3) near 1.85 (a request's steps count, so the mean is the mix's
    harmonic one). On the stand-in's model (plain 20 + b ms a step, speculative 28 + 4 b) that
    puts the crossover near 20 and near 4: deployctl's own suggest_threshold over the two
    curves says so, and at 10 streams, between them, speculation measures a win with the
    first mix and a loss with the second against the plain server under the same load."""
    spec = spec_server(standin)
    plain = standin(tmp_path / "plain", "--enable-metrics", tp=1, knobs=knobs())
    plain.wait_log(READY)
    base, _ = throughput_at(plain, mix(1, 1), 10)
    levels = [1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64]
    found: dict[str, tuple[float, float, int | None]] = {}
    for name, weights in (("code-heavy", mix(3, 1)), ("chat-heavy", mix(1, 3))):
        measured, accept = throughput_at(spec, weights, 10)
        curves = {
            run: {"levels": [{"concurrency": c, "output_tokens_per_s": curve(c)} for c in levels]}
            for run, curve in (("plain", plain_tps),
                               ("spec", functools.partial(speculative, accept=accept)))
        }  # fmt: skip
        threshold = suggest_threshold(Comparison(runs=curves), "plain", "spec").threshold
        found[name] = (accept, measured, threshold)
    (code_accept, code_tps, code_t), (chat_accept, chat_tps, chat_t) = found.values()
    said = f"(accept, tok/s at 10, T) by mix: {found}; plain {base:.0f} tok/s at 10"
    assert 2.4 < code_accept < 3.0 and 1.7 < chat_accept < 2.0, said
    assert chat_t is not None and code_t is not None and chat_t < 10 < code_t, said
    # At 10 streams the curves part by about 18 % each way (397 and 272 against 333 tok/s).
    assert base == pytest.approx(plain_tps(10), rel=0.1), said
    assert code_tps > 1.05 * base > base > 1.05 * chat_tps, said
    # Near the model at the accept length served (the batch's mix wanders from the run's).
    assert code_tps == pytest.approx(speculative(10, code_accept), rel=0.15), said
    assert chat_tps == pytest.approx(speculative(10, chat_accept), rel=0.15), said


# ---- the load generator ---------------------------------------------------------------------


def test_the_load_follows_its_schedule_and_completes_every_request(
    standin: Launch,  # noqa: F811 (the fixture)
) -> None:
    """2, then 8, then 4 streams, 2.5 s each: the server's running batch (num_running_reqs,
    read every 0.1 s) reaches the schedule's in the second half of each step and never goes
    past it; the client never has more in flight than the schedule asks when it starts one;
    every request is whole. (Between a request's end and its successor's start the batch is
    one less: beside a busy loop per core the 2-stream step's second half once read [1, 2,
    1, 2]; with 1.5 s steps the 8-stream one read [4, 8, 7], still ramping up.)"""
    server = standin(None, "--enable-metrics", tp=1, knobs=knobs())
    server.wait_log(READY)
    schedule = [(2.5, 2), (2.5, 8), (2.5, 4)]
    load = LoadMix(f"http://127.0.0.1:{server.port}", mix(1, 1), schedule, 20, seed=4)
    start = time.monotonic()
    with sampling(server, "num_running_reqs") as seen:
        outcomes = load.run()

    assert outcomes and all(o.completed and o.tokens == 20 for o in outcomes), [
        o.error for o in outcomes if not o.completed
    ]
    assert {o.name for o in outcomes} == {"code", "chat"}
    assert len(load.starts) == len(outcomes)
    # Started only while fewer than the schedule's streams were in flight: at the moment it
    # started, or within 0.1 s before (a start is judged just before it is recorded).
    assert all(n <= max(load.target(t), load.target(t - 0.1)) for t, n in load.starts), [
        (t, n) for t, n in load.starts if n > max(load.target(t), load.target(t - 0.1))
    ]
    assert max(n for _, n in load.in_flight_log) == 8
    begin = 0.0
    for seconds, concurrency in schedule:
        # A request takes 0.45-0.6 s here: past the step's middle the batch is the new one.
        window = [n for t, n in seen if begin + seconds / 2 <= t - start <= begin + seconds - 0.1]
        assert window and max(window) == concurrency, (concurrency, window)
        begin += seconds
    assert max(n for _, n in seen) == 8


@pytest.mark.lab  # it starts a server
def test_the_load_keeps_an_outcome_for_every_request_whatever_happens(
    failing_server: int,  # noqa: F811 (the fixture)
) -> None:
    """A server that answers in turn whole, with an error event, cut short and 500: each
    request sent has its outcome, the failed ones with why, none lost."""
    load = LoadMix(f"http://127.0.0.1:{failing_server}", mix(1, 1), [(0.5, 3)], 5, seed=5)
    outcomes = load.run()
    assert len(outcomes) == len(load.starts) >= 8
    assert all(o.ended_s is not None for o in outcomes)
    kinds = {(o.error or "completed").split(":")[0] for o in outcomes}
    assert kinds == {"completed", "error event or not JSON", "the stream ended without [DONE]",
                     "HTTP 500"}, kinds  # fmt: skip


def test_a_schedule_mix_or_address_that_cannot_be_run_is_refused() -> None:
    url = "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="schedule"):
        LoadMix(url, mix(1, 1), [(0, 2)], 5, seed=1)
    with pytest.raises(ValueError, match="mix"):
        LoadMix(url, mix(0, 0), [(1, 2)], 5, seed=1)
    with pytest.raises(ValueError, match="loopback"):
        LoadMix("http://10.1.2.3:80", mix(1, 1), [(1, 2)], 5, seed=1)
    load = LoadMix(url, mix(1, 1), [(1.5, 2), (1.0, 8)], 5, seed=1)
    assert [load.target(t) for t in (0, 1.49, 1.5, 2.49, 2.5, 9)] == [2, 2, 8, 8, 0, 0]
