"""Render launch commands from Jinja2 templates, with every value quoted for the shell."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployctl.choices import ThresholdMode, spelled
from deployctl.deployments import server_env
from deployctl.errors import TemplateError, UsageError
from deployctl.inventory import Host, secret_values
from deployctl.launchers import launcher_for
from deployctl.masking import MASK, flag_secrets, is_secret_name, mask_text
from deployctl.project import TEMPLATE_SUFFIX, template_names
from deployctl.remote.server_argv import CommandValues
from deployctl.settings import PREFIX, Settings, overlay
from deployctl.shell import join, quote, split

THRESHOLD_FLAG = "--speculative-disable-batch-threshold"
# `threshold_mode` (`ThresholdMode`): how --threshold N reaches SGLang. `patch`: the
# spec-disable set's flag. `adaptive`: stock SGLang's adaptive speculation, configured to draft
# S steps for batches up to N and none above (one candidate per batch-size slot, so acceptance
# never moves it).
ADAPTIVE_FLAG = "--speculative-adaptive"
ADAPTIVE_CONFIG_FLAG = "--speculative-adaptive-config"
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class RenderedCommand:
    """A launch command: its argv, the shell line, and a display copy with secrets masked."""

    template: str
    threshold: int | None
    argv: list[str]
    secrets: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # for the server only, over the login's
    deployment: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # written on the host before it starts
    threshold_mode: ThresholdMode | None = (
        None  # how the threshold reaches SGLang (None: no threshold)
    )
    launcher_script: str = ""  # its launcher's wrapper (a Slurm batch script), masked; "" if none

    @property
    def command(self) -> str:
        return join(self.argv)

    @property
    def argv_shown(self) -> list[str]:
        """The words with secrets masked (see mask_text)."""
        return [mask_text(arg, self.secrets) for arg in self.argv]

    @property
    def display(self) -> str:
        """Return the shell line with secret values masked."""
        return join(self.argv_shown)

    @property
    def env_shown(self) -> dict[str, str]:
        """The environment as people may see it: secret-looking names' values masked, and
        the secrets in the others' (see mask_text)."""
        return {
            name: MASK if is_secret_name(name) and value else mask_text(value, self.secrets)
            for name, value in self.env.items()
        }

    @property
    def display_lines(self) -> str:
        """`KEY=value` lines (shell-quoted, masked), then the command: what `render` shows;
        a Slurm job's batch script, which holds both."""
        if self.launcher_script:
            return self.launcher_script.rstrip("\n")
        lines = [f"{name}={shlex.quote(value)}" for name, value in self.env_shown.items()]
        return "\n".join([*lines, self.display])

    @property
    def log_stem(self) -> str:
        """Name what runs: deployment, template and threshold, e.g. eagle3_t5 or r1_eagle3_t5."""
        stem = self.template if self.threshold is None else f"{self.template}_t{self.threshold}"
        if self.deployment is not None:
            stem = f"{self.deployment}_{stem}"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)


def command_secrets(variables: Mapping[str, Any], argv: Sequence[str]) -> tuple[str, ...]:
    """What to mask in a command: secret variables' values and values of secret flags."""
    found = {*secret_values(variables), *flag_secrets(argv)}
    return tuple(sorted(found, key=lambda v: (-len(v), v)))


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Parse --set KEY=VALUE pairs; values are YAML scalars (8 → int, true → bool)."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not _VAR_NAME.match(key):
            raise UsageError(
                f"--set {pair!r} is not KEY=VALUE with a variable name as KEY",
                hint="e.g. --set model_path=/shared/models/x --set tp=8",
            )
        overrides[key] = _scalar(text)
    return overrides


def _scalar(text: str) -> Any:
    """Type a --set value: true/false, integers and decimals; anything else stays a string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d+", text):
        return float(text)
    return text


def _finalize(value: Any) -> str:
    """Quote each value that a template prints; lists become one quoted word per item."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(quote(item) for item in value)
    return quote(value)


