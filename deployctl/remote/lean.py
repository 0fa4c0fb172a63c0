"""JSON, SHA-256 and signals for the agent without the imports of `json`, `hashlib` and
`signal`.

A one-shot call's Python pays for every import at its start: `json` brings `re` and `enum`
(~12 ms), `hashlib` OpenSSL (~6 ms), `signal` `enum`; a status call takes ~20 ms of CPU
without them (and without `typing`), ~55 ms with them (benchmarks/agent_call.py). The C
scanner and encoder that `json` itself drives, the builtin SHA-256 and `_signal` do the same
work here; a Python without them, or whose `_json` answers otherwise (checked once, by a round
trip), gets `json` and `hashlib`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_SPACE = " \t\n\r"  # JSON's whitespace, no more (str.strip's default is wider)
_SAMPLE = {"a": [1, 2.5, None, True, "\u00e9\n"], "b": {}, "c": -0.0}
_SAMPLE_TEXT = '{"a": [1, 2.5, null, true, "\\u00e9\\n"], "b": {}, "c": -0.0}'


class _Reading:
    """What `_json`'s scanner reads of its context: json.JSONDecoder's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {
        "NaN": float("nan"),
        "Infinity": float("inf"),
        "-Infinity": -float("inf"),
    }.__getitem__


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _fast() -> tuple[Callable[[str], Any], Callable[[Any], str]]:
    from _json import encode_basestring_ascii, make_encoder, make_scanner

    scan = make_scanner(_Reading())  # type: ignore[arg-type]  # any object with these names
    # As json.dumps's defaults: check for cycles, ASCII, ", " and ": ", NaN allowed.
    encode = make_encoder(
        {}, _not_json, encode_basestring_ascii, None, ": ", ", ", False, False, True
    )

    def loads(text: str) -> Any:
        start = len(text) - len(text.lstrip(_SPACE))
        try:
            value, end = scan(text, start)
        except StopIteration as missing:
            raise ValueError(f"no JSON value at character {missing.value}") from None
        except Exception:
            # The scanner raises json's own error only where json.decoder is imported (else a
            # SystemError): a malformed text is read again by json, for its error.
            import json

            return json.loads(text)
        if text[end:].strip(_SPACE):
            raise ValueError(f"extra data after the JSON value at character {end}")
        return value

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    if dumps(_SAMPLE) != _SAMPLE_TEXT or dumps(loads(_SAMPLE_TEXT)) != _SAMPLE_TEXT:
        raise ValueError("_json answers otherwise than json")
    return loads, dumps


def _slow() -> tuple[Callable[[str], Any], Callable[[Any], str]]:
    import json

    return json.loads, json.dumps


try:
    loads, dumps = _fast()
except (ImportError, TypeError, ValueError, AttributeError):
    loads, dumps = _slow()

# How json writes a key that is no string (a key that is a string is written as a string).
_KEY_WORDS = {True: "true", False: "false", None: "null"}


def dumps_indented(value: Any, level: int = 0) -> str:
    """As json.dumps(value, indent=2), for the files a person may read (run records, locks),
    without the pure-Python encoder's import; no check for a document that contains itself."""
    if isinstance(value, dict) and value:
        items = [
            f"{dumps(_key(key))}: {dumps_indented(item, level + 1)}" for key, item in value.items()
        ]
        ends = "{}"
    elif isinstance(value, (list, tuple)) and value:
        items = [dumps_indented(item, level + 1) for item in value]
        ends = "[]"
    else:
        return dumps(value)
    inner = "\n" + "  " * (level + 1)
    return ends[0] + inner + ("," + inner).join(items) + "\n" + "  " * level + ends[1]


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return _KEY_WORDS[key]
    if isinstance(key, (int, float)):
        return dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _builtin_sha256() -> Callable[[bytes], Any]:
    for name in ("_sha256", "_sha2"):  # the builtin module: `_sha2` from Python 3.12
        try:
            return __import__(name).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    from hashlib import sha256

    return sha256


_sha256 = _builtin_sha256()


def sha256_hex(data: bytes) -> str:
    return _sha256(data).hexdigest()  # type: ignore[no-any-return]


# `signal` without its enums (`_signal` has no stub in typeshed: the names used are typed here).
_signal: Any = __import__("_signal")
SIGTERM: int = _signal.SIGTERM
SIGKILL: int = _signal.SIGKILL


def ignore_hangup() -> None:
    """A dropped connection must not interrupt a change half-way: SIGHUP and SIGPIPE are
    ignored, and a write to a closed pipe fails instead."""
    _signal.signal(_signal.SIGHUP, _signal.SIG_IGN)
    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
