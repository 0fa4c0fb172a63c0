"""Commands on the inventory: its hosts, the commands it renders, their GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deployctl.cli.options import SetOpt, TemplateOpt, ThresholdOpt, complete_ssh_names
from deployctl.cli.session import SERVERS, Reply, Session, app, fleet_command


@fleet_command(app, options=("select", "json", "project"))
def hosts(
    session: Session,
    graph: Annotated[
        bool, typer.Option("--graph", help="Show the group tree (of the -H group, else all).")
    ] = False,
) -> Reply:
    """Show the selected hosts with their connection and merged variables."""
    from deployctl.present import views

    if graph:
        top = session.options.hosts or "all"
        return views.GRAPH, (session.inventory.graph(top), session.inventory.subtree(top))
    return views.HOSTS, {h.name: h.describe() for h in session.hosts}


@fleet_command(app, options=SERVERS)
def render(
    session: Session,
    template: TemplateOpt = None,
    threshold: ThresholdOpt = None,
    set_: SetOpt = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Ask each host's SGLang whether it accepts the command (starts nothing).",
        ),
    ] = False,
) -> Reply:
    """Print, per host, the exact shell command that `launch` will run."""
    from deployctl.ops.plan import render_commands
    from deployctl.present import views

    patch_sets = session.patch_sets()
    rendered = render_commands(
        session.project, session.targets, template, threshold, set_ or [], patch_sets
    )
    if not check:
        # A dirty GPU does not matter here: only hosts that failed to render count.
        return views.RENDERED, rendered
    from deployctl.ops.flags import check_commands

    with session.fleet() as fleet:
        return views.CHECKED, check_commands(fleet, rendered, patch_sets)


@fleet_command(app)
def gpus(
    session: Session,
    max_used_mib: Annotated[
        int, typer.Option("--max-used-mib", min=0, help="Memory a clean GPU may show.")
    ] = 16,
) -> Reply:
    """Show each host's GPUs and compute processes; exit 1 unless all are clean."""
    from deployctl.ops.gpus import check_gpus, find_holders
    from deployctl.present import views

    return views.GPUS, session.run(
        lambda host, conn: find_holders(host, conn, check_gpus(host, conn, max_used_mib))
    )


@fleet_command(app, options=("inventory", "connect", "json", "project"))
def init(
    session: Session,
    hosts: Annotated[
        list[str],
        typer.Argument(
            help="Hosts to read: SSH names (~/.ssh/config) or user@address[:port].",
            autocompletion=complete_ssh_names,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="File to write (default: the -i file, extended; else the project's "
            "inventories/default.yml; else ./inventory.yml).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing file (a backup is kept).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the inventory; write nothing.")
    ] = False,
) -> Reply:
    """Read hosts (GPUs and their links, Pythons with SGLang, patch sets, ports, models,
    Slurm) and write an inventory that launches on them; -i adds them to a YAML inventory."""
    from deployctl.ops.init import extended_file, hosts_of, init_inventory, output_path
    from deployctl.present import views

    extended = extended_file(session.options.inventory)
    known = session.inventory.hosts if extended else {}
    targets = hosts_of(hosts, known)
    path = output_path(extended, output, session.project.root)
    with session.fleet(targets) as fleet:
        report = init_inventory(
            fleet, session.patch_sets(), extended, path, force=force, dry_run=dry_run
        )
    return views.INIT, report