class TemplateSet:
    """The launch templates found in the project and the package."""

    def __init__(self, search_dirs: Sequence[Path]) -> None:
        import jinja2.sandbox

        self.search_dirs = list(search_dirs)
        # Sandboxed: a template cannot reach Python's internals (`cycler.__init__.__globals__`).
        self.env = jinja2.sandbox.SandboxedEnvironment(
            loader=jinja2.FileSystemLoader([str(d) for d in self.search_dirs]),
            undefined=jinja2.StrictUndefined,
            finalize=_finalize,
            autoescape=False,
            keep_trailing_newline=True,
        )

    def check(self, host: Host, template: str) -> None:
        """Refuse a template name that names no template, saying which there are."""
        names = template_names(self.search_dirs)
        if template not in names:
            hint = "available: " + (", ".join(names) or "none")
            own = host.settings.spelling("template") == "template"
            if own and host.settings.given("template") == template:  # the bare name: whose?
                hint += (
                    f"; if `template` is your own variable, set {PREFIX}template for deployctl's"
                )
            raise TemplateError(f"unknown template {template!r}", hint=hint)

    def render(
        self,
        host: Host,
        template: str,
        threshold: int | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> RenderedCommand:
        """Render the template for a host; a missing variable is an error naming it."""
        import jinja2

        self.check(host, template)
        where = f"host {host.label}"
        variables = Settings(overlay(host.vars, overrides or {}, where), where).context()
        settings = Settings(variables, where)
        context = {
            **variables,
            # What the launcher fills in (a multi-node job's rank and meeting point).
            **launcher_for(settings).template_context(settings),
            "inventory_hostname": host.name,
            "deployment": host.deployment,
            "template": template,
            "threshold": threshold,
        }
        try:
            text = self.env.get_template(template + TEMPLATE_SUFFIX).render(context)
        except jinja2.UndefinedError as exc:
            missing = re.search(r"'(\w+)' is undefined", str(exc))
            if missing is None:  # an attribute or key of a defined variable: `cfg.nope`
                raise TemplateError(
                    f"template {template!r} for host {host.name}: {exc}",
                    hint="check the template's expression against the variable's value",
                ) from None
            name = missing.group(1)
            raise TemplateError(
                f"template {template!r} needs variable {name!r}, which host {host.name} does not define",
                hint=f"define it in the inventory or pass --set {name}=VALUE",
            ) from None
        except UnicodeDecodeError as exc:
            raise TemplateError(
                f"template {template!r} (or one it includes) is not UTF-8 text: byte {exc.start} "
                f"is {exc.object[exc.start : exc.start + 1]!r}"
            ) from None
        except jinja2.TemplateError as exc:
            lineno = getattr(exc, "lineno", None)
            where = f" line {lineno}" if lineno else ""
            raise TemplateError(f"template {template!r}{where}: {exc}") from None
        try:
            argv = split(text)
        except ValueError as exc:
            raise TemplateError(
                f"template {template!r} rendered an unbalanced command: {exc}"
            ) from None
        if not argv:
            raise TemplateError(f"template {template!r} rendered an empty command")
        mode, files = None, {}
        if threshold is not None:
            mode = threshold_mode(host, variables)
            if mode == ThresholdMode.ADAPTIVE:
                files = adaptive_threshold(host, variables, argv, threshold)
            elif not any(a.split("=", 1)[0] == THRESHOLD_FLAG for a in argv):
                argv.append(f"{THRESHOLD_FLAG}={threshold}")
        env = server_env(host, variables)
        secrets = command_secrets(variables, argv)
        return RenderedCommand(
            template, threshold, argv, secrets, env, host.deployment, files, mode
        )


def threshold_mode(host: Host, variables: Mapping[str, Any]) -> ThresholdMode:
    mode = str(Settings(variables, f"host {host.label}").value("threshold_mode"))
    if mode not in set(ThresholdMode):
        raise TemplateError(
            f"host {host.label}: threshold_mode {mode!r} is not {spelled(ThresholdMode)}",
            hint="patch: the spec-disable set's flag; adaptive: stock SGLang's "
            "--speculative-adaptive, no patch needed",
        )
    return ThresholdMode(mode)


def adaptive_config_path(state_dir: str, threshold: int, steps: int) -> str:
    """Where the host keeps the adaptive config, beside the run records; named by what it
    holds, so every run of one threshold shares one file that is never rewritten otherwise.
    A `~/` path becomes relative: the server runs from the home folder, and no shell expands
    a `~` inside `--flag=~/x`."""
    path = f"{state_dir.rstrip('/')}/runs/adaptive-t{threshold}-s{steps}.json"
    return path[2:] if path.startswith("~/") else path


def adaptive_threshold(
    host: Host, variables: Mapping[str, Any], argv: list[str], threshold: int
) -> dict[str, str]:
    """Add stock SGLang's adaptive flags for --threshold to argv; return the config file."""
    values = CommandValues(argv)
    steps = str(values.get("speculative_num_steps") or "")
    topk = values.get("speculative_eagle_topk")
    if not steps.isdigit() or int(steps) < 1:
        raise TemplateError(
            f"host {host.label}: threshold_mode adaptive needs --speculative-num-steps N in "
            "the command (the steps drafted up to the threshold)",
            hint="use the eagle3 template, or set speculative_num_steps",
        )
    if topk not in (None, "1"):
        raise TemplateError(
            f"host {host.label}: threshold_mode adaptive needs --speculative-eagle-topk 1 "
            f"(SGLang's adaptive speculation supports only topk 1; the command has {topk})",
            hint="--set speculative_eagle_topk=1",
        )
    state_dir = Settings(variables, f"host {host.label}").state_dir
    path = adaptive_config_path(state_dir, threshold, int(steps))
    config = {"1": {"candidate_steps": [int(steps)]}, str(threshold + 1): {"candidate_steps": [0]}}
    argv += [ADAPTIVE_FLAG, f"{ADAPTIVE_CONFIG_FLAG}={path}"]
    return {path: json.dumps(config, sort_keys=True) + "\n"}


def default_template(host: Host, template: str | None, threshold: int | None) -> str:
    """Pick the template: the option, else the host's `template` variable, else by threshold."""
    if template:
        return template
    if host.settings.template:
        return host.settings.template
    return "eagle3" if threshold is not None else "baseline"
