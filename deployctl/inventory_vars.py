"""Variables written in terms of other variables (`model_path: "{{ models_root }}/kimi"`),
resolved as Ansible resolves them: against the host's merged variables, chains followed on
demand, a template that is one expression keeping its value's type.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable
from typing import Any

import jinja2
import jinja2.nativetypes
import jinja2.runtime
from jinja2.utils import missing

from deployctl.errors import InventoryError

_RESOLVER = "__deployctl_resolver__"
_MARKERS = ("{{", "{%", "{#")


class _LazyContext(jinja2.runtime.Context):
    """Looks a name up in the host's variables only when the template uses it."""

    def resolve_or_missing(self, key: str) -> Any:
        found = super().resolve_or_missing(key)
        if found is not missing:
            return found
        resolver: _HostResolver | None = self.parent.get(_RESOLVER)
        if resolver is not None and key in resolver.raw:
            return resolver.value(key)
        return missing


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


def _regex_replace(value: Any, pattern: str, replacement: str = "") -> str:
    return re.sub(pattern, replacement, str(value))


def _ternary(value: Any, true: Any, false: Any) -> Any:
    return true if value else false


def _mandatory(value: Any, msg: str | None = None) -> Any:
    if isinstance(value, jinja2.Undefined):
        raise jinja2.UndefinedError(msg or "mandatory variable is not defined")
    return value


def _lookup(kind: str, *terms: str, default: str = "") -> str:
    if kind != "env":
        raise jinja2.TemplateError(f"lookup({kind!r}) is not supported in inventories (env is)")
    return ",".join(os.environ.get(t, default) for t in terms)


# Ansible's filters that inventories commonly use; jinja2's own (default, lower, int, ...) too.
_FILTERS: dict[str, Callable[..., Any]] = {
    "bool": _bool,
    "basename": posixpath.basename,
    "dirname": posixpath.dirname,
    "regex_replace": _regex_replace,
    "ternary": _ternary,
    "mandatory": _mandatory,
    "to_json": json.dumps,
    "quote": lambda value: shlex.quote(str(value)),
}


def _native_concat(parts: Iterable[Any]) -> Any:
    """One expression keeps its type (`"{{ tp * 2 }}"` is an int); anything more is text."""
    items = list(parts)
    if len(items) == 1:
        return items[0]
    return "".join(str(item) for item in items)


class _Environment(jinja2.nativetypes.NativeEnvironment):
    context_class = _LazyContext


@functools.cache
def _environment() -> _Environment:
    environment = _Environment(undefined=jinja2.StrictUndefined)
    environment.filters.update(_FILTERS)
    environment.globals["lookup"] = _lookup
    return environment


@functools.lru_cache(maxsize=4096)
def _template(text: str) -> jinja2.Template:
    return _environment().from_string(text)


def is_templated(value: Any) -> bool:
    """Tell whether a value holds a template anywhere inside it."""
    if isinstance(value, str):
        return any(marker in value for marker in _MARKERS) and not _is_unsafe(value)
    if isinstance(value, dict):
        return any(is_templated(v) for v in value.values())
    if isinstance(value, list):
        return any(is_templated(v) for v in value)
    return False


def _is_unsafe(value: str) -> bool:
    return type(value).__name__ == "Unsafe"  # `!unsafe` in YAML: never templated


class _HostResolver:
    def __init__(self, host: str, raw: dict[str, Any], magic: dict[str, Any]) -> None:
        self.host = host
        self.raw = raw
        self.magic = magic
        self.done: dict[str, Any] = {}
        self.stack: list[str] = []

    def value(self, name: str) -> Any:
        if name in self.done:
            return self.done[name]
        if name in self.stack:
            chain = " -> ".join([*self.stack[self.stack.index(name) :], name])
            raise InventoryError(
                f"host {self.host}: variable {self.stack[0]} has a reference cycle: {chain}"
            )
        self.stack.append(name)
        try:
            result = self.render(self.raw[name])
        finally:
            self.stack.pop()
        self.done[name] = result
        return result

    def render(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.render(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.render(v) for v in value]
        if not isinstance(value, str) or not is_templated(value):
            return value
        try:
            template = _template(value)
            context = template.new_context({**self.magic, _RESOLVER: self})
            return _native_concat(template.root_render_func(context))
        except InventoryError:
            raise
        except jinja2.TemplateError as exc:
            raise InventoryError(
                f"host {self.host}: variable {self.stack[0]}: {exc.message or exc}",
                hint="templated variables use Jinja2: {{ name }}, {{ name | default('x') }}",
            ) from None
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise InventoryError(f"host {self.host}: variable {self.stack[0]}: {exc}") from None


def resolve_templates(
    host: str, variables: dict[str, Any], magic: dict[str, Any]
) -> dict[str, Any]:
    """Return the variables with every template rendered; unchanged when none has one."""
    if not any(is_templated(v) for v in variables.values()):
        return variables
    resolver = _HostResolver(host, variables, magic)
    return {name: resolver.value(name) for name in variables}
