"""Variables written in terms of other variables (`model_path: "{{ models_root }}/kimi"`),
resolved as Ansible resolves them: against the host's merged variables, chains followed on
demand, a template that is one expression keeping its value's type.

Inventories are data that others may write, so their templates render in Jinja2's immutable
sandbox (no Python internals, no in-place changes) and within bounds: a value at most
MAX_VALUE_SIZE characters (or items), `range` at most MAX_RANGE items, RENDER_SECONDS per
variable. What could grow past a bound in one step (`*`, `**`, `+`, `~`, `%`, padding and
replacing) is checked before it runs.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import shlex
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any

import jinja2
import jinja2.nativetypes
import jinja2.nodes
import jinja2.runtime
import jinja2.sandbox

from deployctl.errors import InventoryError
from deployctl.inventory_sources import is_templated

_RESOLVER = "__deployctl_resolver__"
MAX_VALUE_SIZE = 1 << 20  # characters of text, or items, in one resolved value (1 MiB)
MAX_RANGE = jinja2.sandbox.MAX_RANGE  # items of one range()
RENDER_SECONDS = 5.0  # to render one variable, with everything it refers to


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

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        """`a ~ b` joins through the environment, which bounds the result first."""
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _TooBig(Exception):
    """A value would pass a bound (MAX_VALUE_SIZE, or a bounded function's limit)."""


def _size(value: Any, limit: int = MAX_VALUE_SIZE, depth: int = 0) -> int:
    """Characters of text and items of collections in a value, counted until past `limit`."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, int):
        return max(1, value.bit_length() * 3 // 10)  # about its decimal digits, at least one
    if not isinstance(value, (list, tuple, set, frozenset, dict)):
        return 1
    if depth > 100:
        raise _TooBig("a value is nested more than 100 levels deep")
    total = len(value)
    items = (x for kv in value.items() for x in kv) if isinstance(value, dict) else iter(value)
    for item in items:
        if total > limit:
            break
        total += _size(item, limit - total, depth + 1)
    return total


def _bound(size: int) -> None:
    if size > MAX_VALUE_SIZE:
        raise _TooBig(f"a value would be longer than {MAX_VALUE_SIZE} characters or items")


def _checked(value: Any) -> Any:
    _bound(_size(value))
    return value


_PRINTF_WIDTHS = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_SPEC = re.compile(r"\{[^{}:]*:([^{}]*)\}")


def _bound_format(text: str, spec: re.Pattern[str], taken: Iterable[Any]) -> None:
    """A format string's widths and precisions, and those it takes from its arguments."""
    for found in spec.findall(text):
        for part in found if isinstance(found, tuple) else (found,):
            for number in re.findall(r"\d+", part):
                _bound(int(number))
    for value in taken:
        if isinstance(value, int):
            _bound(value)


def _bound_replace(text: Any, old: Any, new: Any, count: Any = -1) -> None:
    text, old, new = str(text), str(old), str(new)
    times = text.count(old)
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    _bound(len(text) + times * (len(new) - len(old)))


def _bound_join(separator: Any, items: list[Any]) -> None:
    _bound(len(str(separator)) * len(items) + sum(_size(i) for i in items))


def _bound_width(width: Any) -> None:
    if isinstance(width, int):
        _bound(width)


def _str_method_check(text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Bound what a method of a string would make before it makes it."""
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _bound_width(args[0])
    elif name == "expandtabs":
        _bound(len(text) + text.count("\t") * int(args[0] if args else kwargs.get("tabsize", 8)))
    elif name == "replace" and len(args) >= 2:
        _bound_replace(text, *args[:3])
    elif name in ("format", "format_map"):
        values = [*args, *kwargs.values()]
        if name == "format_map" and args and isinstance(args[0], Mapping):
            values = list(args[0].values())
        plain = text.replace("{{", "").replace("}}", "")
        nested = re.search(r"\{[^{}]*\{", plain) is not None  # `{:{w}}`: an argument's width
        _bound_format(plain, _FORMAT_SPEC, values if nested else ())


def _filter_check(name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Bound what a filter would make before it makes it (`args`: the value first)."""
    if name == "center":
        _bound_width(args[1] if len(args) > 1 else kwargs.get("width"))
    elif name == "indent" and args:
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        per_line = width if isinstance(width, int) else len(str(width))
        _bound(len(str(args[0])) + (str(args[0]).count("\n") + 1) * per_line)
    elif name in ("batch", "slice"):
        _bound_width(args[1] if len(args) > 1 else kwargs.get("linecount", kwargs.get("slices")))
    elif name == "replace" and len(args) >= 3:
        _bound_replace(*args[:4])
    elif name == "format" and args:
        taken = [*args[1:], *kwargs.values()] if "*" in str(args[0]) else []
        _bound_format(str(args[0]), _PRINTF_WIDTHS, taken)
    elif name == "join" and args:
        args[0] = list(args[0])  # once: it may be a generator
        _bound_join(args[1] if len(args) > 1 else kwargs.get("d", ""), args[0])


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that checks what it would make, and what it made, against the bounds."""
    passed = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(function)  # keeps pass_context and its kin
    def bounded(*args: Any, **kwargs: Any) -> Any:
        head, rest = list(args[:passed]), list(args[passed:])
        _filter_check(name, rest, kwargs)
        return _checked(function(*head, *rest, **kwargs))

    return bounded


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


def _regex_replace(value: Any, pattern: str, replacement: str = "") -> str:
    made = [0]

    def expand(match: re.Match[str]) -> str:
        text = match.expand(replacement)
        made[0] += len(text) - len(match.group(0))
        _bound(len(match.string) + made[0])  # as it goes: each match may add more
        return text

    return re.sub(pattern, expand, str(value))


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
    items: list[Any] = []
    made = 0
    for item in parts:  # the output is bounded as it is made: a loop may print for long
        if isinstance(item, jinja2.Undefined):
            str(item)  # raises the undefined name's error (StrictUndefined)
        items.append(item)
        made += _size(item) if len(items) == 1 else len(str(item))
        _bound(made)
    if len(items) == 1:
        return items[0]
    return "".join(str(item) for item in items)


class _Environment(
    jinja2.sandbox.ImmutableSandboxedEnvironment, jinja2.nativetypes.NativeEnvironment
):
    """Ansible's templar is sandboxed too; immutable, so that no template changes a value
    other hosts share (and no list grows in place past the bounds)."""

    context_class = _LazyContext
    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: jinja2.runtime.Context, op: str, left: Any, right: Any) -> Any:
        """Apply `*`, `**`, `+` or `%` once the size of its result is known to be bounded."""
        sequences = (str, list, tuple)
        if op == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, sequences) and isinstance(times, int):
                    _bound(_size(seq) * max(times, 0))
            if isinstance(left, int) and isinstance(right, int):
                _bound(_size(left) + _size(right))
        elif op == "**" and isinstance(left, int) and isinstance(right, int):
            if abs(left) > 1 and right > 0:
                _bound(_size(left) * right)
        elif op == "+" and isinstance(left, sequences) and isinstance(right, sequences):
            _bound(_size(left) + _size(right))
        elif op == "%" and isinstance(left, str):
            values = right if isinstance(right, tuple) else (right,)
            _bound_format(left, _PRINTF_WIDTHS, values if "*" in left else ())
        return _checked(self.binop_table[op](left, right))

    def call(
        __self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """Call a function or method once what it would make is known to be bounded."""
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            if getattr(target, "__name__", "") == "join" and args:
                args = (list(args[0]), *args[1:])
                _bound_join(owner, args[0])
            _str_method_check(owner, getattr(target, "__name__", ""), args, kwargs)
        return _checked(super().call(__context, __obj, *args, **kwargs))

    def bounded_join(self, parts: Iterable[Any]) -> str:
        """`a ~ b ~ c`, refused before it is made when it would be too long."""
        texts = [str(part) for part in parts]
        _bound(sum(len(t) for t in texts))
        return "".join(texts)


@functools.cache
def _environment() -> _Environment:
    environment = _Environment(undefined=jinja2.StrictUndefined)
    environment.filters.update(_FILTERS)
    for name, function in list(environment.filters.items()):
        environment.filters[name] = _bounded_filter(name, function)
    environment.globals["lookup"] = _lookup
    del environment.globals["lipsum"]  # makes text of any size; no inventory needs it
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
        self.failed: dict[str, InventoryError] = {}  # each fails once: it may have been slow
        self.stack: list[str] = []

    def value(self, name: str) -> Any:
        if name in self.done:
            return self.done[name]
        if name in self.failed:
            raise self.failed[name]
        if name in self.stack:
            chain = " -> ".join([*self.stack[self.stack.index(name) :], name])
            raise InventoryError(
                f"host {self.host}: variable {self.stack[0]} has a reference cycle: {chain}"
            )
        self.stack.append(name)
        try:
            result = self.render(self.raw[name])
        except InventoryError as exc:
            self.failed[name] = exc
            raise
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
        except _TooBig as exc:
            raise InventoryError(
                f"host {self.host}: variable {self.stack[0]}: {exc}",
                hint=f"an inventory value is at most {MAX_VALUE_SIZE} characters or items, "
                f"a range at most {MAX_RANGE} items",
            ) from None
        except RecursionError:
            raise InventoryError(
                f"host {self.host}: variable {self.stack[0]}: its template recurses too deeply"
            ) from None
        except MemoryError:
            raise InventoryError(
                f"host {self.host}: variable {self.stack[0]}: out of memory"
            ) from None
        except (TypeError, ValueError, ArithmeticError, LookupError, re.error) as exc:
            raise InventoryError(f"host {self.host}: variable {self.stack[0]}: {exc}") from None


class _HostView(Mapping[str, Any]):
    """`hostvars[name]`: another host's variables, rendered on use, and its magic variables
    (`inventory_hostname`, `group_names`, …) as in Ansible."""

    def __init__(self, resolver: _HostResolver) -> None:
        self.resolver = resolver
        self.magic = {k: v for k, v in resolver.magic.items() if k != "hostvars"}

    def __getitem__(self, key: str) -> Any:
        if key in self.resolver.raw:
            return self.resolver.value(key)
        return self.magic[key]

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.resolver.raw), **dict.fromkeys(self.magic)})

    def __len__(self) -> int:
        return len(self.resolver.raw.keys() | self.magic.keys())


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


@contextmanager
def _time_limit(resolver: _HostResolver) -> Iterator[None]:
    """Stop rendering one host's variables after RENDER_SECONDS (a loop in a loop may run for
    hours); a timer signal is the one thing that interrupts Jinja's loops, so only on the
    main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        name = resolver.stack[0] if resolver.stack else "?"
        raise InventoryError(
            f"host {resolver.host}: variable {name}: takes longer than "
            f"{RENDER_SECONDS:g}s to render",
            hint="an inventory template must not loop for long",
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, RENDER_SECONDS, 0.5)  # again, if one is swallowed
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
            with _time_limit(resolver):
                resolved[host] = {name: resolver.value(name) for name in variables}
        except InventoryError as exc:
            broken[host], resolved[host] = exc, variables
    return resolved, broken
