"""The choices a user names, on the command line or in the inventory, each declared once.

The CLI offers these enums as its options' choices, the settings and `render` check a host's
values against them, and the operations take them as values. No imports: the CLI reads them
without loading what acts on them (`deployctl --help` stays fast).
"""

from __future__ import annotations

from enum import StrEnum


class ThresholdMode(StrEnum):
    """How `--threshold N` reaches SGLang (`render` says what each renders)."""

    PATCH = "patch"  # the spec-disable set's flag
    ADAPTIVE = "adaptive"  # stock SGLang's adaptive speculation, no patch needed


class Keep(StrEnum):
    """What serves after a tune."""

    TUNED = "tuned"
    BASELINE = "baseline"
    NONE = "none"  # leave the deployment as tune found it (its previous run, or nothing)


class BenchTool(StrEnum):
    """The load generator of a bench."""

    BUILTIN = "builtin"  # the host agent's own, standard library only
    SGLANG = "sglang"  # SGLang's serving benchmark on the host


class LaunchKind(StrEnum):
    """How a deployment's servers start (the `launcher` setting); each is a launcher of
    deployctl/launchers/."""

    PROCESS = "ssh"  # a process group on the host, started over SSH
    SLURM_JOB = "slurm"  # a batch job submitted from the host, a Slurm login node


# The `launcher` setting's values: LaunchKind's, and the kind of any launcher registered
# besides (deployctl.launchers.register adds it).
LAUNCH_KINDS: list[str] = [kind.value for kind in LaunchKind]


class PdRole(StrEnum):
    """A server's part in prefill/decode disaggregation (the `role` setting): SGLang's
    `--disaggregation-mode`. A deployment without one serves whole requests."""

    PREFILL = "prefill"  # computes the prompt's KV and hands it over at its bootstrap port
    DECODE = "decode"  # fetches the KV from a prefill, then generates


# SGLang 0.5.23's `--disaggregation-transfer-backend` choices (arg_groups/choices.py).
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")


class CanaryMetric(StrEnum):
    """What a canary compares between its candidate and control at matched load."""

    ITL = "itl"  # inter-token latency, lower is better
    TTFT = "ttft"  # time to first token, lower is better
    THROUGHPUT = "throughput"  # output tokens per second per running request, higher is better


class SpeculationPolicy(StrEnum):
    """When a server speculates, as `tune --live --policies` races them."""

    THRESHOLD = "threshold"  # while the batch is at most T (deployctl's --threshold)
    ADAPTIVE = "adaptive"  # SGLang's own --speculative-adaptive, its default configuration
    OFF = "off"  # never: the same model without a draft


def spelled(choice: type[StrEnum]) -> str:
    """The choices as a sentence says them: `patch or adaptive`."""
    values = [str(c) for c in choice]
    return ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else values[0]
