"""SGLang's own options: is the command one the installation accepts?"""

from __future__ import annotations

import os
import sys
import time

from .files import read_bytes
from .patches import sglang_install
from .server_argv import DEPLOYCTL_OPTIONS, looks_like_flag, parse_server_argv, read_as

TYPE_CHECKING = False  # the types for the checker only (files.py says why)
if TYPE_CHECKING:
    from typing import Any

    from .protocol import (
        ArgFinding,
        ArgvCheck,
        CheckArgsArgs,
        CheckArgsReply,
        OptionSpec,
        SglangInstall,
    )

# Where 0.5.23 declares its options: annotated fields `name: A[type, "help" | Arg(...)]` in
# these files, plus the few `parser.add_argument` calls in ServerArgs.add_cli_args.
FIELDS_DIR = "sglang/srt/arg_groups/fields"
CHOICES_FILE = "sglang/srt/arg_groups/choices.py"
SERVER_ARGS_FILE = "sglang/srt/server_args.py"
PARSER_TIMEOUT = 45.0  # well inside a preflight's command_timeout (120 s by default)
# Asks SGLang's own parser for its options: the fallback for a layout this file does not know.
PARSER_SCRIPT = """import argparse, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = []
for action in parser._actions:
    if not action.option_strings or "-h" in action.option_strings:
        continue
    flag = action.nargs == 0
    nargs = None if action.nargs is None else str(action.nargs)
    kind = "flag" if flag else "list" if nargs in ("+", "*") else "value"
    type_name = getattr(action.type, "__name__", None)
    choices = None
    if action.choices is not None:
        choices = [c if isinstance(c, (int, float, str)) else str(c) for c in action.choices]
    spec = {"dest": action.dest, "kind": kind, "nargs": nargs,
            "type": type_name if type_name in ("int", "float", "str") else None,
            "choices": choices}
    out.append([list(action.option_strings), spec])
print(json.dumps(out))
"""


def _literal(node: Any) -> Any:
    import ast

    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _name_of(node: Any) -> str:
    """`Optional`, `typing.Optional`, `argparse.BooleanOptionalAction` → their last name."""
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _module_constants(tree: Any) -> dict[str, Any]:
    """Module-level `NAME = [literal, ...]` assignments (choice lists)."""
    import ast

    found: dict[str, Any] = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        for target in targets:
            if isinstance(target, ast.Name):
                value = _literal(stmt.value)
                if isinstance(value, (list, tuple, set, frozenset)):
                    found[target.id] = (
                        sorted(value, key=str)
                        if isinstance(value, (set, frozenset))
                        else list(value)
                    )
    return found


def _unwrap_type(node: Any) -> Any:
    """`Optional[X]`, `X | None`, `Union[X, None]` → X."""
    import ast

    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not _is_none(s)]
        return sides[0] if len(sides) == 1 else node
    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Union":
        members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [m for m in members if not _is_none(m)]
        return rest[0] if len(rest) == 1 else node
    return node


def _is_none(node: Any) -> bool:
    import ast

    return isinstance(node, ast.Constant) and node.value is None


def _scalar_type(node: Any) -> str | None:
    name = _name_of(node)
    return name if name in ("int", "float", "str") else None


def _option_spec(
    dest: str, type_node: Any, keywords: dict[str, Any], constants: dict[str, Any]
) -> OptionSpec:
    """What argparse will do with one option, from its declared type and Arg(...) keywords."""
    import ast

    choices_node = keywords.get("choices")
    choices = None
    if choices_node is not None:
        choices = _literal(choices_node)
        if choices is None and isinstance(choices_node, ast.Name):
            choices = constants.get(choices_node.id)
        choices = list(choices) if isinstance(choices, (list, tuple)) else None
    nargs = _literal(keywords["nargs"]) if "nargs" in keywords else None
    spec: OptionSpec = {
        "dest": dest,
        "kind": "value",
        "nargs": nargs,
        "type": None,
        "choices": choices,
    }
    action = keywords.get("action")
    if action is not None:
        words = _literal(action)
        if (
            words in ("store_true", "store_false", "store_const", "count")
            or _name_of(action) == "BooleanOptionalAction"
        ):
            spec["kind"] = "flag"
        else:
            spec["kind"] = "any"
        return spec
    inner = _unwrap_type(type_node) if type_node is not None else None
    if isinstance(inner, ast.Subscript) and _name_of(inner.value) == "Literal":
        values = _literal(inner.slice)
        values = list(values) if isinstance(values, tuple) else [values]
        spec["choices"] = choices or values
        spec["type"] = (
            type(values[0]).__name__
            if values and type(values[0]).__name__ in ("int", "float", "str")
            else None
        )
    elif (
        isinstance(inner, ast.Subscript)
        and _name_of(inner.value) in ("list", "List")
        and "type_parser" not in keywords
    ):
        spec["kind"], spec["nargs"], spec["type"] = "list", nargs or "+", _scalar_type(inner.slice)
    elif _name_of(inner) == "bool":
        spec["kind"] = "flag"
    elif "type_parser" not in keywords:
        spec["type"] = (
            _scalar_type(inner) if inner is not None else _scalar_type(keywords.get("type"))
        )
    if spec["kind"] == "value" and nargs in ("+", "*"):
        spec["kind"] = "list"
    custom = "type_parser" in keywords or ("type" in keywords and not spec["type"])
    if custom:  # its own conversion runs before argparse compares with the choices
        spec["type"], spec["choices"] = None, None
    return spec


