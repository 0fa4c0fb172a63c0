"""Does a JSON value have the shape its TypedDict declares? One check for both sides: the
client checks every reply against its call's reply type (agent.py), and the host checks what
it reads back from its own files (a kept tune record) against the same declarations."""

from __future__ import annotations

import types
import typing
from functools import cache
from typing import Any


def shape_problems(value: Any, expected: Any, where: str) -> list[str]:
    """Say where `value` lacks a key its TypedDict declares (nested ones too) or has the
    wrong kind of value; an empty list when it fits."""
    if expected is Any:
        return []
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if value is None and type(None) in options:
            return []
        tried = [shape_problems(value, o, where) for o in options if o is not type(None)]
        return [] if any(not t for t in tried) else tried[0]
    if typing.is_typeddict(expected):
        if not isinstance(value, dict):
            return [f"{where} is not an object"]
        hints = _hints(expected)
        problems = [f"{where}.{key} is missing" for key in sorted(_required(expected) - set(value))]
        for key, item in value.items():
            if key in hints:
                problems += shape_problems(item, hints[key], f"{where}.{key}")
        return problems
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where} is not an object"]
        item_type = typing.get_args(expected)[1]
        return [p for k, v in value.items() for p in shape_problems(v, item_type, f"{where}.{k}")]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where} is not a list"]
        item_type = typing.get_args(expected)[0]
        return [
            p for i, v in enumerate(value) for p in shape_problems(v, item_type, f"{where}[{i}]")
        ]
    if expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    return [] if ok else [f"{where} is {type(value).__name__}, not {expected.__name__}"]


@cache
def _hints(typed_dict: type) -> dict[str, Any]:
    # Each annotation is resolved in the module that declares it (protocol, measures), so a
    # TypedDict may nest or extend one of another module's.
    return typing.get_type_hints(typed_dict)


@cache
def _required(typed_dict: type) -> frozenset[str]:
    return frozenset(getattr(typed_dict, "__required_keys__", frozenset()))
