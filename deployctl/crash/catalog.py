"""The signature catalog: loading and checking catalog files, matching, and hint rendering."""

from __future__ import annotations

import re
import signal
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from deployctl.crash.prefilter import build_triggers, find
from deployctl.text import load_yaml

SHIPPED_CATALOG = Path(__file__).resolve().parent.parent / "data" / "signatures.yml"

_TIMES = "\u00d7"  # the multiplication sign, spelled out for linters
# Larger ratios are not read as a draft-token count (EAGLE uses a handful to a few dozen).
_MAX_DRAFT_TOKENS = 64

_SIGNATURE_KEYS = frozenset(
    {"id", "title", "hint", "exception", "message", "file", "line", "explain", "secondary"}
)
_RULE_KEYS = ("exception", "message", "file", "line")
_TOP_KEYS = frozenset({"version", "context", "signatures"})


class CatalogError(ValueError):
    """A signature catalog file cannot be used; the message names the file."""


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
        self._line_triggers = build_triggers(
            [s.line.pattern for s in self._line_signatures if s.line is not None]
        )
        self.triggers = build_triggers(
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
        if not any(find(t, text, 0, len(text)) >= 0 for t in self._line_triggers):
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
def default_catalog() -> Catalog:
    return load_catalog()


def _read_catalog_file(path: Path) -> tuple[list[Signature], dict[str, re.Pattern[str]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read signature catalog: {exc}") from None
    try:
        data = load_yaml(text)
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


def render_hint(sig: Signature, fields: dict[str, str]) -> str:
    if sig.explain is not None:
        fields.update(_EXPLAINERS[sig.explain](fields))
    try:
        return sig.hint.format_map(_Fields(fields))
    except (ValueError, TypeError, IndexError):
        return sig.hint