def _field_options(tree: Any, constants: dict[str, Any]) -> list[tuple[list[str], OptionSpec]]:
    """The options that annotated fields `name: A[type, "help" | Arg(...)]` declare."""
    import ast

    found: list[tuple[list[str], OptionSpec]] = []
    for cls in (s for s in tree.body if isinstance(s, ast.ClassDef)):
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if not (isinstance(ann, ast.Subscript) and _name_of(ann.value) in ("A", "Annotated")):
                continue
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            keywords: dict[str, Any] | None = None
            for meta in parts[1:]:
                if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
                    keywords = {}
                    break
                if isinstance(meta, ast.Call) and _name_of(meta.func) == "Arg":
                    keywords = {k.arg: k.value for k in meta.keywords if k.arg}
                    break
            if keywords is None or _literal(keywords.get("no_cli")) is True:
                continue  # not a command-line option (Derived, runtime-only, no_cli)
            dest = stmt.target.id
            cli_name = _literal(keywords["cli_name"]) if "cli_name" in keywords else None
            names = [cli_name or "--" + dest.replace("_", "-")]
            names += [a for a in _literal(keywords.get("aliases")) or [] if isinstance(a, str)]
            spec = _option_spec(dest, parts[0], keywords, constants)
            if _name_of(keywords.get("action")) == "BooleanOptionalAction":
                names += ["--no-" + n[2:] for n in names if n.startswith("--")]
            found.append((names, spec))
    return found


def _hand_added_options(tree: Any, constants: dict[str, Any]) -> list[tuple[list[str], OptionSpec]]:
    """`parser.add_argument("--x", ...)` calls inside a function named add_cli_args."""
    import ast

    found: list[tuple[list[str], OptionSpec]] = []
    for func in (
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"
    ):
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            if _name_of(call.func) != "add_argument":
                continue
            names = [
                a.value
                for a in call.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("-")
            ]
            if not names:
                continue
            keywords = {k.arg: k.value for k in call.keywords if k.arg}
            dest = _literal(keywords.get("dest")) or names[0].lstrip("-").replace("-", "_")
            found.append((names, _option_spec(dest, None, keywords, constants)))
    return found


def declared_options(site: str) -> dict[str, OptionSpec] | None:
    """Every option name of the installation at `site`, read from its source without importing
    it (that would need torch); None when the layout is not 0.5.23's."""
    import ast

    fields_dir = os.path.join(site, FIELDS_DIR)
    server_args = os.path.join(site, SERVER_ARGS_FILE)
    if not (os.path.isdir(fields_dir) and os.path.isfile(server_args)):
        return None
    constants: dict[str, Any] = {}
    trees = []
    for path in [
        os.path.join(site, CHOICES_FILE),
        *sorted(os.path.join(fields_dir, f) for f in os.listdir(fields_dir) if f.endswith(".py")),
    ]:
        source = read_bytes(path)
        if source is None:
            continue
        tree = ast.parse(source, path)
        constants.update(_module_constants(tree))
        trees.append(tree)
    options: dict[str, OptionSpec] = {}
    for tree in trees:
        for names, spec in _field_options(tree, constants):
            options.update(dict.fromkeys(names, spec))
    server_tree = ast.parse(read_bytes(server_args) or b"", server_args)
    constants.update(_module_constants(server_tree))
    for names, spec in _hand_added_options(server_tree, constants):
        options.update(dict.fromkeys(names, spec))
    return options if len(options) > 20 else None  # a few: not the layout we know


