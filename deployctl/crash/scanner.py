"""The log scanner: line shapes, traceback parsing, and `CrashScanner` with its helpers."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from operator import methodcaller

from deployctl.crash.catalog import Catalog, Signature, default_catalog, render_hint
from deployctl.crash.model import CrashReport
from deployctl.crash.prefilter import IGNORED_MARK, TB_HEADER, find

# The longest text a report keeps from one log line.
STORED_LINE_CAP = 4000
# The longest prefix of one line that is matched at all: SGLang's `server_args=` dump is a
# single ~20 kB line and carries the speculative settings a hint may need.
SCAN_LINE_CAP = 65536
# An unfinished traceback that receives no line for this long is abandoned (its writer died).
_STALE_LINES = 2000
# How far after an exception line a chained traceback may still continue it.
_CHAIN_WINDOW = 200
# scan_lines() hands the scanner this many lines at a time.
_BATCH_LINES = 8192
_ENDS_WITH_NEWLINE = methodcaller("endswith", "\n")

_CHAIN_SEPARATORS = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)

# SGLang's logging prefix; rank parts (DP1, PP0, ATTN_CP2, MOE_DP1, TP3, EP3) only appear when
# that parallelism is > 1, and SGLANG_LOG_MS adds milliseconds.
_PREFIX = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?((?: [A-Z][A-Z_]*\d+)*)\] ?")
_TORCH_RANK = re.compile(r"\[rank(\d+)\]:")
_RANK_IN_TEXT = re.compile(r"\[Rank (\d+)\]")
_FRAME = re.compile(r'\s+File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<func>.+?))?\s*$')
_CARET = re.compile(r"\s+[\^~]+\s*$")
_EXC_LINE = re.compile(r"(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::(?:\s+(?P<msg>.*))?)?\s*$")
_CRASHY_TYPE = re.compile(r"(?:Error|Exception|Exit|Interrupt|Timeout|Failure)$")
_DIGITS = re.compile(r"\d+")

# Traceback parse states; the name says what the last accepted line was.
_HEAD, _FRAME_SEEN, _SRC, _CARET_SEEN, _EXC, _SEP = range(6)
# Line kinds offered to open tracebacks.
_K_FRAME, _K_SRC, _K_CARET, _K_EXC = range(4)
# Which open traceback expects a line of each kind; the first tier is the usual shape, the
# second covers frames without source (`<frozen runpy>`) and multi-line source.
_EXPECTED: dict[int, tuple[frozenset[int], frozenset[int]]] = {
    _K_FRAME: (frozenset({_HEAD, _SRC, _CARET_SEEN}), frozenset({_FRAME_SEEN})),
    _K_SRC: (frozenset({_FRAME_SEEN}), frozenset({_SRC, _CARET_SEEN})),
    _K_CARET: (frozenset({_SRC}), frozenset({_CARET_SEEN})),
    _K_EXC: (frozenset({_SRC, _CARET_SEEN}), frozenset({_FRAME_SEEN})),
}


@dataclass(eq=False)
class _Traceback:
    rank: str | None
    start: int
    last: int
    ignored: bool = False
    state: int = _HEAD
    file: str | None = None
    lineno: int | None = None
    function: str | None = None
    exception: str = ""
    message: str = ""
    crash: _Crash | None = None
    # The crash a chain separator took back; it counts again if the chained exception never
    # arrives (the log was cut off, or the writer died mid-traceback).
    withdrawn: _Crash | None = None


@dataclass(eq=False)
class _Crash:
    order: int
    signature: Signature
    groups: dict[str, str]
    exception: str
    message: str
    file: str | None
    line: int | None
    function: str | None
    # Tracebacks that a chained exception may still take back; the others are folded into
    # `ranks`, `first` and `settled` so a crash repeated a million times stays small.
    members: list[_Traceback] = field(default_factory=list)
    ranks: set[str] = field(default_factory=set)
    first: int | None = None
    settled: bool = False  # an occurrence that no chained exception can take back
    emitted: bool = False

    @property
    def alive(self) -> bool:
        return bool(self.members) or self.settled

    def settle(self, line: int, rank: str | None) -> None:
        """Count one occurrence for good."""
        self.settled = True
        self.first = line if self.first is None else min(self.first, line)
        if rank:
            self.ranks.add(rank)

    def report(self, context: Mapping[str, str]) -> CrashReport:
        ranks = self.ranks | {m.rank for m in self.members if m.rank}
        starts = [m.start for m in self.members]
        first = min(starts + ([self.first] if self.first is not None else []))
        fields = dict(context)
        fields.update(
            exception=self.exception,
            message=self.message,
            file=self.file or "?",
            line=str(self.line) if self.line is not None else "?",
            function=self.function or "?",
        )
        fields.update(self.groups)
        return CrashReport(
            exception=self.exception,
            message=self.message,
            file=self.file,
            line=self.line,
            function=self.function,
            ranks=tuple(sorted(ranks, key=_rank_key)),
            log_line=first,
            signature=self.signature.id,
            title=self.signature.title,
            hint=render_hint(self.signature, fields),
        )


def _rank_key(rank: str) -> tuple[tuple[str, int], ...]:
    return tuple((name, int(num)) for name, num in re.findall(r"([A-Za-z_]+)(\d+)", rank))


def _is_exception_type(name: str) -> bool:
    # Logger level names (`ERROR:    …` from uvicorn) are not exception types.
    return not name.rsplit(".", 1)[-1].isupper()


class CrashScanner:
    """Scan a log incrementally: feed text as it arrives, get each new crash once.

    `feed` returns a crash as soon as its first copy is complete; later copies from other
    ranks are merged silently, and `reports` always holds the merged, final view.
    """

    def __init__(self, catalog: Catalog | None = None, start_line: int = 1) -> None:
        self._catalog = catalog if catalog is not None else default_catalog()
        self._next_line = start_line
        self._pieces: list[str] = []
        self._pending_len = 0
        self._overflow = False
        self._tbs: list[_Traceback] = []
        self._crashes: dict[tuple[object, ...], _Crash] = {}
        self._new: list[_Crash] = []
        self._context: dict[str, str] = {}
        self._ignore_line = -1
        self._alive = 0  # crashes with at least one occurrence

    @property
    def reports(self) -> list[CrashReport]:
        """Return every crash found so far, merged across ranks, in log order."""
        alive = [c for c in self._crashes.values() if c.alive]
        reports = [(c.report(self._context), c.order) for c in alive]
        return [r for r, _ in sorted(reports, key=lambda ro: (ro[0].log_line, ro[1]))]

    def feed(self, text: str) -> list[CrashReport]:
        """Scan the next chunk of the log; return crashes completed in it that are new."""
        last_nl = text.rfind("\n")
        if last_nl < 0:
            self._hold(text)
            return []
        start = 0
        if self._pieces:
            start = text.find("\n") + 1
            self._hold(text[: min(start - 1, SCAN_LINE_CAP)])
            self._flush_partial()
        self._scan(text, start, last_nl + 1)
        self._hold(text[last_nl + 1 :])
        return self._emit()

    def finish(self) -> list[CrashReport]:
        """End the stream: scan a last unterminated line and return what is still unreported."""
        if self._pieces:
            self._flush_partial()
        # A traceback cut off before its exception line names no exception: nothing to report.
        for tb in self._tbs:
            self._settle(tb)
        self._tbs.clear()
        return self._emit()

    def is_crash_line(self, line: str) -> bool:
        """Tell whether a line starts or belongs to a crash (judged by its text alone)."""
        text = _clean(line.rstrip("\n")[:SCAN_LINE_CAP])
        m = _PREFIX.match(text)
        if m is not None:
            message = text[m.end() :]
            return (
                message.rstrip().endswith(TB_HEADER)
                or self._catalog.match_line(message) is not None
            )
        t = _TORCH_RANK.match(text)
        if t is not None:
            return self._catalog.match_line(text[t.end() :]) is not None
        stripped = text.strip()
        if stripped.endswith(TB_HEADER) or stripped in _CHAIN_SEPARATORS:
            return True
        if _FRAME.match(text) or _CARET.match(text):
            return True
        if stripped.startswith("what():") or stripped.startswith("terminate called after"):
            return True
        e = _EXC_LINE.match(text)
        if e is not None and _is_exception_type(e["type"]) and _CRASHY_TYPE.search(e["type"]):
            return True
        return self._catalog.match_line(text) is not None

    # -- chunk handling --

    def _hold(self, text: str) -> None:
        """Keep an unterminated line for the next feed, capped at SCAN_LINE_CAP."""
        if not text or self._overflow:
            return
        room = SCAN_LINE_CAP - self._pending_len
        if len(text) > room:
            text = text[:room]
            self._overflow = True
        self._pieces.append(text)
        self._pending_len += len(text)

    def _flush_partial(self) -> None:
        """Scan the held line as a complete one."""
        line = "".join(self._pieces) + "\n"
        self._pieces.clear()
        self._pending_len = 0
        self._overflow = False
        self._scan(line, 0, len(line))

    def _emit(self) -> list[CrashReport]:
        fresh = [c for c in self._new if c.alive and not c.emitted]
        self._new.clear()
        for crash in fresh:
            crash.emitted = True
        reports = [(c.report(self._context), c.order) for c in fresh]
        return [r for r, _ in sorted(reports, key=lambda ro: (ro[0].log_line, ro[1]))]

    def _scan(self, text: str, pos: int, end: int) -> None:
        """Process the complete lines in text[pos:end], skipping quiet stretches at C speed."""
        triggers = self._catalog.triggers
        heap: list[tuple[int, int]] = []
        for index, trigger in enumerate(triggers):
            at = find(trigger, text, pos, end)
            if at >= 0:
                heap.append((at, index))
        heapq.heapify(heap)
        while pos < end:
            if self._busy():
                # Inside a traceback every line counts: take them one by one.
                nl = text.find("\n", pos, end)
                self._line(text[pos : min(nl, pos + SCAN_LINE_CAP)])
                pos = nl + 1
                continue
            while heap and heap[0][0] < pos:
                _, index = heapq.heappop(heap)
                at = find(triggers[index], text, pos, end)
                if at >= 0:
                    heapq.heappush(heap, (at, index))
            if not heap:
                self._next_line += text.count("\n", pos, end)
                return
            before = text.rfind("\n", pos, heap[0][0])
            line_start = pos if before < 0 else before + 1
            self._next_line += text.count("\n", pos, line_start)
            nl = text.find("\n", line_start, end)
            self._line(text[line_start : min(nl, line_start + SCAN_LINE_CAP)])
            pos = nl + 1

    def _busy(self) -> bool:
        """Drop finished or abandoned tracebacks; tell whether any still needs lines."""
        if not self._tbs:
            return False
        n = self._next_line
        keep = []
        for tb in self._tbs:
            window = _CHAIN_WINDOW if tb.state in (_EXC, _SEP) else _STALE_LINES
            if n - tb.last <= window:
                keep.append(tb)
            else:
                self._settle(tb)
        self._tbs = keep
        return bool(keep)

    def _settle(self, tb: _Traceback) -> None:
        """Make a traceback's part in its crash final: no chained exception can follow now."""
        if tb.crash is None and tb.withdrawn is not None and tb.state != _EXC:
            crash = tb.withdrawn  # the chained exception never came: the first one stands
            if not crash.alive:
                self._alive += 1
                self._new.append(crash)
            crash.settle(tb.start, tb.rank)
        elif tb.crash is not None:
            tb.crash.members.remove(tb)
            tb.crash.settle(tb.start, tb.rank)
        tb.crash = tb.withdrawn = None

    # -- one line --

    def _line(self, raw: str) -> None:
        n = self._next_line
        self._next_line += 1
        line = _clean(raw)
        for name, pattern in self._catalog.context.items():
            m = pattern.search(line)
            if m is not None:
                self._context[name] = m["value"]
        m = _PREFIX.match(line)
        if m is not None:
            rank = " ".join(m.group(1).split()) or None
            message = line[m.end() :]
            if message.rstrip().endswith(TB_HEADER):
                self._tbs.append(_Traceback(rank=rank, start=n, last=n))
            else:
                self._fatal(message, rank, n)
            return
        t = _TORCH_RANK.match(line)
        if t is not None:
            self._fatal(line[t.end() :], f"rank{t.group(1)}", n)
            return
        self._raw(line, n)

    def _raw(self, line: str, n: int) -> None:
        stripped = line.strip()
        if not stripped:
            return
        if stripped.endswith(TB_HEADER) and not line[0].isspace():
            waiting = self._newest({_SEP})
            if waiting is not None:
                waiting.state, waiting.last = _HEAD, n
                waiting.file = waiting.lineno = waiting.function = None
            else:
                ignored = n == self._ignore_line
                self._tbs.append(_Traceback(rank=None, start=n, last=n, ignored=ignored))
            return
        if stripped in _CHAIN_SEPARATORS:
            done = self._newest({_EXC})
            if done is not None:
                self._detach(done)
                done.state, done.last = _SEP, n
            return
        if line.startswith(IGNORED_MARK):
            self._ignore_line = n + 1
            return
        continuing = self._continuation(n)
        if line[0].isspace():
            frame = _FRAME.match(line)
            kind = _K_FRAME if frame else _K_CARET if _CARET.match(line) else _K_SRC
            tb = self._pick(kind)
            if tb is not None:
                tb.last = n
                if frame is not None:
                    tb.state = _FRAME_SEEN
                    tb.file = frame["file"][:STORED_LINE_CAP]
                    tb.lineno = int(frame["line"])
                    tb.function = frame["func"]
                else:
                    tb.state = _CARET_SEEN if kind == _K_CARET else _SRC
            elif continuing is not None:
                continuing.last = n
            # Otherwise an orphan (e.g. the tail of a traceback cut off by a mid-log start).
            return
        e = _EXC_LINE.match(line)
        if e is not None and _is_exception_type(e["type"]):
            tb = self._pick(_K_EXC)
            if tb is not None:
                self._complete(tb, e["type"], (e["msg"] or "").strip(), n)
                return
            # No traceback to end: a `tool: message` line, which a line rule may know
            # (`slurmstepd: error: *** JOB 12 … DUE TO TIME LIMIT ***`).
        if continuing is not None:
            continuing.last = n  # more lines of a multi-line exception message
            return
        self._fatal(line, None, n)

    def _newest(self, states: set[int]) -> _Traceback | None:
        for tb in reversed(self._tbs):
            if tb.state in states:
                return tb
        return None

    def _pick(self, kind: int) -> _Traceback | None:
        """Choose the open traceback a raw line belongs to: the newest that expects it."""
        for states in _EXPECTED[kind]:
            for tb in reversed(self._tbs):
                if tb.state in states:
                    return tb
        return None

    def _continuation(self, n: int) -> _Traceback | None:
        for tb in reversed(self._tbs):
            if tb.state == _EXC and tb.last == n - 1:
                return tb
        return None

    def _active(self, besides: _Traceback | None = None) -> bool:
        """Tell whether a crash is already known or under way (secondary signatures defer)."""
        if self._alive > 0:
            return True
        return any(tb is not besides and tb.state != _EXC and not tb.ignored for tb in self._tbs)

    def _complete(self, tb: _Traceback, exception: str, message: str, n: int) -> None:
        tb.state, tb.last = _EXC, n
        tb.withdrawn = None  # the chained exception came: it is the one that counts
        tb.exception, tb.message = exception, message[:STORED_LINE_CAP]
        if tb.ignored:
            return
        match = self._catalog.match_traceback(exception, tb.message, tb.file)
        if match is None:
            return
        sig, groups = match
        if sig.secondary and self._active(besides=tb):
            return
        key = ("tb", exception, _DIGITS.sub("#", tb.message), tb.file, tb.lineno, tb.function)
        crash = self._crashes.get(key)
        if crash is None:
            crash = _Crash(
                order=len(self._crashes),
                signature=sig,
                groups=groups,
                exception=exception,
                message=tb.message,
                file=tb.file,
                line=tb.lineno,
                function=tb.function,
            )
            self._crashes[key] = crash
        if not crash.alive:
            self._new.append(crash)
            self._alive += 1
        crash.members.append(tb)
        tb.crash = crash

    def _detach(self, tb: _Traceback) -> None:
        """Take back a traceback's report: a chained exception follows and is the real one."""
        if tb.crash is not None:
            tb.crash.members.remove(tb)
            if not tb.crash.alive:
                self._alive -= 1
            tb.withdrawn, tb.crash = tb.crash, None

    def _fatal(self, text: str, rank: str | None, n: int) -> None:
        match = self._catalog.match_line(text)
        if match is None:
            return
        sig, m = match
        if sig.secondary and self._active():
            return
        if rank is None:
            r = _RANK_IN_TEXT.search(text)
            rank = f"rank{r.group(1)}" if r else None
        message = text[m.start() :].strip()[:STORED_LINE_CAP]
        key = ("line", sig.id, _DIGITS.sub("#", message))
        crash = self._crashes.get(key)
        if crash is None:
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            crash = _Crash(
                order=len(self._crashes),
                signature=sig,
                groups=groups,
                exception="",
                message=message,
                file=None,
                line=None,
                function=None,
            )
            self._crashes[key] = crash
        if not crash.alive:
            self._new.append(crash)
            self._alive += 1
        crash.settle(n, rank)


def _clean(line: str) -> str:
    """Strip line endings; of a carriage-return-overwritten line keep what a terminal shows."""
    line = line.rstrip("\r\n")
    if "\r" in line:
        line = line[line.rfind("\r") + 1 :]
    return line


def scan_lines(
    lines: Iterable[str], catalog: Catalog | None = None, start_line: int = 1
) -> list[CrashReport]:
    """Scan log lines (numbered from `start_line`) and return the crashes found."""
    scanner = CrashScanner(catalog, start_line)
    source = iter(lines)
    # Batches keep the per-line Python work to C-level joins; the scanner does the rest.
    while batch := list(islice(source, _BATCH_LINES)):
        if not all(map(_ENDS_WITH_NEWLINE, batch)):
            batch = [line if line.endswith("\n") else line + "\n" for line in batch]
        scanner.feed("".join(batch))
    scanner.finish()
    return scanner.reports


def scan_text(text: str, catalog: Catalog | None = None) -> list[CrashReport]:
    """Scan a whole log text (or its tail: leading orphan lines are ignored)."""
    scanner = CrashScanner(catalog)
    scanner.feed(text)
    scanner.finish()
    return scanner.reports
