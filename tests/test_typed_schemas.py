"""The generator of schemas from types (tools/typed_schema.py): each construct a document's
TypedDict may use, and what it refuses.

No `from __future__ import annotations` here: the sample TypedDicts below have NotRequired keys.
"""

from enum import StrEnum
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import pytest
from jsonschema import Draft202012Validator

from tools.typed_schema import TypedSchemas

# ---- the generator -----------------------------------------------------------------------


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Inner(TypedDict):
    """An inner object."""

    n: int


class Named(TypedDict):
    x: float


class Sample(TypedDict):
    """A sample of every construct.
    Its docstring is one line."""

    text: str
    count: Annotated[int, "How many.", {"minimum": 1}]
    ratio: float | None
    flag: bool
    maybe_flag: bool | None
    items: list[int] | None
    color: Color
    maybe_color: Color | None
    kind: Literal["a", "b"]
    ok: Literal[False]
    inner: Inner
    named: Named | None
    names: dict[str, list[Named]]
    free: dict[str, Any]
    later: NotRequired[Annotated[str, "Only sometimes."]]


def test_the_generator_maps_each_construct() -> None:
    schema = TypedSchemas({"named": Named}).definition(Sample, additionalProperties=False)
    assert schema == {
        "type": "object",
        "description": "A sample of every construct. Its docstring is one line.",
        "required": [
            "text", "count", "ratio", "flag", "maybe_flag", "items", "color", "maybe_color",
            "kind", "ok", "inner", "named", "names", "free",
        ],
        "properties": {
            "text": {"type": "string"},
            "count": {"type": "integer", "description": "How many.", "minimum": 1},
            "ratio": {"type": ["number", "null"]},
            "flag": {"type": "boolean"},
            "maybe_flag": {"type": ["boolean", "null"]},
            "items": {"type": ["array", "null"], "items": {"type": "integer"}},
            "color": {"enum": ["red", "blue"]},
            "maybe_color": {"enum": ["red", "blue", None]},
            "kind": {"enum": ["a", "b"]},
            "ok": {"const": False},
            "inner": {
                "type": "object",
                "description": "An inner object.",
                "required": ["n"],
                "properties": {"n": {"type": "integer"}},
            },
            "named": {"anyOf": [{"$ref": "#/$defs/named"}, {"type": "null"}]},
            "names": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": {"$ref": "#/$defs/named"}},
            },
            "free": {"type": "object"},
            "later": {"type": "string", "description": "Only sometimes."},
        },
        "additionalProperties": False,
    }  # fmt: skip
    Draft202012Validator.check_schema(schema)


def test_the_generator_refuses_what_it_cannot_say() -> None:
    class Keyed(TypedDict):
        by_number: dict[int, str]

    class Odd(TypedDict):
        value: complex

    with pytest.raises(TypeError, match="keys are strings"):
        TypedSchemas({}).definition(Keyed)
    with pytest.raises(TypeError, match="no JSON Schema"):
        TypedSchemas({}).definition(Odd)
    with pytest.raises(TypeError, match="not a TypedDict"):
        TypedSchemas({}).definition(dict)
    with pytest.raises(TypeError, match="not declared"):
        TypedSchemas({"named": Named}, keywords={"other": {}})


def test_a_not_required_key_read_as_required_is_refused() -> None:
    # Under `from __future__ import annotations` Python 3.11 counts a NotRequired key as
    # required: the generator says so rather than ship a wrong `required`.
    namespace: dict[str, Any] = {"__name__": __name__}
    exec(
        "from __future__ import annotations\n"
        "from typing import NotRequired, TypedDict\n"
        "class Late(TypedDict):\n"
        "    x: NotRequired[int]\n",
        namespace,
    )
    late = namespace["Late"]
    if "x" in late.__required_keys__:
        with pytest.raises(TypeError, match="NotRequired but required"):
            TypedSchemas({}).definition(late)