def parser_options() -> tuple[dict[str, OptionSpec] | None, str]:
    """The options of SGLang's own parser, built in a child (it imports torch)."""
    import json
    import subprocess

    try:
        done = subprocess.run(
            [sys.executable, "-c", PARSER_SCRIPT],
            capture_output=True,
            text=True,
            timeout=PARSER_TIMEOUT,
            check=False,
            cwd=os.path.expanduser("~"),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"SGLang's parser could not be built: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"SGLang's parser could not be built: {last}"
    options: dict[str, OptionSpec] = {}
    try:  # the last line: importing SGLang may print before it
        for names, spec in json.loads((done.stdout.strip().splitlines() or ["[]"])[-1]):
            options.update(dict.fromkeys(names, spec))
    except (ValueError, TypeError) as exc:
        return None, f"SGLang's parser gave no option list ({exc})"
    return options, ""


def sglang_options(install: SglangInstall) -> tuple[dict[str, OptionSpec] | None, str, str]:
    """(options, method, note) for the installation: declarations first, else its parser."""
    site = install.get("site")
    if not site:
        return None, "none", install.get("error", "SGLang is not installed")
    try:
        options = declared_options(site)
    except (OSError, SyntaxError, ValueError) as exc:
        options, note = None, f"declarations unreadable ({exc})"
    else:
        note = ""
    if options is not None:
        return options, "declarations", note
    options, why = parser_options()
    if options is not None:
        return (
            options,
            "parser",
            "declarations not in the layout deployctl reads; used SGLang's parser",
        )
    return None, "none", why


def _value_problem(value: str, spec: OptionSpec) -> str:
    kind = spec["type"]
    converted: Any = value
    if kind in ("int", "float"):
        try:
            converted = int(value) if kind == "int" else float(value)
        except ValueError:
            return f"expected {'an integer' if kind == 'int' else 'a number'}, got {value!r}"
    if spec["choices"] is not None and converted not in spec["choices"]:
        shown = ", ".join(str(c) for c in spec["choices"][:12])
        more = ", …" if len(spec["choices"]) > 12 else ""
        return f"{value!r} is not one of the choices ({shown}{more})"
    return ""


def check_server_argv(argv: list[str], options: dict[str, OptionSpec]) -> list[ArgFinding]:
    """What SGLang's argparse would say about the command, before anything starts: unknown and
    ambiguous flags, abbreviations, flags given values they cannot take, bad values; and a
    flag this SGLang reads as another option than deployctl does."""
    import difflib

    findings: list[ArgFinding] = []

    def say(level: str, flag: str, message: str, candidates: list[str] | None = None) -> None:
        findings.append(
            {"level": level, "flag": flag, "message": message, "candidates": candidates or []}
        )

    read = {spec["dest"] for spec in DEPLOYCTL_OPTIONS.values()}
    for given in parse_server_argv(argv, options):
        word, name, option = given.word, given.name, given.option
        if not looks_like_flag(word):
            say(
                "error", word, f"unexpected argument {word!r}: SGLang takes no positional arguments"
            )
            continue
        if not option and given.candidates:
            matches = given.candidates
            say("error", name, f"{name} is ambiguous: it could be {', '.join(matches)}", matches)
            continue
        if not option:
            close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.75)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            say("error", name, f"{name} is not an option of this SGLang{hint}", close)
            continue
        spec = options[option]
        ours, ours_name = read_as(word)
        if (ours or spec["dest"] in read) and ours != spec["dest"]:
            # deployctl's own reading (GPUs, ports, memory) would not be the server's.
            full = next(n for n, s in options.items() if s["dest"] == spec["dest"])
            takes, fix = (
                ("an option of its own", f"write {ours_name} for that")
                if full == name
                else (full, f"write {full}")
            )
            reads = ours_name or "none of the options it reads"
            say("error", name, f"{name} is {takes} to this SGLang but {reads} to deployctl; {fix}")
        elif option != name:
            say("warning", name, f"{name} is an abbreviation of {option}; write {option}", [option])
        if spec["kind"] == "flag":
            if given.explicit:
                say("error", option, f"{option} takes no value (given {given.values[0]!r})")
            continue
        if spec["kind"] == "any":
            continue
        if not given.values and spec["nargs"] not in ("?", "*"):
            say("error", option, f"{option} needs a value")
        for value in given.values:
            problem = _value_problem(value, spec)
            if problem:
                say("error", option, f"{option}: {problem}")
    return findings


def argv_check(server_argv: list[str] | None, install: SglangInstall) -> ArgvCheck:
    if server_argv is None:
        return {
            "method": "off",
            "note": "check_flags is off, or the launcher is not `-m <launch_module>`",
            "options": 0,
            "findings": [],
            "seconds": 0.0,
        }
    began = time.monotonic()
    try:
        options, method, note = sglang_options(install)
        findings = check_server_argv(server_argv, options) if options is not None else []
    except Exception as exc:  # a checker that fails must not stop every launch on the host
        options, method, findings = None, "none", []
        note = f"the flags could not be checked: {type(exc).__name__}: {exc}"
    return {
        "method": method,
        "note": note,
        "options": len(options or {}),
        "findings": findings,
        "seconds": round(time.monotonic() - began, 4),
    }


def cmd_check_args(args: CheckArgsArgs) -> CheckArgsReply:
    install = sglang_install()
    return {"sglang": install, "check": argv_check(args["server_argv"], install)}
