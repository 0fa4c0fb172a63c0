"""What every command shares: the app, the shared options, `Session`, `fleet_command`, the
exit status and `main`.

Each command body builds one result from the library and returns it with the `View` that
shows it; `fleet_command` declares the shared options, hands the body a ready `Session`,
shows the result and turns it into the exit status (`exit_status`, the one place that
decides it). `main` maps exceptions to exit codes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from deployctl import DEFAULT_FORKS, __version__, interrupts
from deployctl.cli.options import complete_deployments, complete_hosts
from deployctl.errors import DeployctlError, UsageError

if TYPE_CHECKING:  # the real imports are lazy, so `deployctl --help` starts fast
    from deployctl.connection import Connection
    from deployctl.crash import Catalog
    from deployctl.events import EventSink
    from deployctl.fanout import Fleet, FleetResult
    from deployctl.inventory import Host, Inventory
    from deployctl.patchset import PatchSet
    from deployctl.present.views import View
    from deployctl.project import Project

T = TypeVar("T")

PROG = "deployctl"

app = typer.Typer(
    name="deployctl",
    help="Deploy and operate SGLang inference servers on multi-GPU hosts over SSH.",
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)
patch_app = typer.Typer(help="SGLang patch sets: list, apply, revert, audit.", no_args_is_help=True)
app.add_typer(patch_app, name="patch")
router_app = typer.Typer(
    help="SGLang's router: keep its list of workers true.", no_args_is_help=True
)
app.add_typer(router_app, name="router")


# ---- the options every fleet command shares, declared once ---------------------------------


@dataclass(frozen=True)
class SessionOptions:
    """The shared options' values; a command that does not take one gets its default."""

    inventory: tuple[Path, ...] = ()
    vault_password_file: tuple[Path, ...] = ()
    vault_id: tuple[str, ...] = ()
    hosts: str | None = None
    deployment: str | None = None
    project: Path | None = None
    forks: int = DEFAULT_FORKS
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None
    json: bool = False


def _shared(
    name: str, annotation: Any, default: Any, *decls: str, **option: Any
) -> inspect.Parameter:
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, typer.Option(*decls, **option)],
    )


# Grouped by what a command needs: an inventory, hosts to select, connections to open, a
# JSON document.
SHARED_OPTIONS: dict[str, list[inspect.Parameter]] = {
    "inventory": [
        _shared(
            "inventory", list[Path] | None, None, "-i", "--inventory",
            help="Ansible inventory: YAML, INI, JSON, a folder or a dynamic source; repeat to merge "
            "(default: $DEPLOYCTL_INVENTORY, the project's, or localhost).",
        ),
        _shared(
            "vault_password_file", list[Path] | None, None, "--vault-password-file",
            help="Passed to Ansible to decrypt vaulted inventory values.",
        ),
        _shared(
            "vault_id", list[str] | None, None, "--vault-id",
            help="Passed to Ansible to decrypt vaulted inventory values (ID@SOURCE).",
        ),
    ],
    "deployment": [
        _shared(
            "deployment", str | None, None, "-d", "--deployment",
            help="One deployment of each host (default: every deployment).",
            autocompletion=complete_deployments,
        ),
    ],
    "connect": [
        _shared(
            "forks", int, DEFAULT_FORKS, "--forks", min=1, max=1024,
            help="Hosts worked on in parallel.",
        ),
        _shared(
            "accept_new_host_keys", bool, False, "--accept-new-host-keys",
            help="Record unknown SSH host keys (never changed ones).",
        ),
        _shared(
            "known_hosts", Path | None, None, "--known-hosts",
            help="known_hosts file (default: ~/.ssh/known_hosts).",
        ),
    ],
    "json": [_shared("json", bool, False, "--json", help="Print one JSON document.")],
    "project": [
        _shared(
            "project", Path | None, None, "--project",
            help="Project folder (default: found by walking up).",
        )
    ],
}  # fmt: skip
# Hosts to select: an inventory and -H.
SHARED_OPTIONS["select"] = [
    *SHARED_OPTIONS["inventory"],
    _shared(
        "hosts", str | None, None, "-H", "--hosts",
        help="Hosts: names, groups, globs, comma lists, all.",
        autocompletion=complete_hosts,
    ),
]  # fmt: skip
FLEET = ("select", "connect", "json", "project")
# Commands on servers: they work per deployment, and -d picks one.
SERVERS = ("select", "deployment", "connect", "json", "project")


