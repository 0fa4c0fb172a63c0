"""A closed-loop load of mixed prompt classes for lab tests: stdlib only.

Streamed POST /v1/completions, each with the prompt of a class drawn (seeded) by the mix's
weights, kept in flight at a concurrency that follows a schedule: ``[(seconds, concurrency),
...]`` holds each concurrency for its seconds, in turn. When the schedule steps down, the
requests in flight run to their end and no new one starts until fewer than the new
concurrency are left; when it ends, no new one starts and those in flight are waited for.
Every request sent has an outcome, whatever happens to it (a status other than 200, an error
event, a stream cut short, a timeout, one still running when the wait ended): none is lost.
Loopback only, as tests/canary_load.py.

    mix = [PromptClass("code", CODE_PROMPT, 3), PromptClass("chat", CHAT_PROMPT, 1)]
    run = LoadMix("http://127.0.0.1:30000", mix, [(2, 4), (2, 16)], max_tokens=56, seed=1)
    outcomes = run.run()  # blocks for the schedule, then for the requests in flight
    assert all(o.completed for o in outcomes)
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from dataclasses import dataclass

from tests.canary_load import loopback_target

# Prompts of two classes a stand-in's accept_by_class can tell apart (CODE_MATCH, CHAT_MATCH).
CODE_PROMPT = "def fibonacci(n):\n    # return the n-th Fibonacci number\n    a, b = 0, 1\n"
CHAT_PROMPT = "Hi! How was your weekend? Tell me about the trip you mentioned."
CODE_MATCH = r"\bdef \w+\("
CHAT_MATCH = r"^(Hi|Hello)\b"


@dataclass(frozen=True)
class PromptClass:
    """A kind of request: its name, its prompt text and its weight in the mix."""

    name: str
    prompt: str
    weight: float


@dataclass
class Outcome:
    """One request sent: its class, when it started and ended (seconds from the run's start),
    the tokens it got (the usage's completion_tokens, else the text's), the chunks they came
    in, and why it did not complete (None: it ended with [DONE] and no error event)."""

    name: str
    started_s: float
    ended_s: float | None = None
    tokens: int = 0
    chunks: int = 0
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.ended_s is not None and self.error is None


class LoadMix:
    """Streamed completions of a prompt mix at a scheduled concurrency; see the module."""

    def __init__(
        self,
        url: str,
        mix: list[PromptClass],
        schedule: list[tuple[float, int]],
        max_tokens: int,
        seed: int,
        *,
        timeout_s: float = 60.0,
        model: str = "default",
    ) -> None:
        if not mix or any(c.weight < 0 for c in mix) or sum(c.weight for c in mix) <= 0:
            raise ValueError("LoadMix: a mix of classes with weights >= 0, not all 0")
        if not schedule or any(s <= 0 or c < 0 for s, c in schedule) or max_tokens < 1:
            raise ValueError(
                "LoadMix: a schedule of (seconds > 0, concurrency >= 0), max_tokens >= 1"
            )
        self.host, self.port, self.path = loopback_target(url)
        self.mix = mix
        self.schedule = schedule
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.model = model
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._outcomes: list[Outcome] = []
        self._threads: list[threading.Thread] = []
        self._in_flight = 0
        self._t0 = 0.0
        # (seconds from the start, requests in flight) at each start and each end: the
        # client's view of its concurrency; and the same at each start alone.
        self.in_flight_log: list[tuple[float, int]] = []
        self.starts: list[tuple[float, int]] = []

    def target(self, at_s: float) -> int:
        """The concurrency the schedule asks for ``at_s`` seconds into the run (0 after it)."""
        return self._step_at(at_s)[1]

    def _step_at(self, at_s: float) -> tuple[float, int]:
        """(when it ends, its concurrency) of the schedule's step at ``at_s``; (at_s, 0) after
        the last one."""
        end = 0.0
        for seconds, concurrency in self.schedule:
            end += seconds
            if at_s < end:
                return end, concurrency
        return at_s, 0

    def run(self) -> list[Outcome]:
        """Run the schedule, wait for the requests in flight (at most timeout_s), and return
        every request's outcome in the order they were sent."""
        self._t0 = time.monotonic()
        end = sum(seconds for seconds, _ in self.schedule)
        with self._cond:
            while (now := self._now()) < end:
                # Each start is judged at its own moment: on a loaded machine a burst of
                # starts judged at one clock read ran past a step's end into a smaller one.
                while self._in_flight < self.target(self._now()):
                    self._send()
                # Wake for a request's end or the next step of the schedule, whichever first.
                self._cond.wait(max(0.001, min(self._step_at(now)[0], end) - now))
            threads = list(self._threads)
        deadline = time.monotonic() + self.timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            for outcome in self._outcomes:
                if outcome.ended_s is None:  # counted, never dropped
                    outcome.error = outcome.error or f"still running after {self.timeout_s} s"
            return list(self._outcomes)

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _send(self) -> None:
        """Start one request (the caller holds the condition)."""
        weights = [c.weight for c in self.mix]
        chosen = self._rng.choices(self.mix, weights)[0]
        outcome = Outcome(chosen.name, self._now())
        self._outcomes.append(outcome)
        self._in_flight += 1
        self.in_flight_log.append((outcome.started_s, self._in_flight))
        self.starts.append((outcome.started_s, self._in_flight))
        thread = threading.Thread(target=self._request, args=(chosen, outcome), daemon=True)
        self._threads.append(thread)
        thread.start()

    def _request(self, chosen: PromptClass, outcome: Outcome) -> None:
        body = {"model": self.model, "prompt": chosen.prompt, "max_tokens": self.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        usage: int | None = None
        finished = False
        try:
            conn.request("POST", self.path, json.dumps(body), {"Content-Type": "application/json"})
            reply = conn.getresponse()
            if reply.status != 200:
                outcome.error = f"HTTP {reply.status}: {reply.read(200)!r}"
                return
            while line := reply.readline():
                data = line.removeprefix(b"data:").strip() if line.startswith(b"data:") else b""
                if data == b"[DONE]":
                    finished = True
                    break
                if not data:
                    continue
                try:
                    chunk = json.loads(data)
                except ValueError:
                    chunk = None
                if not isinstance(chunk, dict) or "error" in chunk:
                    outcome.error = f"error event or not JSON: {data[:200]!r}"
                    continue
                if chunk.get("usage"):
                    usage = int(chunk["usage"].get("completion_tokens") or 0)
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or ""
                    if text:
                        outcome.chunks += 1
                        outcome.tokens += len(text.split())
            if outcome.error is None and not finished:
                outcome.error = "the stream ended without [DONE]"
        except Exception as exc:  # whatever it was, the request has its outcome
            outcome.error = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
            with self._cond:  # ended and out of flight at once
                if usage is not None:
                    outcome.tokens = usage
                outcome.ended_s = self._now()
                self._in_flight -= 1
                self.in_flight_log.append((outcome.ended_s, self._in_flight))
                self._cond.notify_all()
