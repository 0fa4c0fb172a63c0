"""The decode model behind /generate and /v1/completions: one scheduler loop stepping over
the running requests, with speculation, cold starts and slowdowns, and its statistics."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from .log_lines import log
from .ranks import sleep_until
from .request_metrics import RequestMetrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


def prompt_tokens(request: dict[str, Any]) -> int:
    """A request's prompt length: its input_ids, else its words."""
    ids = request.get("input_ids")
    text = request.get("text", request.get("prompt", ""))
    return len(ids) if isinstance(ids, list) else len(str(text).split())


def prompt_text(request: dict[str, Any] | None) -> str:
    """A request's prompt as text: /generate's "text", /v1/completions' "prompt" (a list of
    them joined), a chat request's messages' contents; "" for token ids alone."""
    if not request:
        return ""
    found = request.get("text", request.get("prompt"))
    if found is None and isinstance(request.get("messages"), list):
        contents = [m.get("content") for m in request["messages"] if isinstance(m, dict)]
        # A message's content is its text, or a list of parts, the text ones {"text": …}.
        found = [p for c in contents for p in (c if isinstance(c, list) else [c])]
    if isinstance(found, list):
        parts = [p.get("text") if isinstance(p, dict) else p for p in found]
        return "\n".join(p for p in parts if isinstance(p, str))
    return found if isinstance(found, str) else ""


class DecodeRequest:
    """One request in the decode loop, with the times its metrics need."""

    __slots__ = (
        "aborted", "accept", "arrived", "carry", "last", "left", "out", "prompt_len", "sent",
        "streaming",
    )  # fmt: skip

    def __init__(
        self, tokens: int, out: Any, streaming: bool, accept: float = 1.0, prompt_len: int = 0
    ) -> None:
        self.left = max(1, tokens)
        self.accept = accept  # its tokens per speculative step, on average
        self.carry = 0.0  # the fraction of a token its speculative steps owe it
        self.prompt_len = prompt_len
        self.out = out  # a queue of the tokens each step gives it
        self.streaming = streaming
        self.arrived = time.time()
        self.last: float | None = None  # when its last tokens came out
        self.sent = 0
        self.aborted = False

    def drafted(self) -> int:
        """The tokens a speculative step gives it: its accept length, the fraction carried
        to its next step, so that over its steps it averages exactly that."""
        owed = self.accept + self.carry
        tokens = math.floor(owed + 1e-9)
        self.carry = owed - tokens
        return tokens


class ColdStart:
    """The `cold` knob: the first `steps` decode steps at each batch size are `factor` times
    slower; with `persist`, the batch sizes that got past them are kept in `path`."""

    def __init__(self, knob: dict[str, Any], path: str | None) -> None:
        self.factor, self.steps = float(knob["factor"]), int(knob["steps"])
        self.path = path if knob["persist"] else None
        self.taken: dict[int, int] = {}  # batch size -> cold steps taken by this server
        self.warm: set[int] = set()
        if self.path is not None:
            with contextlib.suppress(OSError, ValueError), open(self.path, encoding="utf-8") as f:
                self.warm = {int(b) for b in json.load(f)}

    def factor_for(self, batch: int) -> float:
        """How much slower this step over `batch` requests is (counted as taken)."""
        if batch in self.warm:
            return 1.0
        self.taken[batch] = self.taken.get(batch, 0) + 1
        if self.taken[batch] >= self.steps:
            self.warm.add(batch)
            if self.path is not None:  # once a batch size: written whole, then renamed
                part = f"{self.path}.{os.getpid()}"
                with open(part, "w", encoding="utf-8") as f:
                    json.dump(sorted(self.warm), f)
                os.replace(part, self.path)
        return self.factor


