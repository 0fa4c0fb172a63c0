"""The package's imports point one way: read with `ast`, no cycles and no upward imports."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path
from typing import Any

from tests.sources import parse_file

PACKAGE = Path(__file__).resolve().parent.parent / "deployctl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> set[str]:
    """Every name `path` imports, at any depth of its code (lazy imports too).

    `from deployctl import report` yields both `deployctl` and `deployctl.report`.
    """
    found: set[str] = set()
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (module := absolute_module(path, node)):
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def absolute_module(path: Path, node: ast.ImportFrom) -> str | None:
    """The module a `from … import` names; a relative one (`from .protocol import X`, as
    deployctl/remote/ writes them) resolved against `path`'s package."""
    if not node.level:
        return node.module
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module → the deployctl modules it imports (the package's own __init__ left out); built
    once per test process (the tests read it, never change it)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: (imported_names(path) & modules.keys()) - {name, "deployctl"}
        for name, path in modules.items()
    }


def test_the_graph_sees_the_known_imports() -> None:
    graph = import_graph()
    assert "deployctl.ops.plan" in graph["deployctl.cli.runs"]
    assert "deployctl.present.views" in graph["deployctl.cli.session"]
    assert "deployctl.agent" in graph["deployctl.ops.runs"]
    assert "deployctl.crash.model" in graph["deployctl.present.terminal"]


def test_there_is_no_import_cycle() -> None:
    graph = import_graph()
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = "open"
        path.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                cycle = [*path[path.index(dep) :], dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)


PRESENTATION = "deployctl.present"
CLI = "deployctl.cli"
# The web dashboard is a front end too: it serves the documents the CLI prints.
DASHBOARD = "deployctl.dashboard"


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def is_front_end(name: str) -> bool:
    return name == "deployctl.__main__" or in_package(name, CLI) or in_package(name, DASHBOARD)


def is_presentation(name: str) -> bool:
    return name == PRESENTATION or name.startswith(PRESENTATION + ".")


def test_ops_never_import_presentation_or_the_cli() -> None:
    for name, deps in import_graph().items():
        if name.startswith("deployctl.ops"):
            assert not {d for d in deps if is_presentation(d) or is_front_end(d)}, (name, deps)


def test_presentation_is_imported_only_by_front_ends_and_never_imports_them() -> None:
    graph = import_graph()
    assert any(is_presentation(name) for name in graph), "no presentation package found"
    for name, deps in graph.items():
        if is_presentation(name):
            assert not {d for d in deps if is_front_end(d)}, (name, deps)
        elif not is_front_end(name):
            assert not {d for d in deps if is_presentation(d)}, name


def test_nothing_but_the_entry_point_imports_the_cli() -> None:
    for name, deps in import_graph().items():
        if name != "deployctl.__main__" and not in_package(name, CLI):
            assert not {d for d in deps if in_package(d, CLI)}, name


def test_operations_never_print() -> None:
    # They return results and emit events; a sink decides what reaches a terminal.
    for path in [*(PACKAGE / "ops").glob("*.py"), PACKAGE / "events.py"]:
        source = path.read_text(encoding="utf-8")
        for word in ("print(", "sys.stdout", "sys.stderr"):
            assert word not in source, (path.name, word)


REMOTE = "deployctl.remote"
# Beside `protocol`, the client may import these remote modules, and why: agent.py builds the
# bundle and runs the bootstrap scripts; ops/port.py runs a patch set's verify scripts on
# this machine exactly as a host does (remote.patches).
REMOTE_IMPORTERS = {"deployctl.agent": {"*"}, "deployctl.ops.port": {"deployctl.remote.patches"}}


