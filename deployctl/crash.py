"""Find crashes in SGLang server logs and explain them with an ordered signature catalog.

The scanner is pure: it reads text and returns `CrashReport`s. It knows SGLang 0.5.23's log
forms (`[2026-11-29 10:12:33 DP1 TP3] message`), the scheduler's
`Scheduler hit an exception: Traceback …` wrapper whose traceback lines follow unprefixed,
plain and chained Python tracebacks, torch's `[rank3]:[E…]` C++ lines, and one-line fatal
messages. What a crash means, and what to do about it, lives in the catalog
(`data/signatures.yml`, plus the user's own file): an ordered list where the first match wins.
"""

from __future__ import annotations

import heapq
import re
import signal
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from operator import methodcaller
from pathlib import Path

import yaml

SHIPPED_CATALOG = Path(__file__).resolve().parent / "data" / "signatures.yml"

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

_TB_HEADER = "Traceback (most recent call last):"
_CHAIN_SEPARATORS = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)
_IGNORED_MARK = "Exception ignored in"

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
_TIMES = "\u00d7"  # the multiplication sign, spelled out for linters
# Larger ratios are not read as a draft-token count (EAGLE uses a handful to a few dozen).
_MAX_DRAFT_TOKENS = 64

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

_SIGNATURE_KEYS = frozenset(
    {"id", "title", "hint", "exception", "message", "file", "line", "explain", "secondary"}
)
_RULE_KEYS = ("exception", "message", "file", "line")
_TOP_KEYS = frozenset({"version", "context", "signatures"})


class CatalogError(ValueError):
    """A signature catalog file cannot be used; the message names the file."""


@dataclass(frozen=True)
class CrashReport:
    """One distinct crash found in a log, explained by the catalog signature it matched."""

    exception: str
    message: str
    file: str | None
    line: int | None
    function: str | None
    ranks: tuple[str, ...]
    log_line: int
    signature: str
    title: str
    hint: str

    def to_json(self) -> dict[str, object]:
        """Return the report as a JSON-ready dict."""
        return {
            "exception": self.exception,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "ranks": list(self.ranks),
            "signature": self.signature,
            "title": self.title,
            "hint": self.hint,
            "log_line": self.log_line,
        }

    def summary(self) -> str:
        """Return one line: title, exception and a shortened message."""
        message = self.message if len(self.message) <= 160 else self.message[:159] + "…"
        if self.exception:
            return f"{self.title}: {self.exception}: {message}"
        return f"{self.title}: {message}"


@dataclass(frozen=True)
class Signature:
    """One catalog entry: match rules (regexes) plus the title and hint shown to the user."""

    id: str
    title: str
    hint: str
    exception: re.Pattern[str] | None = None
    message: re.Pattern[str] | None = None
    file: re.Pattern[str] | None = None
    line: re.Pattern[str] | None = None
    explain: str | None = None
    secondary: bool = False
    source: str = ""

    @property
    def matches_tracebacks(self) -> bool:
        """Tell whether the signature has a rule for tracebacks (exception, message, file)."""
        return self.exception is not None or self.message is not None or self.file is not None


class Catalog:
    """An ordered list of signatures (first match wins) plus context patterns for hints."""

    def __init__(
        self,
        signatures: Sequence[Signature],
        context: Mapping[str, re.Pattern[str]] | None = None,
    ) -> None:
        self.signatures = tuple(signatures)
        self.context: dict[str, re.Pattern[str]] = dict(context or {})
        self._traceback_signatures = tuple(s for s in self.signatures if s.matches_tracebacks)
        self._line_signatures = tuple(s for s in self.signatures if s.line is not None)
        self._line_triggers = _build_triggers(
            [s.line.pattern for s in self._line_signatures if s.line is not None]
        )
        self.triggers = _build_triggers(
            [s.line.pattern for s in self._line_signatures if s.line is not None]
            + [p.pattern for p in self.context.values()]
        )

    def match_traceback(
        self, exception: str, message: str, file: str | None
    ) -> tuple[Signature, dict[str, str]] | None:
        """Return the first signature matching a traceback's final exception, with its groups."""
        for sig in self._traceback_signatures:
            if sig.exception is not None and not sig.exception.search(exception):
                continue
            groups: dict[str, str] = {}
            if sig.message is not None:
                m = sig.message.search(message)
                if m is None:
                    continue
                groups = {k: v for k, v in m.groupdict().items() if v is not None}
            if sig.file is not None and (file is None or not sig.file.search(file)):
                continue
            return sig, groups
        return None

    def match_line(self, text: str) -> tuple[Signature, re.Match[str]] | None:
        """Return the first signature whose one-line rule matches `text`."""
        if not any(_find(t, text, 0, len(text)) >= 0 for t in self._line_triggers):
            return None  # cheaper than trying every rule on the many lines inside tracebacks
        for sig in self._line_signatures:
            assert sig.line is not None
            m = sig.line.search(text)
            if m is not None:
                return sig, m
        return None