class DecodeStats:
    """0.5.23's decode statistics (MetricsReporter.report_decode_stats): every `interval`
    decode steps the scheduler logs a `Decode batch` line and sets its gauges from the steps
    since the last one. With speculation the accept length is their tokens over their
    request-steps (update_spec_metrics adds each step's batch size and the tokens it gave: a
    plain step of a speculative server, past its threshold, counts 1 a request), and the
    accept rate the drafts accepted over those proposed. Callers hold the decoder's lock."""

    def __init__(
        self,
        interval: int = 0,
        speculative: bool = False,
        draft_per_round: int = 0,
        graph_max_bs: int | None = None,
        prefix: str = "",
        extra: Callable[[], str] | None = None,
    ) -> None:
        self.interval = interval  # 0: no lines (the decoder alone, in unit tests)
        self.speculative = speculative
        self.draft_per_round = draft_per_round
        self.graph_max_bs = graph_max_bs  # None: CUDA graphs off
        self.prefix = prefix
        self.extra = extra  # PD decode's queue figures
        self.steps = 0
        self.tokens = 0  # since the last line
        self.spec_tokens = 0
        self.spec_forwards = 0
        self.since = time.perf_counter()
        self.accept_length = 0.0  # the gauges, as of the last line
        self.accept_rate = 0.0

    def step(self, batch: int, served: int, forwards: int, kv_tokens: int) -> None:
        """One decode step over ``batch`` requests: ``served`` tokens to ``forwards`` of them
        (an aborted one's last step gives it none), ``kv_tokens`` held by those running."""
        self.steps += 1
        self.tokens += served
        if self.speculative:
            self.spec_tokens += served
            self.spec_forwards += forwards
        if self.interval <= 0 or self.steps % self.interval:
            return
        now = time.perf_counter()
        throughput = self.tokens / max(now - self.since, 1e-9)
        self.since, self.tokens = now, 0
        msg = f"Decode batch, #running-req: {batch}, #token: {kv_tokens}, token usage: 0.00, "
        if self.speculative:
            forwards_seen = max(self.spec_forwards, 1)
            self.accept_length = self.spec_tokens / forwards_seen
            proposed = forwards_seen * self.draft_per_round
            correct = self.spec_tokens - self.spec_forwards
            self.accept_rate = correct / proposed if proposed > 0 else 0.0
            self.spec_tokens = self.spec_forwards = 0
            msg += f"accept len: {self.accept_length:.2f}, accept rate: {self.accept_rate:.2f}, "
        if self.extra is not None:
            msg += self.extra()
        graph = self.graph_max_bs is not None and batch <= self.graph_max_bs
        log(
            f"{msg}cuda graph: {graph}, gen throughput (token/s): {throughput:.2f}, #queue-req: 0",
            self.prefix,
        )


def accept_classes(knob: list[dict[str, Any]]) -> list[tuple[re.Pattern[str], float]]:
    """The `accept_by_class` knob (checked by accept_by_class_knob) compiled, in order."""
    return [(re.compile(c["match"]), float(c["accept_len"])) for c in knob]


