"""JSON Schema (draft 2020-12) from the types documents are declared with.

A document is a TypedDict (deployctl/present/shapes/); `TypedSchemas` turns it into the
object schema the contract ships, so the schema and what mypy checks the builders against
are one declaration:

- `str`, `int`, `float`, `bool`, `None`; `list[X]` (and `tuple[X, ...]`); `dict[str, X]`
  (a map: `additionalProperties`; `dict[str, Any]` is any object);
- `Literal[...]` (`const` for one value, else `enum`) and an `Enum` (`enum` of its values);
- `X | None`: `{"type": [kind, "null"]}` for a primitive, a list or any object
  (`dict[str, Any]`), `null` added to an `enum`, else `anyOf` with `{"type": "null"}`;
- a TypedDict: a `$ref` to `#/$defs/<name>` when it is named (a definition of its own),
  inline otherwise; its keys required unless `NotRequired` or of a `total=False` class;
- `Annotated[X, "description", {keyword: value}]`: a string is the key's description, a
  mapping adds keywords (`minimum`, `pattern`, `minItems`…);
- an object's description is its class's docstring (its lines joined by spaces);
- a named generic TypedDict (`HostEntry[StatusFields]`) is a `$ref` too, its definition made
  by the pattern its generic declares (`patterns`: the per-host wrappers of
  tools/contract.py); a name in `given` is a `$ref` whose definition is given, not generated
  (what a type cannot declare: SGLang's metrics, whose keys come from deployctl/metrics.py).

The module that declares TypedDicts with `NotRequired` must not use `from __future__ import
annotations`: Python 3.11 then counts those keys as required (`definition` refuses it).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

Schema = dict[str, Any]
# A generic TypedDict's schema from one parameterization of it (and the definition's keywords).
Pattern = Callable[["TypedSchemas", Any, Schema], Schema]

PRIMITIVES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def description_of(typed: type) -> str | None:
    """A TypedDict's docstring as one line, or None without one."""
    doc = typed.__doc__
    if not doc:
        return None
    return " ".join(line.strip() for line in doc.strip().splitlines())


def enum_values(hint: Any) -> list[Any] | None:
    """The values an enum or a Literal allows, or None when `hint` is neither."""
    if isinstance(hint, type) and issubclass(hint, Enum):
        return [member.value for member in hint]
    if get_origin(hint) is Literal:
        return [v.value if isinstance(v, Enum) else v for v in get_args(hint)]
    return None