def load_catalog(extra: Sequence[Path] = ()) -> Catalog:
    """Load the shipped catalog, with the signatures of `extra` files placed before it."""
    shipped = _shipped_parts()
    signatures: list[Signature] = []
    context: dict[str, re.Pattern[str]] = dict(shipped[1])
    for path in extra:
        sigs, ctx = _read_catalog_file(Path(path))
        signatures.extend(sigs)
        context.update(ctx)
    signatures.extend(shipped[0])
    return Catalog(signatures, context)


@lru_cache(maxsize=1)
def _shipped_parts() -> tuple[tuple[Signature, ...], dict[str, re.Pattern[str]]]:
    sigs, ctx = _read_catalog_file(SHIPPED_CATALOG)
    return tuple(sigs), ctx


@lru_cache(maxsize=1)
def _default_catalog() -> Catalog:
    return load_catalog()


def _read_catalog_file(path: Path) -> tuple[list[Signature], dict[str, re.Pattern[str]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read signature catalog: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}"
        problem = getattr(exc, "problem", None) or "syntax error"
        raise CatalogError(f"{path}: invalid YAML{where}: {problem}") from None
    return _parse_catalog(data, str(path))


def _parse_catalog(data: object, source: str) -> tuple[list[Signature], dict[str, re.Pattern[str]]]:
    def fail(what: str) -> CatalogError:
        return CatalogError(f"{source}: {what}")

    if data is None:
        return [], {}
    raw_context: object = {}
    if isinstance(data, list):
        raw_signatures: object = data
    elif isinstance(data, dict):
        unknown = sorted(str(k) for k in data if k not in _TOP_KEYS)
        if unknown:
            raise fail(f"unknown top-level key {unknown[0]!r} (expected signatures, context)")
        if data.get("version", 1) != 1:
            raise fail(f"unsupported catalog version {data['version']!r} (expected 1)")
        raw_signatures = data.get("signatures") or []
        raw_context = data.get("context") or {}
    else:
        raise fail("expected a list of signatures or a mapping with 'signatures'")
    if not isinstance(raw_signatures, list):
        raise fail("'signatures' must be a list")
    if not isinstance(raw_context, dict):
        raise fail("'context' must be a mapping of name to regex")

    context: dict[str, re.Pattern[str]] = {}
    for name, pattern in raw_context.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise fail(f"context name {name!r} must be an identifier")
        compiled = _compile_rule(pattern, f"context {name!r}", fail)
        if "value" not in compiled.groupindex:
            raise fail(f"context {name!r}: the regex needs a (?P<value>…) group")
        context[name] = compiled

    signatures: list[Signature] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw_signatures, start=1):
        signatures.append(_parse_signature(entry, index, source, seen, fail))
    return signatures, context


def _parse_signature(
    entry: object,
    index: int,
    source: str,
    seen: set[str],
    fail: Callable[[str], CatalogError],
) -> Signature:
    if not isinstance(entry, dict):
        raise fail(f"signature #{index} must be a mapping")
    sig_id = entry.get("id")
    if not isinstance(sig_id, str) or not sig_id.strip() or any(c.isspace() for c in sig_id):
        raise fail(f"signature #{index} needs an 'id' without spaces")
    where = f"signature {sig_id!r}"
    if sig_id in seen:
        raise fail(f"{where} is defined twice")
    seen.add(sig_id)
    unknown = sorted(str(k) for k in entry if k not in _SIGNATURE_KEYS)
    if unknown:
        raise fail(f"{where}: unknown key {unknown[0]!r}")
    texts: dict[str, str] = {}
    for key in ("title", "hint"):
        value = entry.get(key)
        if not isinstance(value, str) or not value.strip():
            raise fail(f"{where}: '{key}' must be a non-empty string")
        texts[key] = " ".join(value.split())
    rules: dict[str, re.Pattern[str] | None] = {}
    for key in _RULE_KEYS:
        value = entry.get(key)
        rules[key] = None if value is None else _compile_rule(value, f"{where} {key!r}", fail)
    if all(rule is None for rule in rules.values()):
        raise fail(f"{where} has no match rule (exception, message, file or line)")
    explain = entry.get("explain")
    if explain is not None and explain not in _EXPLAINERS:
        known = ", ".join(sorted(_EXPLAINERS))
        raise fail(f"{where}: unknown explain {explain!r} (known: {known})")
    secondary = entry.get("secondary", False)
    if not isinstance(secondary, bool):
        raise fail(f"{where}: 'secondary' must be true or false")
    _check_hint(texts["hint"], where, fail)
    return Signature(
        id=sig_id,
        title=texts["title"],
        hint=texts["hint"],
        exception=rules["exception"],
        message=rules["message"],
        file=rules["file"],
        line=rules["line"],
        explain=explain,
        secondary=secondary,
        source=source,
    )


