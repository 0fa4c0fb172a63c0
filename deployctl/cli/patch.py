"""`deployctl patch`: list, apply, revert, port and audit patch sets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from deployctl.cli.options import complete_patch_sets
from deployctl.cli.session import SERVERS, Reply, Session, fleet_command, patch_app
from deployctl.errors import UsageError

if TYPE_CHECKING:
    from deployctl.connection import Connection
    from deployctl.fanout import FleetResult
    from deployctl.inventory import Host
    from deployctl.ops.rollout import RolloutOptions
    from deployctl.patchset import PatchSet


T = TypeVar("T")

RollingPatchOpt = Annotated[
    bool,
    typer.Option(
        "--rolling",
        help="Change each deployment's host while it is out of its router, one unit at a time, "
        "and relaunch it on the change (as rollout does).",
    ),
]


NamesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Patch set names (default: each host's `patches`).",
        autocompletion=complete_patch_sets,
    ),
]


@fleet_command(patch_app, "list", options=("json", "project"))
def patch_list(session: Session) -> Reply:
    """List the patch sets with version, content hash and supported SGLang versions."""
    from deployctl.present import views

    return views.PATCH_LIST, list(session.patch_sets().values())


@fleet_command(patch_app, "apply", options=SERVERS)
def patch_apply(
    session: Session,
    names: NamesArg = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check every hunk; change nothing.")
    ] = False,
    rolling: RollingPatchOpt = False,
) -> Reply:
    """Apply patch sets: every hunk checked first, backups kept, compiled and verified; a set
    the files already have is adopted (recorded, no file changed)."""
    from deployctl.ops.patch import apply_patches
    from deployctl.present import views

    if rolling:
        from deployctl.cli.rollout import roll_out  # here: the module registers its commands

        return roll_out(session, _rolling_patch(names, "apply"), dry_run, (names or [], True))

    return views.PATCH_ACTIONS, _per_installation(
        session, names, lambda host, conn, sets: apply_patches(host, conn, sets, dry_run)
    )


@fleet_command(patch_app, "revert", options=SERVERS)
def patch_revert(
    session: Session,
    names: NamesArg = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Restore the recorded backup even over files that drifted."),
    ] = False,
    rolling: RollingPatchOpt = False,
) -> Reply:
    """Take patch sets out: the recorded backup while the files are as the apply left them
    (hashes checked), else each set's reverse diff, hunk by hunk."""
    from deployctl.ops.patch import revert_patches
    from deployctl.present import views

    if rolling:
        from deployctl.cli.rollout import roll_out  # here: the module registers its commands

        return roll_out(
            session, _rolling_patch(names, "revert", force), False, (names or [], False)
        )

    return views.PATCH_ACTIONS, _per_installation(
        session, names, lambda host, conn, sets: revert_patches(host, conn, sets, force)
    )


def _rolling_patch(names: list[str] | None, verb: str, force: bool = False) -> RolloutOptions:
    """The rollout a `--rolling` patch change is: every unit replaced, through its router."""
    from deployctl.ops.rollout import RolloutOptions

    if not names:
        raise UsageError(
            "--rolling needs the patch sets to change",
            hint="deployctl rollout applies each host's `patches` as they are now",
        )
    if force:
        raise UsageError("--rolling does not take --force")
    return RolloutOptions(restart=True, what=f"patch {verb} --rolling")


def _per_installation(
    session: Session,
    names: list[str] | None,
    action: Callable[[Host, Connection, list[PatchSet]], T],
) -> FleetResult[T]:
    """Run a patch action once per SGLang installation of the targets, with the sets named
    (else each deployment's `patches`)."""
    from deployctl.ops.patch import per_installation, sets_per_host

    wanted = sets_per_host(session.targets, session.patch_sets(), names or [])
    with session.fleet() as fleet:
        return per_installation(fleet, session.targets, wanted, action)


@fleet_command(patch_app, "port")
def patch_port(
    session: Session,
    name: Annotated[
        str, typer.Argument(help="The patch set to port.", autocompletion=complete_patch_sets)
    ],
    to: Annotated[str, typer.Option("--to", help="The SGLang release to port to, e.g. 0.5.22.")],
    source: Annotated[
        Path | None,
        typer.Option("--from", help="That release's wheel or site-packages (else -H: a host's)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Candidate folder (default: ./<set>-<release>-candidate)."
        ),
    ] = None,
) -> Reply:
    """Port a set to another SGLang release: a candidate variant and a per-hunk report."""
    from deployctl.ops.port import port_from_host, port_set
    from deployctl.patchset import select_sets
    from deployctl.present import views

    [patch_set] = select_sets(session.patch_sets(), [name])[-1:]
    target = out if out is not None else Path.cwd() / f"{name}-{to}-candidate"
    if source is not None:
        return views.PORT, port_set(patch_set, to, source, target)
    if session.options.hosts is None or len(session.hosts) != 1:
        raise UsageError(
            "patch port needs --from WHEEL|SITE, or -H naming one host that has the release",
        )
    [host] = session.hosts
    with session.fleet() as fleet:
        result = fleet.run(lambda h, conn: port_from_host(h, conn, patch_set, to, target), [host])
    if result[0].exception is not None:
        raise result[0].exception
    assert result[0].value is not None
    return views.PORT, result[0].value


@fleet_command(patch_app, "audit", options=SERVERS)
def patch_audit(
    session: Session,
    expect: Annotated[
        list[str] | None,
        typer.Option(
            "--expect", help="Expected set (repeatable).", autocompletion=complete_patch_sets
        ),
    ] = None,
) -> Reply:
    """Show which patch set versions each host's files have (its records second); exit 1
    unless all expected are applied."""
    from deployctl.ops.patch import audit_host
    from deployctl.patchset import select_sets
    from deployctl.present import views

    available = session.patch_sets()
    select_sets(available, expect or [])  # unknown names fail before any host is contacted
    results = session.run(lambda host, conn: audit_host(host, conn, available, expect or []))
    return views.AUDIT, results