class Session:
    """What a command needs: the project, the selected hosts and how to reach them.

    The project and the hosts are found on first use, so a command that needs neither
    (`crash --file`) never reads an inventory.
    """

    def __init__(self, options: SessionOptions, per_deployment: bool = False) -> None:
        self.options = options
        self.per_deployment = per_deployment

    @cached_property
    def project(self) -> Project:
        from deployctl.project import find_project

        return find_project(Path.cwd(), self.options.project)

    @cached_property
    def inventory(self) -> Inventory:
        from deployctl.inventory import VaultOptions, resolve_inventory

        vault = VaultOptions(
            tuple(str(p) for p in self.options.vault_password_file), self.options.vault_id
        )
        inventory = resolve_inventory(
            self.options.inventory, self.project.default_inventory(), vault
        )
        if inventory.warnings:  # stderr, so --json on stdout stays one document
            from deployctl.present.terminal import tagged

            sys.stderr.writelines(tagged("warning", w.text, w.host) for w in inventory.warnings)
        return inventory

    @cached_property
    def hosts(self) -> list[Host]:
        return self.inventory.select(self.options.hosts)

    @cached_property
    def targets(self) -> list[Host]:
        """What the command works on: the hosts, or for server commands their deployments."""
        if not self.per_deployment:
            return self.hosts
        from deployctl.deployments import deployment_targets
        from deployctl.ops.router import check_worker_urls

        targets = deployment_targets(self.hosts, self.options.deployment, self.inventory.select)
        check_worker_urls(self.inventory.select)
        return targets

    @contextmanager
    def fleet(self, hosts: list[Host] | None = None) -> Iterator[Fleet]:
        """The selected hosts (or `hosts`, outside any inventory) with one connection each,
        closed at the end."""
        from deployctl.connection import ConnectOptions
        from deployctl.fanout import Fleet

        options = ConnectOptions(
            accept_new_host_keys=self.options.accept_new_host_keys,
            known_hosts=self.options.known_hosts,
        )
        if hosts is not None:
            with Fleet(hosts, options, self.options.forks) as fleet:
                yield fleet
            return
        inventory = self.inventory
        with Fleet(
            self.targets, options, self.options.forks, inventory.origin, inventory.select
        ) as fleet:
            yield fleet

    def run(self, operation: Callable[[Host, Connection], T]) -> FleetResult[T]:
        """Run one operation on every target."""
        with self.fleet() as fleet:
            return fleet.run(operation)

    def patch_sets(self) -> dict[str, PatchSet]:
        from deployctl.patchset import load_patch_sets

        return load_patch_sets(self.project.search_dirs("patches"))

    def catalog(self) -> Catalog:
        from deployctl.ops.logs import load_user_catalog

        return load_user_catalog(self.project)


Reply = tuple["View[Any]", Any]


def event_sink(session: Session) -> EventSink | None:
    """JSON lines for a streaming command given --json; None: the command's own printer."""
    if not session.options.json:
        return None
    from deployctl.present.live import JsonLines

    return JsonLines()


class _CleanedUp(Exception):
    """Ctrl-C ended a command that cleaned up after itself and said so (exit 130)."""


def _option_value(value: Any) -> Any:
    """A repeatable option's values as a tuple (none given: empty), others as they are."""
    if isinstance(value, list):
        return tuple(value)
    return value


def fleet_command(
    group: typer.Typer, name: str | None = None, *, options: tuple[str, ...] = FLEET
) -> Callable[[Callable[..., Reply]], Callable[..., Reply]]:
    """Register `func(session, **own_options) -> (view, result)` with the shared options added."""

    def decorate(func: Callable[..., Reply]) -> Callable[..., Reply]:
        own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]
        shared = [p for group_name in options for p in SHARED_OPTIONS[group_name]]

        def command(**values: Any) -> int:
            given = {p.name: _option_value(values.pop(p.name)) for p in shared}
            chosen = {k: v for k, v in given.items() if v is not None}  # else the default
            session = Session(SessionOptions(**chosen), "deployment" in options)
            try:
                view, result = func(session, **values)
            except Exception as exc:
                if session.options.json:  # a script still reads one document; main says why
                    _print_failure_document(exc)
                raise
            code = finish(view, result, session.options.json)
            if code == 130:
                raise _CleanedUp

            return code

        command.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
        command.__doc__ = func.__doc__
        group.command(name or func.__name__.replace("_", "-"))(command)
        return func

    return decorate


