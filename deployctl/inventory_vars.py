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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2
import jinja2.nativetypes
import jinja2.nodes
import jinja2.runtime

from deployctl.errors import InventoryError
from deployctl.inventory_sources import is_templated

_RESOLVER = "__deployctl_resolver__"


class _LazyContext(jinja2.runtime.Context):
    """Looks a name up in the host's variables only when the template uses it; the host's
    own variables come before Jinja's globals (`range`, `namespace`, …), as in Ansible."""

    def resolve_or_missing(self, key: str) -> Any:
        if key in self.vars:  # names the template itself set ({% set %}, loops)
            return self.vars[key]
        resolver: _HostResolver | None = self.parent.get(_RESOLVER)
        if resolver is not None and key in resolver.raw:
            return resolver.value(key)
        return super().resolve_or_missing(key)


class _CodeGenerator(jinja2.nativetypes.NativeCodeGenerator):
    """Evaluates every expression when rendering: Jinja would otherwise fold a constant one
    (`{{ 5 }}`, `{{ [1, 2] }}`) into its text at compile time, and its type would be lost."""

    def _output_child_to_const(self, node: Any, frame: Any, finalize: Any) -> Any:
        if not isinstance(node, jinja2.nodes.TemplateData):
            raise jinja2.nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)


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
    """One expression keeps its type (`"{{ tp * 2 }}"` is an int); anything more is text.
    (Text made with a secret is masked where it is shown: `mask_secrets`.)"""
    items = list(parts)
    for item in items:
        if isinstance(item, jinja2.Undefined):
            str(item)  # raises the undefined name's error (StrictUndefined)
    if len(items) == 1:
        return items[0]
    return "".join(str(item) for item in items)


class _Environment(jinja2.nativetypes.NativeEnvironment):
    context_class = _LazyContext
    code_generator_class = _CodeGenerator


@functools.cache
def _environment() -> _Environment:
    environment = _Environment(undefined=jinja2.StrictUndefined)
    environment.filters.update(_FILTERS)
    environment.globals["lookup"] = _lookup
    return environment


@functools.lru_cache(maxsize=4096)
def _template(text: str) -> jinja2.Template:
    return _environment().from_string(text)


class _HostResolver:
    """One host's variables, each rendered once, on first use; a use while it is being
    rendered is a reference cycle."""

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
        except (TypeError, ValueError, ArithmeticError, LookupError, re.error) as exc:
            raise InventoryError(f"host {self.host}: variable {self.stack[0]}: {exc}") from None


class _HostView(Mapping[str, Any]):
    """`hostvars[name]`: another host's variables, rendered on use."""

    def __init__(self, resolver: _HostResolver) -> None:
        self.resolver = resolver

    def __getitem__(self, key: str) -> Any:
        if key not in self.resolver.raw:
            raise KeyError(key)
        return self.resolver.value(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.resolver.raw)

    def __len__(self) -> int:
        return len(self.resolver.raw)


class _HostVars(Mapping[str, Any]):
    """`hostvars`: every host's variables, each host's resolver made on first use."""

    def __init__(
        self, raw: dict[str, dict[str, Any]], magic: Callable[[str], dict[str, Any]]
    ) -> None:
        self.raw = raw
        self.magic = magic
        self.resolvers: dict[str, _HostResolver] = {}

    def resolver(self, host: str) -> _HostResolver:
        if host not in self.resolvers:
            magic = {**self.magic(host), "hostvars": self}
            self.resolvers[host] = _HostResolver(host, self.raw[host], magic)
        return self.resolvers[host]

    def __getitem__(self, host: str) -> _HostView:
        if host not in self.raw:
            raise KeyError(host)
        return _HostView(self.resolver(host))

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def resolve_hosts(
    raw: dict[str, dict[str, Any]], magic: Callable[[str], dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], dict[str, InventoryError]]:
    """Every host's variables with their templates rendered (`magic(host)`: Ansible's magic
    variables for it), and the error of each host whose templates do not render."""
    hostvars = _HostVars(raw, magic)
    resolved: dict[str, dict[str, Any]] = {}
    broken: dict[str, InventoryError] = {}
    for host, variables in raw.items():
        if not any(is_templated(v) for v in variables.values()):
            resolved[host] = variables
            continue
        resolver = hostvars.resolver(host)
        try:
            resolved[host] = {name: resolver.value(name) for name in variables}
        except InventoryError as exc:
            broken[host], resolved[host] = exc, variables
    return resolved, broken