class TypedSchemas:
    """Schemas of TypedDicts. `named`: the definitions (name → TypedDict, or a generic one's
    parameterization) a schema refers to with `$ref` rather than inline; `keywords`: more
    keywords for a named definition (what a type cannot say: `additionalProperties`,
    `dependentRequired`, `if`/`then`…); `patterns`: generic TypedDict → how a parameterization
    of it is defined; `given`: definitions named by a type but declared as schemas."""

    def __init__(
        self,
        named: Mapping[str, Any],
        keywords: Mapping[str, Schema] | None = None,
        patterns: Mapping[type, Pattern] | None = None,
        given: Mapping[str, Schema] | None = None,
    ) -> None:
        self.named = dict(named)
        self.names = {typed: name for name, typed in self.named.items()}
        if len(self.names) != len(self.named):
            raise TypeError("a TypedDict is named twice")
        self.keywords = dict(keywords or {})
        if unknown := set(self.keywords) - set(self.named):
            raise TypeError(f"keywords for definitions not declared: {sorted(unknown)}")
        self.patterns = dict(patterns or {})
        self.given = dict(given or {})
        if unknown := set(self.given) - set(self.named):
            raise TypeError(f"given definitions not named: {sorted(unknown)}")

    def definitions(self) -> dict[str, Schema]:
        """Every named definition, generated from its type (or given)."""
        return {name: self.named_definition(name) for name in self.named}

    def named_definition(self, name: str) -> Schema:
        """One named definition: given, made by its generic's pattern, or its TypedDict's."""
        typed, keywords = self.named[name], self.keywords.get(name, {})
        if name in self.given:
            return {**self.given[name], **keywords}
        pattern = self.patterns.get(get_origin(typed))
        if pattern is not None:
            return pattern(self, typed, keywords)
        return self.definition(typed, **keywords)

    def name_of(self, hint: Any) -> str | None:
        """The definition's name `hint` is declared as, or None."""
        try:
            return self.names.get(hint)
        except TypeError:  # unhashable (an Annotated with a mapping)
            return None

    def definition(self, typed: type, **keywords: Any) -> Schema:
        """A TypedDict's object schema: its description, required keys, each key's schema,
        then `keywords`."""
        if not is_typeddict(typed):
            raise TypeError(f"{typed!r} is not a TypedDict")
        hints = get_type_hints(typed, include_extras=True)
        required: frozenset[str] = typed.__required_keys__  # type: ignore[attr-defined]
        for key, hint in hints.items():
            if get_origin(hint) is NotRequired and key in required:
                raise TypeError(
                    f"{typed.__name__}.{key}: NotRequired but required; declare it without "
                    "`from __future__ import annotations`"
                )
        schema: Schema = {"type": "object"}
        if description := description_of(typed):
            schema["description"] = description
        schema["required"] = [key for key in hints if key in required]
        if hints:
            schema["properties"] = {key: self.schema(hint) for key, hint in hints.items()}
        return {**schema, **keywords}

    def schema(self, hint: Any) -> Schema:
        """The schema of one annotation."""
        origin = get_origin(hint)
        if origin in (Required, NotRequired):
            return self.schema(get_args(hint)[0])
        if origin is Annotated:
            inner, *metadata = get_args(hint)
            return self.annotated(self.schema(inner), metadata)
        if origin in (Union, types.UnionType):
            return self.union(get_args(hint))
        if (name := self.name_of(hint)) is not None:
            return {"$ref": f"#/$defs/{name}"}
        values = enum_values(hint)
        if values is not None:
            return {"const": values[0]} if len(values) == 1 else {"enum": values}
        if isinstance(hint, type) and hint in PRIMITIVES:
            return {"type": PRIMITIVES[hint]}
        if hint is Any:
            return {}
        if origin in (list, Sequence) or (origin is tuple and get_args(hint)[1:] == (...,)):
            return {"type": "array", "items": self.schema(get_args(hint)[0])}
        if origin in (dict, Mapping):
            key, value = get_args(hint)
            if key is not str:
                raise TypeError(f"{hint}: JSON object keys are strings")
            if value is Any:
                return {"type": "object"}
            return {"type": "object", "additionalProperties": self.schema(value)}
        if is_typeddict(hint):
            return self.definition(hint)
        raise TypeError(f"no JSON Schema for {hint!r}")

    def annotated(self, schema: Schema, metadata: Sequence[Any]) -> Schema:
        """`schema` with the description and keywords of `Annotated[..., "…", {…}]`."""
        more: Schema = {}
        description = None
        for item in metadata:
            if isinstance(item, str):
                description = item
            elif isinstance(item, Mapping):
                more.update(item)
            else:
                raise TypeError(f"Annotated takes a description or keywords, not {item!r}")
        return {**schema, **({"description": description} if description else {}), **more}

    def union(self, members: Sequence[Any]) -> Schema:
        """`X | None` as the contract writes it; any other union as `anyOf`."""
        others = [m for m in members if m is not type(None)]
        if len(others) == len(members) or len(others) > 1:
            return {"anyOf": [self.schema(m) for m in members]}
        schema = self.schema(others[0])
        kind = schema.get("type")
        if isinstance(kind, str) and (kind != "object" or schema == {"type": "object"}):
            return {**schema, "type": [kind, "null"]}
        if set(schema) == {"enum"}:
            return {"enum": [*schema["enum"], None]}
        return {"anyOf": [schema, {"type": "null"}]}