def _compile_rule(
    value: object, where: str, fail: Callable[[str], CatalogError]
) -> re.Pattern[str]:
    if not isinstance(value, str) or not value:
        raise fail(f"{where} must be a non-empty regex string")
    try:
        return re.compile(value)
    except re.error as exc:
        raise fail(f"{where} is not a valid regex: {exc}") from None


def _check_hint(hint: str, where: str, fail: Callable[[str], CatalogError]) -> None:
    # Hints are str.format templates; only plain names are allowed so rendering cannot reach
    # attributes or raise on a missing index.
    try:
        parsed = list(string.Formatter().parse(hint))
    except ValueError as exc:
        raise fail(f"{where}: bad hint template: {exc}") from None
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier() or (spec and "{" in spec):
            raise fail(f"{where}: hint field {{{name}}} must be a plain name")


# --- hint helpers ------------------------------------------------------------------------


def _explain_tensor_sizes(fields: Mapping[str, str]) -> dict[str, str]:
    """Relate the two mismatched sizes; name the product when it is batch times draft tokens."""
    try:
        a, b = int(fields["a"]), int(fields["b"])
    except (KeyError, ValueError):
        return {"sizes": "The two tensors have different sizes."}
    draft = _int_or_none(fields.get("draft_tokens"))
    big, small = max(a, b), min(a, b)
    big_name, small_name = ("a", "b") if a >= b else ("b", "a")
    parts = [f"Tensor {big_name} has size {big} where tensor {small_name} has {small}"]
    ratio = big // small if small > 1 and big % small == 0 else None
    if ratio is not None:
        parts[0] += f" (ratio {big_name}/{small_name} = {ratio})"
    parts[0] += "."
    speculative = "speculative shapes reached a non-speculative step"
    if draft is not None and draft > 1 and big % draft == 0 and big > draft:
        # The server args name the draft-token count, so the product is known exactly.
        parts.append(
            f"{big} = {big // draft} {_TIMES} {draft} (batch {_TIMES} draft tokens): "
            f"{speculative} (the server args set {draft} draft tokens)."
        )
    elif ratio is not None and ratio <= _MAX_DRAFT_TOKENS:
        parts.append(
            f"{big} = {small} {_TIMES} {ratio}: if {small} is the batch and {ratio} the number "
            f"of draft tokens, {speculative}."
        )
    elif ratio is None:
        parts.append("The sizes are not multiples of each other.")
    return {"sizes": " ".join(parts)}


def _explain_exit_code(fields: Mapping[str, str]) -> dict[str, str]:
    """Turn a negative exit code into the signal that ended the process."""
    code = _int_or_none(fields.get("code"))
    if code is None:
        return {"signal": "exit code unknown"}
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return {"signal": f"exit code {code} = killed by {name}"}
    return {"signal": f"exit code {code}"}


_EXPLAINERS: dict[str, Callable[[Mapping[str, str]], dict[str, str]]] = {
    "tensor-sizes": _explain_tensor_sizes,
    "exit-code": _explain_exit_code,
}


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