def remote_imports(path: Path) -> list[tuple[int, str]]:
    """Each import in a module of deployctl/remote/: (level, module), level 0 = absolute."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.Import):
            found += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def test_the_host_agent_imports_only_the_standard_library_and_itself() -> None:
    # It runs on hosts, with their own python and nothing of deployctl installed, under the
    # package name the bundle gives it: so itself only relatively, from its own folder.
    paths = sorted((PACKAGE / "remote").glob("*.py"))
    assert len(paths) > 5, "no deployctl/remote/ package found"
    for path in paths:
        for level, module in remote_imports(path):
            if level:
                assert level == 1, (path.name, module)  # nothing above deployctl/remote/
            else:
                top = module.split(".")[0]
                assert top in {"__future__", *sys.stdlib_module_names}, (path.name, module)


# The protocol's declarations, one module per concern: the calls' types (`protocol`), the
# markers, names and helpers both ends use at run time (`wire`), what is measured and kept
# (`measures`), a router's list and locks (`routing`), patch records and calls
# (`patch_types`), the launchers' shared words (`placements`) and how a server's command is
# read (`server_argv`, by the host's flag check and by deployctl alike). The client and
# presentation import only these.
PROTOCOL = {
    f"{REMOTE}.protocol",
    f"{REMOTE}.wire",
    f"{REMOTE}.measures",
    f"{REMOTE}.patch_types",
    f"{REMOTE}.routing",
    f"{REMOTE}.server_argv",
    f"{REMOTE}.placements",
}


def test_outside_the_agent_only_its_protocol_is_imported() -> None:
    # The client and presentation read the protocol's types; the handlers run on hosts.
    graph = import_graph()
    assert "deployctl.remote.protocol" in graph["deployctl.ops.runs"]
    assert "deployctl.remote.measures" in graph["deployctl.ops.bench"]
    for name, deps in graph.items():
        if name == REMOTE or name.startswith(REMOTE + "."):
            continue
        allowed = REMOTE_IMPORTERS.get(name, set())
        for dep in deps:
            if dep.startswith(REMOTE + ".") and dep not in PROTOCOL:
                assert "*" in allowed or dep in allowed, (name, dep)


def test_the_protocol_modules_declare_and_do_nothing() -> None:
    # What the client may import of the agent holds types, constants and pure helpers: it
    # imports no handler (its own kind only) and nothing that reaches the host (os, subprocess).
    for name in PROTOCOL:
        path = PACKAGE / "remote" / f"{name.rsplit('.', 1)[1]}.py"
        for level, module in remote_imports(path):
            if level:
                assert f"{REMOTE}.{module}" in PROTOCOL, (path.name, module)
            else:
                assert module in {"__future__", "typing", "collections.abc"}, (path.name, module)


# Issue 40: each module of the agent stays small enough to read whole; past this, split one
# concern out (as measures.py was out of protocol.py).
REMOTE_MAX_LINES = 600


def test_each_module_of_the_agent_is_under_600_lines() -> None:
    paths = sorted((PACKAGE / "remote").glob("*.py"))
    assert paths
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    assert not {n: s for n, s in sizes.items() if s >= REMOTE_MAX_LINES}, sizes


def test_only_the_connection_module_imports_fabric_or_paramiko() -> None:
    for path in PACKAGE.rglob("*.py"):
        tops = {name.split(".")[0] for name in imported_names(path)}
        assert path.name == "connection.py" or not tops & {"fabric", "paramiko", "invoke"}, path


SHARED_FLAGS = ["--inventory", "--hosts", "--forks", "--accept-new-host-keys", "--known-hosts"]


def test_the_cli_declares_each_shared_option_once() -> None:
    source = "".join(p.read_text(encoding="utf-8") for p in (PACKAGE / "cli").glob("*.py"))
    for flag in [*SHARED_FLAGS, "--json", "--project"]:
        assert source.count(f'"{flag}"') == 1, flag


def test_every_fleet_command_takes_the_shared_options() -> None:
    import typer.main

    from deployctl.cli import app

    root: Any = typer.main.get_command(app)
    patch = root.commands["patch"]
    commands = {**root.commands, **{f"patch {n}": c for n, c in patch.commands.items()}}
    fleet = ["gpus", "crash", "launch", "stop", "status", "restart", "logs", "watch"]
    fleet += ["patch apply", "patch revert", "patch audit"]
    for name in fleet:
        flags = {opt for param in commands[name].params for opt in param.opts}
        assert set(SHARED_FLAGS) <= flags, (name, set(SHARED_FLAGS) - flags)
        assert "--json" in flags, name


def test_the_wheel_lists_every_package_of_the_source_tree() -> None:
    # A package left out of pyproject's list is missing from `pip install .` (not -e): its
    # imports fail only there.
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert listed == found


def layer_table() -> list[str]:
    """The rows of the architecture page's layer table (its header row first)."""
    page = PACKAGE.parent / "docs" / "development" / "architecture.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    start = lines.index("| layer | modules | what it does | may import |")
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_layer_table_names_every_module() -> None:
    # A module of the top level is named `name.py`; a package `name/`, in a row that names
    # each of its modules, `module` or `module.py`.
    table = layer_table()
    missing = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name != "__init__.py" and f"`{path.name}`" not in "".join(table):
            missing.append(path.name)
    for package in sorted(p.parent for p in PACKAGE.glob("*/__init__.py")):
        rows = [row for row in table if f"`{package.name}/" in row]
        if not rows:
            missing.append(f"{package.name}/")
        for module in sorted(package.glob("*.py")):
            named = (f"`{module.stem}`", f"`{module.name}`")
            if module.name != "__init__.py" and not any(n in r for n in named for r in rows):
                missing.append(f"{package.name}/{module.name}")
    assert not missing, (
        f"docs/development/architecture.md's layer table does not name: {', '.join(missing)}"
    )
