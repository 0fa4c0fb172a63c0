"""Launch: render the command per host, preflight every host, start detached, wait for ready."""

from __future__ import annotations

from collections.abc import Sequence

from deployctl.errors import DeployctlError
from deployctl.fanout import HostResult
from deployctl.inventory import Host
from deployctl.project import Project
from deployctl.render import RenderedCommand, TemplateSet, default_template, parse_overrides


def render_commands(
    project: Project,
    hosts: Sequence[Host],
    template: str | None,
    threshold: int | None,
    set_pairs: Sequence[str],
) -> list[HostResult[RenderedCommand]]:
    """Render the launch command for each host (locally; no host is contacted)."""
    overrides = parse_overrides(set_pairs)
    templates = TemplateSet(project.search_dirs("templates"))
    results: list[HostResult[RenderedCommand]] = []
    for host in hosts:
        try:
            name = default_template(host, template, threshold)
            rendered = templates.render(host, name, threshold, overrides)
            results.append(HostResult(host, value=rendered))
        except DeployctlError as exc:
            results.append(HostResult(host, error=exc.message, hint=exc.hint))
    return results