class _Fields(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def _render_hint(sig: Signature, fields: dict[str, str]) -> str:
    if sig.explain is not None:
        fields.update(_EXPLAINERS[sig.explain](fields))
    try:
        return sig.hint.format_map(_Fields(fields))
    except (ValueError, TypeError, IndexError):
        return sig.hint


# --- the pre-filter ------------------------------------------------------------------------


def _build_triggers(patterns: Sequence[str]) -> tuple[str | re.Pattern[str], ...]:
    """Return what finds every line worth a closer look: literals where possible, else regexes.

    Each rule is reduced to a literal it cannot match without, searched with str.find at GB/s
    (CPython's re runs an alternation of literals at ~20 MB/s); rules with no such literal are
    searched whole.
    """
    literals = {_TB_HEADER, _IGNORED_MARK}
    whole: list[re.Pattern[str]] = []
    for pattern in patterns:
        anchors = _literal_anchors(pattern)
        if anchors is None:
            # Rules are searched in a line's message, so drop a leading ^ for the text search.
            bare = re.sub(r"^(\(\?[aiLmsux]+\))?\^", r"\1", pattern)
            try:
                whole.append(re.compile(bare, re.MULTILINE))
            except re.error:
                whole.append(re.compile(r"[^\n]"))  # unknowable: look at every line
        else:
            literals.update(anchors)
    return (*sorted(literals), *whole)


def _find(trigger: str | re.Pattern[str], text: str, pos: int, end: int) -> int:
    if isinstance(trigger, str):
        return text.find(trigger, pos, end)
    m = trigger.search(text, pos, end)
    return -1 if m is None else m.start()


_QUANTIFIER = re.compile(r"\{\d*(?:,\d*)?\}")


def _literal_anchors(pattern: str) -> list[str] | None:
    """Return literals of which every match of `pattern` contains one, or None if unknown."""
    if re.match(r"\(\?[aiLmsux]*[ix]", pattern):
        return None  # case-insensitive or verbose: literals do not hold
    alternatives: list[list[str]] = [[]]
    run: list[str] = []
    depth = 0
    i, n = 0, len(pattern)

    def close() -> None:
        if run and depth == 0:
            alternatives[-1].append("".join(run))
        run.clear()

    while i < n:
        c = pattern[i]
        literal: str | None = None
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            i += 2
            if nxt and not nxt.isalnum():
                literal = nxt
            else:
                close()
                continue
        elif c == "[":
            close()
            i = _skip_class(pattern, i)
            continue
        elif c == "(":
            close()
            depth += 1
            i += 1
            continue
        elif c == ")":
            close()
            depth -= 1
            i += 1
            continue
        elif c == "|":
            close()
            if depth == 0:
                alternatives.append([])
            i += 1
            continue
        elif c in "?*{":
            m = _QUANTIFIER.match(pattern, i) if c == "{" else None
            if c != "{" or m is not None:
                if run:
                    run.pop()  # the quantified character may be absent
                close()
                i = m.end() if m is not None else i + 1
                continue
            literal = c
            i += 1
        elif c in "+.^$":
            close()  # `+` keeps the character but ends the run; the rest match no literal
            i += 1
            continue
        else:
            literal = c
            i += 1
        if depth == 0:
            run.append(literal)
    close()
    if depth != 0:
        return None
    anchors: list[str] = []
    for alternative in alternatives:
        best = max(alternative, key=len, default="")
        if len(best) < 3:
            return None
        anchors.append(best)
    return anchors


def _skip_class(pattern: str, i: int) -> int:
    """Return the index just past the character class starting at `pattern[i]`."""
    j = i + 1
    if pattern[j : j + 1] == "^":
        j += 1
    if pattern[j : j + 1] == "]":
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "]":
            return j + 1
        j += 1
    return len(pattern)


# --- the scanner ---------------------------------------------------------------------------


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
    settled: int = 0
    emitted: bool = False

    @property
    def alive(self) -> bool:
        return bool(self.members) or self.settled > 0

    def settle(self, line: int, rank: str | None) -> None:
        """Count one occurrence for good."""
        self.settled += 1
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
            hint=_render_hint(self.signature, fields),
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
        self._catalog = catalog if catalog is not None else _default_catalog()
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
                message.rstrip().endswith(_TB_HEADER)
                or self._catalog.match_line(message) is not None
            )
        t = _TORCH_RANK.match(text)
        if t is not None:
            return self._catalog.match_line(text[t.end() :]) is not None
        stripped = text.strip()
        if stripped.endswith(_TB_HEADER) or stripped in _CHAIN_SEPARATORS:
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
            at = _find(trigger, text, pos, end)
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
                at = _find(triggers[index], text, pos, end)
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
        if tb.crash is not None:
            tb.crash.members.remove(tb)
            tb.crash.settle(tb.start, tb.rank)
            tb.crash = None

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
            if message.rstrip().endswith(_TB_HEADER):
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
        if stripped.endswith(_TB_HEADER) and not line[0].isspace():
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
        if line.startswith(_IGNORED_MARK):
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
            elif continuing is not None:
                continuing.last = n
            return
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
            tb.crash = None

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