def _print_failure_document(exc: Exception) -> None:
    from deployctl.present.documents import failure_document
    from deployctl.present.terminal import print_json
    from deployctl.schema import versioned

    if isinstance(exc, typer.TyperException):
        exc = UsageError(exc.format_message())
    print_json(versioned(failure_document(exc)))


def finish(view: View[Any], result: Any, as_json: bool) -> int:
    """Show the result and return the exit status; keep the tracebacks of any bug."""
    from deployctl.present.terminal import print_bug
    from deployctl.present.views import render_result

    bugs = list(_bugs(result))
    render_result(view, result, as_json)
    if bugs:
        print_bug(bugs)
    return exit_status(result, bool(bugs))


def exit_status(result: Any, bug: bool = False) -> int:
    """0 when the result is good, 1 when it is not, 2 when deployctl itself failed, 130 when
    Ctrl-C ended it (and it cleaned up)."""
    if bug:
        return 2
    if getattr(result, "interrupted", False):
        return 130
    # Results that judge themselves say so in `ok`; plain listings (hosts, patch list) are good.
    return 0 if getattr(result, "ok", True) else 1


def _bugs(result: Any) -> Iterator[tuple[str, BaseException]]:
    """(host, exception) for every host that failed by a bug, anywhere in a command's result.

    Failed hosts are kept as `{name: exception}` (FleetResult.failed, LogsResult.failed);
    results that hold others (a launch holds two fleet results) are dataclasses.
    """
    from deployctl.fanout import FleetResult

    if isinstance(result, FleetResult):
        result = result.failed
    if isinstance(result, dict):
        for name, exc in result.items():
            if isinstance(exc, Exception) and not isinstance(exc, DeployctlError):
                yield name, exc
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        for field in dataclasses.fields(result):
            yield from _bugs(getattr(result, field.name))


def _version(value: bool) -> None:
    if value:
        print(f"deployctl {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """Deploy and operate SGLang inference servers on multi-GPU hosts over SSH."""
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit(2)


# ---- entry point ---------------------------------------------------------------------------


def raise_open_files_limit() -> None:
    """Lift the soft limit on open files to the hard one: a fleet command keeps about one
    descriptor per host open until it ends, plus a few per fork (measured: 296 at 256 hosts
    with the default --forks), so the usual 1,024 would fail a fleet of a thousand hosts."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 16 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main() -> None:
    """Run the CLI: one-line errors for user mistakes, a debug file for bugs, never a traceback."""
    raise_open_files_limit()
    interrupts.install()
    code = run()
    # Skip the interpreter's final garbage collection of everything paramiko and friends
    # allocated (~250 ms on a small machine): output is flushed and connections are closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@functools.cache
def command_tree() -> Any:
    """The click commands typer builds from `app`, built once per process: building them
    costs ~35 ms of CPU, and one process may run many command lines (`run` called in turn).
    Every command has registered by the time `run` is first called (`deployctl.cli`)."""
    return typer.main.get_command(app)


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command line (default: this process's) and return its exit status."""
    try:
        # The name, not `python -m deployctl`: shell completion's variable is named after it.
        result = command_tree().main(
            args=None if argv is None else list(argv), prog_name=PROG, standalone_mode=False
        )
        code = result if isinstance(result, int) else 0
        if code == 130:  # typer's answer when Ctrl-C ended the command
            _interrupted()
    except typer.TyperException as exc:  # usage errors: bad option, bad value, unknown command
        _print_error(exc.format_message())
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        code = _interrupted()
    except _CleanedUp:
        code = 130
    except typer.Exit as exc:
        code = exc.exit_code
    except SystemExit as exc:  # shell completion and --show-completion end by sys.exit
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except DeployctlError as exc:
        _print_error(exc.message, exc.hint)
        code = 1
    except Exception as exc:  # a bug: one line for the user, the traceback kept in a file
        from deployctl.errors import explain
        from deployctl.present.terminal import print_bug

        print_bug([(None, exc)], explain(exc)[0])
        code = 2
    return code


def _interrupted() -> int:
    return interrupts.say_interrupted()


def _print_error(message: str, hint: str | None = None) -> None:
    from deployctl.present.terminal import print_error  # loaded only when an error is printed

    print_error(message, hint)