class Decoder:
    """The decode model: one scheduler loop stepping over the running requests."""

    def __init__(
        self,
        knobs: dict[str, Any],
        speculative: bool,
        threshold: int | None,
        adaptive: Callable[[int], int] | None = None,
        cold_cache: str | None = None,
    ) -> None:
        import queue

        self.queue_type = queue.Queue
        self.knobs = knobs
        self.speculative = speculative
        self.threshold = threshold
        self.adaptive = adaptive  # batch -> draft steps, with --speculative-adaptive
        self.cold = ColdStart(knobs["cold"], cold_cache) if knobs["cold"] else None
        # Called at the first step speculation's threshold makes plain (crash "above_threshold").
        self.on_plain_fallback: Callable[[], None] | None = None
        self.thresholded = False  # speculation turns off above some batch size
        self.running: list[DecodeRequest] = []
        self.cond = threading.Condition()
        self.emitted: list[tuple[float, int]] = []  # (time, tokens) of recent steps
        self.metrics = RequestMetrics()  # kept under self.cond
        # Silent here; the Launcher gives it one that logs its `Decode batch` lines.
        self.stats = DecodeStats(speculative=speculative)
        self.classes = accept_classes(knobs["accept_by_class"])
        threading.Thread(target=self.loop, daemon=True).start()

    def accept_for(self, prompt: str) -> float:
        """The accept length of a request with this prompt: its class's, else accept_len."""
        found = (a for pattern, a in self.classes if pattern.search(prompt))
        return next(found, float(self.knobs["accept_len"]))

    def submit(
        self, tokens: int, streaming: bool = True, body: dict[str, Any] | None = None
    ) -> DecodeRequest:
        """Add a request (its HTTP body gives its prompt) to the running batch."""
        accept = self.accept_for(prompt_text(body))
        length = prompt_tokens(body) if body else 0
        request = DecodeRequest(tokens, self.queue_type(), streaming, accept, length)
        with self.cond:
            self.running.append(request)
            self.cond.notify()
        return request

    def abort(self, request: DecodeRequest) -> None:
        """Its client went away: counted at once (TokenizerManager.abort_request); the
        request leaves the batch after the step under way (the scheduler's to_finish)."""
        with self.cond:
            if request.left > 0 and not request.aborted:
                request.aborted = True
                self.metrics.count("num_aborted_requests_total", "")

    @contextlib.contextmanager
    def aborted_when_gone(self, request: DecodeRequest) -> Iterator[None]:
        """Abort ``request`` when writing to its client fails (the client went away)."""
        try:
            yield
        except ConnectionError:
            self.abort(request)
            raise

    def _tokens_out(self, request: DecodeRequest, n: int, now: float) -> None:
        """TokenizerManager.collect_metrics for one output: a streamed request's first one
        is its TTFT, each later one its gap (n tokens, gap / n each); a request finished
        (aborted too) counts with the tokens it got."""
        metrics = self.metrics
        request.sent += n
        if request.streaming and not request.aborted:
            if request.last is None:
                metrics.observe("time_to_first_token_seconds", "true", now - request.arrived)
            else:
                metrics.observe("inter_token_latency_seconds", "", now - request.last, n)
        request.last = now
        if request.left > 0 and not request.aborted:
            return
        streaming = "true" if request.streaming else "false"
        if not request.streaming and not request.aborted:  # its one output is its first
            metrics.observe("time_to_first_token_seconds", streaming, now - request.arrived)
        metrics.count("generation_tokens_total", streaming, request.sent)
        metrics.count("num_requests_total", streaming)
        metrics.observe("e2e_request_latency_seconds", streaming, now - request.arrived)

    def speculates(self, batch: int) -> bool:
        """Say whether a step over ``batch`` requests drafts (threshold and adaptive slot)."""
        if not self.speculative or self.switched_off(batch):
            return False
        return self.adaptive is None or self.adaptive(batch) > 0

    def switched_off(self, batch: int) -> bool:
        """Say whether --speculative-disable-batch-threshold turns a step over ``batch``
        requests plain (the patched server's off state, not an adaptive 0-step slot)."""
        return self.speculative and self.threshold is not None and batch > self.threshold

    def step(self, batch: int) -> tuple[float, bool]:
        """(seconds, whether it drafts) of one step over `batch` requests."""
        k = self.knobs
        drafts = self.speculates(batch)
        if drafts:
            slow = float(k["threshold_slowdown"]) if self.thresholded else 1.0
            seconds = (k["spec_step_ms"] + k["spec_per_req_ms"] * batch) / 1000 * slow
        else:
            seconds = (k["step_ms"] + k["per_req_ms"] * batch) / 1000
            if self.switched_off(batch):
                seconds *= float(k["off_state_slowdown"])
        slowdown = k["slowdown"]
        if slowdown is not None and batch >= slowdown["min_batch"]:
            seconds *= slowdown["factor"]
        if self.cold is not None:
            seconds *= self.cold.factor_for(batch)
        return seconds, drafts

    def loop(self) -> None:
        # Steps keep to a clock: the time the loop and the streams spend on the CPU between
        # two steps is part of the next step's time, not added to it, so a busy machine
        # moves the curves only when it cannot keep up at all.
        due = time.time()
        while True:
            with self.cond:
                while not self.running:
                    self.cond.wait()
                    due = time.time()  # idle: the next step starts now
                batch = list(self.running)
            if (
                self.on_plain_fallback is not None
                and self.speculative
                and not self.speculates(len(batch))
            ):
                self.on_plain_fallback()
                threading.Event().wait()  # the schedulers are dead: no token comes any more
            seconds, drafts = self.step(len(batch))
            due = max(due, time.time() - seconds) + seconds  # behind by a step at most
            sleep_until(due)
            total = forwards = 0
            with self.cond:
                now = time.time()
                for entry in batch:
                    # An aborted request runs this last step, its token thrown away.
                    n = 0 if entry.aborted else min(entry.drafted() if drafts else 1, entry.left)
                    entry.left -= n
                    total += n
                    forwards += n > 0
                    self._tokens_out(entry, n, now)
                    if n:
                        entry.out.put(n)
                    if entry.left <= 0 or entry.aborted:
                        self.running.remove(entry)
                self.emitted = [e for e in self.emitted if e[0] > now - 1.0] + [(now, total)]
                kv_tokens = sum(e.prompt_len + e.sent for e in self.running)
                self.stats.step(len(batch), total, forwards, kv_tokens)

    def gen_throughput(self) -> float:
        now = time.time()
        with self.cond:
            return float(sum(n for t, n in self.emitted if t > now - 1.0))
