"""The `--json` contract, declared once: every shape a document has, and each command's schema
built from them. `python -m tools.contract --write` generates the shipped files in
deployctl/data/schemas/ from it (self-contained: each carries the `$defs` it uses); `--check`
fails with the diff when the files and this source drift (tests/test_schema_source.py runs it).
A development tool: it lives outside the installed package, which only ships the files.

Declared here rather than as TypedDicts: documents are plain dicts built in documents.py, and
the contract says what types cannot (keys required only when an entry is ok, a variant per
flag, a failure of the whole command, patterns), so each shape is a JSON Schema fragment built
by the small typed helpers below; a shape used by several commands is declared once.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from deployctl.choices import SpeculationPolicy
from deployctl.metrics import COUNTERS, GAUGES, HISTOGRAMS
from deployctl.remote.measures import (
    CanaryRecord,
    Crossover,
    LevelFigures,
    PhaseRecord,
    TuneRecord,
    Verdict,
)

Schema = dict[str, Any]

SCHEMAS = Path(__file__).resolve().parent.parent / "deployctl" / "data" / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE = "python -m tools.contract --write"

POLICY = {"enum": [str(p) for p in SpeculationPolicy]}  # tune --live --policies


def ref(name: str, description: str | None = None) -> Schema:
    """A shape declared in DEFINITIONS; the generator copies it into the file's `$defs`."""
    return described({"$ref": f"#/$defs/{name}"}, description, {})


def described(schema: Schema, description: str | None, more: dict[str, Any]) -> Schema:
    return {**schema, **({"description": description} if description else {}), **more}


def string(description: str | None = None, **more: Any) -> Schema:
    return described({"type": "string"}, description, more)


def integer(description: str | None = None, **more: Any) -> Schema:
    return described({"type": "integer"}, description, more)


def number(description: str | None = None, **more: Any) -> Schema:
    return described({"type": "number"}, description, more)


def boolean(description: str | None = None, **more: Any) -> Schema:
    return described({"type": "boolean"}, description, more)


def nullable(kind: str, description: str | None = None, **more: Any) -> Schema:
    """A value of `kind`, or null."""
    return described({"type": [kind, "null"]}, description, more)


def array(items: Schema, description: str | None = None, **more: Any) -> Schema:
    return described({"type": "array", "items": items}, description, more)


def map_of(values: Schema, description: str | None = None, **more: Any) -> Schema:
    """An object whose keys are names (hosts, deployments, runs) and whose values are `values`."""
    return described({"type": "object", "additionalProperties": values}, description, more)


def obj(
    properties: dict[str, Schema],
    required: Sequence[str] | None = None,
    description: str | None = None,
    required_when_ok: Sequence[str] | None = None,
    more: dict[str, Any] | None = None,
    **keywords: Any,
) -> Schema:
    """An object with these properties; `required_when_ok`: keys an entry has unless it failed
    (its `error` is null)."""
    schema: Schema = {"type": "object"}
    if description:
        schema["description"] = description
    if required is not None:
        schema["required"] = list(required)
    if properties:
        schema["properties"] = properties
    schema.update(keywords)
    schema.update(more or {})
    if required_when_ok is not None:
        schema["if"] = {"required": ["error"], "properties": {"error": {"type": "null"}}}
        schema["then"] = {"required": list(required_when_ok)}
    return schema


def declared(
    typed: type, properties: dict[str, Schema], description: str | None = None, **keywords: Any
) -> Schema:
    """An object the protocol declares as a TypedDict (the tune record, kept on the host):
    its keys and which are required come from the declaration, so the schema and what the
    host and the readers check cannot drift; `properties` give each key's JSON shape."""
    keys: frozenset[str] = typed.__required_keys__ | typed.__optional_keys__  # type: ignore[attr-defined]
    if set(properties) != keys:
        raise TypeError(
            f"{typed.__name__}: the schema's keys differ from the declaration's: "
            f"{sorted(set(properties) ^ keys)}"
        )
    required = [key for key in properties if key in typed.__required_keys__]  # type: ignore[attr-defined]
    return obj(properties, required=required, description=description, **keywords)


# A canary's record (the host keeps it; `canary --json` is it and more).
CANARY_FIELDS: dict[str, Schema] = {
    "canary": nullable("integer", "Its number on the router's host; null when not kept."),
    "router": string(),
    "state": {
        "enum": ["planned", "running", "done"],
        "description": "running: still judged (or its deployctl was killed; see updated_at).",
    },
    "started_at": number("Seconds since the epoch."),
    "updated_at": number("When the record was last written (each 5 s while running)."),
    "candidates": array(string(), "The replicas that tried the inventory's configuration."),
    "controls": array(string(), "The replicas left on their run, compared against."),
    "metric": {"enum": ["itl", "ttft", "throughput"]},
    "max_regression": number("The minimum detectable effect, as a fraction (0.05: 5 %)."),
    "confidence": number("1 - the false-alarm rate."),
    "verdict": {"enum": ["regression", "no_regression", "undecided", None]},
    "estimate": nullable(
        "number",
        "Candidate over control at matched load, oriented so that above 1 is worse (throughput inverted).",
    ),
    "low": nullable("number"),
    "high": nullable("number"),
    "samples": integer("Matched samples (both sides of a load bucket present)."),
    "buckets": array(
        obj(
            {
                "bucket": integer("Running requests, rounded up to a CUDA-graph batch size."),
                "control_n": integer(),
                "candidate_n": integer(),
                "control": nullable("number"),
                "candidate": nullable("number"),
                "ratio": nullable("number"),
            },
            required=["bucket", "control_n", "candidate_n", "control", "candidate", "ratio"],
        )
    ),
    "reason": string("Why it ended as it did."),
    "decision": {
        "enum": ["promoted", "rolled back", "kept", "failed", None],
        "description": "failed: not carried through (the canaries' configuration did not serve, the router stopped answering, or the canaries gave nothing to compare), the canaries put back.",
    },
    "elapsed_s": number("Seconds spent judging."),
    "interrupted": boolean("Ctrl-C: the canaries were put back."),
    "steps": array(
        obj(
            {
                "step": {"enum": ["split", "rollback", "promotion"]},
                "unit": string(),
                "outcome": string(),
                "old_run": nullable("string"),
                "new_run": nullable("string"),
                "error": nullable("string"),
            },
            required=["step", "unit", "outcome", "old_run", "new_run", "error"],
        ),
        "Every replacement made, in order: the split, then the rollback or the promotion.",
    ),
}


# What every outcome says: a host's, a deployment's, a unit's.
OUTCOME: dict[str, Schema] = {
    "ok": boolean(),
    "error": nullable("string", "The failure in one line; null when it worked."),
    "code": nullable(
        "string",
        "The failure's stable code (see the README); null when it worked.",
        pattern="^[a-z][a-z0-9_]*$",
    ),
    "hint": string(),
}


def host_entry_shape(stem: str, also_required: Sequence[str] = ()) -> Schema:
    """A host's entry in a per-host document: the `{stem}Outcome`, or with several deployments
    one such entry for each under `deployments` and no error or code of its own."""
    return obj(
        {"deployments": map_of(ref(f"{stem}Deployment"))},
        required=["ok", *also_required],
        description="One host; with several deployments, one entry for each under `deployments`"
        " (a host entry with only those has no error or code of its own).",
        allOf=[ref(f"{stem}Outcome")],
        anyOf=[{"required": ["error", "code"]}, {"required": ["deployments"]}],
    )


def deployment_entry(stem: str) -> Schema:
    """One deployment's entry under its host: the `{stem}Outcome`, with its error and code."""
    return obj(
        {},
        required=["ok", "error", "code"],
        description="One deployment of a host.",
        allOf=[ref(f"{stem}Outcome")],
    )


# A tune entry's outcome fields (as kept on its host): no code pattern, a hint that may be null.
TUNE_OUTCOME: dict[str, Schema] = {
    "ok": boolean(),
    "error": nullable("string"),
    "code": nullable("string"),
    "hint": nullable("string"),
}


def tune_host_entry(outcome: str, what: str) -> Schema:
    """A host's entry in a tune document: the `outcome`, or with several deployments one such
    entry for each under `deployments` and no error of its own."""
    return obj(
        {"ok": boolean("Every entry under the host is ok."), "deployments": map_of(ref(outcome))},
        required=["ok"],
        description=f"One host's {what}. With several deployments, one entry for each under"
        " `deployments` (a host entry with only those has no error or code of its own).",
        anyOf=[ref(outcome), {"required": ["deployments"], "not": {"required": ["error"]}}],
    )


def kept_report(prefix: str, record: str, command: str, one: str, many: str) -> dict[str, Schema]:
    """`<prefix>Reported` and `<prefix>Kept`: a `--report` of records kept on routers' hosts,
    per router's host (and deployment), its record `record` or why there is none."""
    kept = f"{prefix}Kept"
    return {
        f"{prefix}Reported": obj(
            {"hosts": map_of(tune_host_entry(kept, f"kept {many}"))},
            required=["hosts"],
            description=f"deployctl {command} --report --json: per router's host (and deployment), its kept {one}.",
        ),
        kept: obj(
            {
                **OUTCOME,
                "record": {"anyOf": [ref(record), {"type": "null"}]},
                "numbers": array(integer(), f"Every kept {one} of the router, oldest first."),
                "unreadable": array(string(), f"Kept files that are not {one} records: skipped."),
            },
            required=["ok", "error", "code"],
            anyOf=[
                {"properties": {"ok": {"const": False}}, "required": ["error", "code"]},
                {"required": ["record", "numbers", "unreadable"]},
            ],
        ),
    }


def event(
    kind: str, properties: dict[str, Schema], required: Sequence[str], **keywords: Any
) -> Schema:
    """One line of a JSON-lines command (logs, watch): its kind, its target and when (`at`)."""
    return obj(
        {"event": {"const": kind}, "target": string(), "at": number(), **properties},
        required=["event", "target", "at", *required],
        **keywords,
    )


def command(title: str, description: str, *documents: Schema) -> Schema:
    """A command's schema: versioned, one of its documents or the command's failure as a whole.
    No additionalProperties: a key added is no break."""
    return {
        "$schema": DRAFT,
        "title": title,
        "description": description,
        "type": "object",
        "required": ["schema"],
        "properties": {"schema": ref("schemaVersion")},
        "anyOf": [*documents, ref("failure")],
    }


# What one look at a run says, in `status`'s entries and in a run's status.
RUN_LOOK: dict[str, Schema] = {
    "alive": boolean(),
    "ready": boolean(),
    "crashed": boolean(),
    "status": nullable("string", "The run record's status (running, stopped, …)."),
    "uptime_s": nullable("integer"),
    "log": nullable("string"),
    "gpus": nullable("array", items=integer()),
    "mem_fraction_static": nullable(
        "number",
        "The share of each of its GPUs' memory the server takes (--mem-fraction-static); null when its command sets none.",
    ),
    "last_line": string(),
    "crash": nullable("string"),
    "warning": nullable("string"),
    "gpu_memory_used_mib": nullable("integer"),
    "metrics": {"oneOf": [ref("metrics"), {"type": "null"}]},
    "metrics_note": string("Why there are no metrics; empty when there are."),
    "router": ref("router"),
    "job": ref("job"),
}


DEFINITIONS: dict[str, Schema] = {
    "job": obj(
        {
            "id": string(),
            "state": string(
                "Slurm's job state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, …; UNKNOWN when Slurm no longer knows it"
            ),
            "reason": string(
                "Why a pending job waits (Resources, Priority, BeginTime, …); empty otherwise"
            ),
            "nodes": array(string(), description="Its nodes, the head first"),
            "head": string("The head node's address (NodeAddr): where the server answers"),
            "time_left_s": nullable(
                "number", "Seconds to its time limit; null without one or when not running"
            ),
            "exit_code": string("code:signal once it ended; empty before"),
        },
        required=["id", "state", "reason", "nodes", "head", "time_left_s", "exit_code"],
        description="The Slurm job this run is (launcher: slurm), as last seen: squeue, else sacct, else its record.",
        additionalProperties=False,
    ),
    "schemaVersion": integer(
        "The version of the --json contract; raised only when a key is removed, renamed or retyped (adding a key is no break).",
        minimum=1,
    ),
    "sweep": obj(
        {"hosts": map_of(ref("benchHost"))},
        required=["hosts"],
        description="deployctl bench --json",
    ),
    "comparison": obj(
        {
            "runs": map_of(ref("keptSweep")),
            "missing": array(string()),
            "errors": map_of(string(), description="Host → why its kept sweeps could not be read."),
            "unreadable": map_of(
                array(string()),
                description="Host → its kept bench files that are not JSON or not a sweep, skipped.",
            ),
        },
        required=["runs", "missing", "errors", "unreadable"],
        description="deployctl bench --compare RUNS --json",
    ),
    "suggestion": obj(
        {
            "baseline": string(),
            "speculative": string(),
            "threshold": nullable(
                "integer",
                "The largest level where speculation wins at it and every level below; null: speculation never wins.",
            ),
            "between": array(
                nullable("integer"),
                description="[last win, first loss]: the crossover lies between them. Last win null: speculation never wins; first loss null: it wins at every level measured.",
                minItems=2,
                maxItems=2,
            ),
            "crossover_unresolved": boolean(
                "Levels between the last win and the first loss were not measured (deployctl tune narrows it down)."
            ),
            "wins_after_loss": array(
                integer(),
                description="Levels past the first loss where speculation wins again: a threshold cannot use them.",
            ),
            "speculative_threshold": nullable(
                "integer",
                "The speculative run's own --threshold: above it its curve is the baseline's, so those levels are not measured and the suggestion cannot exceed it.",
            ),
            "baseline_speculates": boolean(
                "The baseline run's command has --speculative-algorithm."
            ),
            "levels": array(
                obj(
                    {
                        "concurrency": integer(),
                        "baseline_tokens_per_s": number(),
                        "speculative_tokens_per_s": number(),
                        "wins": nullable(
                            "boolean",
                            "Whether speculation beats the baseline here (a tie is no win); null: above the speculative run's own threshold, so not measured for speculation.",
                        ),
                    },
                    required=[
                        "concurrency",
                        "baseline_tokens_per_s",
                        "speculative_tokens_per_s",
                        "wins",
                    ],
                )
            ),
        },
        required=[
            "baseline",
            "speculative",
            "threshold",
            "between",
            "crossover_unresolved",
            "wins_after_loss",
            "speculative_threshold",
            "baseline_speculates",
            "levels",
        ],
        description="deployctl bench --suggest-threshold BASELINE SPEC --json",
    ),
    "benchHost": host_entry_shape("bench"),
    "benchDeployment": deployment_entry("bench"),
    "benchOutcome": obj(
        {
            **OUTCOME,
            "deployment": nullable("string"),
            "run": string(),
            "levels": array(ref("level")),
            "saved": string(),
        },
        required=["ok"],
        required_when_ok=["deployment", "run", "levels", "saved"],
    ),
    "keptSweep": obj(
        {
            "run": string(),
            "deployment": nullable("string"),
            "template": string(),
            "threshold": nullable("integer"),
            "patches": map_of(string()),
            "env": map_of(string()),
            "command": string(),
            "deployctl_version": string(),
            "by": string(),
            "at": number(),
            "params": obj(
                {
                    "tool": string(),
                    "input_len": integer(),
                    "output_len": integer(),
                    "concurrency": array(integer()),
                    "prompts": array(integer()),
                    "warmup": boolean("Each level was warmed up first (--warmup)."),
                },
                required=[],
            ),
            "levels": array(ref("level")),
        },
        required=["levels"],
        description="A sweep as kept on its host (older ones may lack keys).",
    ),
    "level": obj(
        {
            "concurrency": integer(),
            "prompts": integer(),
            "completed": integer(),
            "failed": integer(),
            "errors": array(string(), description="The first few errors."),
            "duration_s": number(),
            "output_tokens": integer(),
            "output_tokens_per_s": number(),
            "requests_per_s": number(),
            "ttft_ms": ref("spread"),
            "itl_ms": ref("spread"),
            "e2e_ms": ref("spread"),
            "warmup_s": nullable(
                "number",
                "Seconds of the warm-up run before the level at its concurrency, not counted (bench --warmup; tune's default); null: none.",
            ),
            "first_sample_tokens_per_s": nullable(
                "number",
                "The warm-up's first requests, one a stream shaped as the level's: what a cold first sample measured; null: no warm-up.",
            ),
            "first_sample_bias": nullable(
                "number",
                "first_sample_tokens_per_s ÷ output_tokens_per_s - 1 (-0.4: the cold first sample was 40 % slower); null: no warm-up.",
            ),
            "rounds_tokens_per_s": array(
                number(),
                "Each round of the streams (concurrency requests in the order they ended; at concurrency 1 one request): their per-request output tok/s summed, in order.",
            ),
            "spread": nullable(
                "number",
                "The half-width of a 95 % confidence interval of the rounds' mean (Student's t), as a fraction of it; null with fewer than 2 rounds.",
            ),
            "drift": nullable(
                "number",
                "The rounds' second half's mean less their first half's, as a fraction of their mean; null with fewer than 2 rounds.",
            ),
            "drifting": boolean(
                "|drift| > spread: the level's rounds still moved (not warm, or not steady)."
            ),
            "client_processes": integer(
                "The builtin tool's client processes the level's streams were spread over."
            ),
            "client_busy": number(
                "The busiest client process's CPU seconds ÷ its wall seconds (builtin tool): near 1, the level measured the client's limit, not the server's."
            ),
        },
        required=[
            "concurrency",
            "prompts",
            "completed",
            "failed",
            "errors",
            "duration_s",
            "output_tokens",
            "output_tokens_per_s",
            "requests_per_s",
            "ttft_ms",
            "itl_ms",
            "e2e_ms",
        ],
        description="One load level of a sweep.",
    ),
    "spread": obj({"p50": nullable("number"), "p99": nullable("number")}, required=["p50", "p99"]),
    "failure": obj(
        {"ok": {"const": False}, "error": string(), "code": string(), "hint": nullable("string")},
        required=["ok", "error", "code", "hint"],
        description="The command failed as a whole (a bad inventory, pattern or option): nothing was done on any host.",
    ),
    "fleet": obj(
        {"hosts": map_of(ref("scanHost"))}, required=["hosts"], description="deployctl crash --json"
    ),
    "local": obj(
        {"crashes": array(ref("crashReport"))},
        required=["crashes"],
        description="deployctl crash --file FILE --json",
    ),
    "scanHost": host_entry_shape("scan", also_required=["log", "crashes"]),
    "scanDeployment": deployment_entry("scan"),
    "scanOutcome": obj(
        {
            **OUTCOME,
            "log": nullable("string"),
            "size": integer(),
            "scanned_bytes": integer(),
            "crashes": array(ref("crashReport")),
        },
        required=["ok"],
        required_when_ok=["log", "size", "scanned_bytes", "crashes"],
    ),
    "crashReport": obj(
        {
            "exception": string(),
            "message": string(),
            "file": nullable("string"),
            "line": nullable("integer"),
            "function": nullable("string"),
            "ranks": array(string()),
            "signature": string(),
            "title": string(),
            "hint": string(),
            "log_line": integer(),
        },
        required=[
            "exception",
            "message",
            "file",
            "line",
            "function",
            "ranks",
            "signature",
            "title",
            "hint",
            "log_line",
        ],
        description="One distinct crash found in a log, explained by the catalog signature it matched.",
    ),
    "note": obj({"note": string()}, required=["note"], description="What --new-token did."),
    "gpus": obj({"hosts": map_of(ref("gpusHost"))}, required=["hosts"]),
    "gpusHost": host_entry_shape("gpus"),
    "gpusDeployment": deployment_entry("gpus"),
    "gpusOutcome": obj(
        {
            **OUTCOME,
            "clean": boolean(),
            "gpus": array(ref("gpu")),
            "processes": array(ref("process")),
        },
        required=["ok"],
        required_when_ok=["clean", "gpus", "processes"],
    ),
    "gpu": obj(
        {
            "index": integer(),
            "uuid": string(),
            "name": string(),
            "memory_used_mib": integer(),
            "memory_total_mib": integer(),
            "utilization_pct": nullable("integer"),
        },
        required=[
            "index",
            "uuid",
            "name",
            "memory_used_mib",
            "memory_total_mib",
            "utilization_pct",
        ],
    ),
    "process": obj(
        {
            "pid": integer(),
            "name": string(),
            "used_memory_mib": nullable("integer"),
            "gpu_uuid": string(),
            "held_by": nullable("string", "The deployctl run holding it, if one."),
        },
        required=["pid", "name", "used_memory_mib", "gpu_uuid", "held_by"],
    ),
    "inventory": obj(
        {
            "hosts": map_of(
                obj(
                    {
                        "address": string(),
                        "port": nullable("integer", "The SSH port; null for a local host."),
                        "user": nullable("string"),
                        "connection": string(),
                        "vars": obj({}, description="The host's merged variables."),
                    },
                    required=["address", "port", "user", "connection", "vars"],
                )
            )
        },
        required=["hosts"],
        description="deployctl hosts --json",
    ),
    "graph": obj(
        {
            "groups": map_of(
                obj(
                    {"children": array(string()), "hosts": array(string())},
                    required=["children", "hosts"],
                    description="A group's child groups and its own hosts, in declaration order.",
                )
            )
        },
        required=["groups"],
        description="deployctl hosts --graph --json",
    ),
    "launch": obj(
        {
            "started": boolean(),
            "dry_run": boolean(),
            "hosts": map_of(ref("launchHost")),
            "group_failed_ended": map_of(
                array(integer()),
                description="Nodes of a failed multi-node server whose runs were ended: PIDs.",
            ),
            "registrations": array(
                ref("registration"),
                description="Ready workers added to their routers, and workers added to routers that came up.",
            ),
        },
        required=["started", "dry_run", "hosts"],
        description="A launch: every host's preflight and, once started, how its run came up.",
    ),
    "launchHost": host_entry_shape("launch"),
    "launchDeployment": deployment_entry("launch"),
    "launchOutcome": obj(
        {
            **OUTCOME,
            "preflight": ref("preflight"),
            "run": string(),
            "log": string(),
            "pid": integer(),
            "state": string("ready, crashed, died, timeout, started or aborted."),
            "ready": boolean(),
            "elapsed_s": number(),
            "crashes": array(ref("crashReport")),
            "warnings": array(ref("crashReport")),
            "command": string(),
            "env": map_of(string()),
            "note": string(),
            "connection_losses": array(string()),
            "job": ref("job"),
            "stopped": ref(
                "stopOutcome",
                "launch --replace: its live run, stopped first; a stop that failed kept it from"
                " starting (then no preflight).",
            ),
        },
        required=["ok"],
        dependentRequired={
            "state": [
                "run",
                "log",
                "pid",
                "ready",
                "elapsed_s",
                "crashes",
                "warnings",
                "command",
                "env",
                "note",
                "connection_losses",
            ]
        },
        required_when_ok=["preflight"],
    ),
    "preflight": obj(
        {
            "ready": boolean(),
            "problems": array(string()),
            "warnings": array(string()),
            "flags": {"oneOf": [ref("flags"), {"type": "null"}]},
            "command": string(),
            "env": map_of(string()),
            "log": string(),
        },
        required=["ready", "problems", "warnings", "flags", "command", "env", "log"],
        description="The host's answer to 'may we start here?'.",
    ),
    "flags": obj(
        {
            "method": string("How the command was checked: declarations, parser, or why not."),
            "note": string(),
            "options": integer(),
            "seconds": number(),
            "problems": array(string()),
            "warnings": array(string()),
        },
        required=["method", "note", "options", "seconds", "problems", "warnings"],
        description="What the host's SGLang says of the command's flags.",
    ),
    "registration": obj(
        {
            "worker": string(),
            "router": string(),
            "url": string(),
            "action": {"enum": ["add", "remove"]},
            "ok": boolean(),
            "error": string(),
        },
        required=["worker", "router", "url", "action", "ok", "error"],
        description="A worker added to its router or removed from it; `error` says why not.",
    ),
    "eventLogLine": event(
        "log_line",
        {
            "line": string(),
            "crash": boolean(),
        },
        required=["line", "crash"],
        description="One whole line of a log; `crash`: it belongs to a crash trace.",
    ),
    "eventCrash": event(
        "crash",
        {
            "report": ref("crashReport"),
        },
        required=["report"],
        description="A crash completed by the log lines just sent.",
    ),
    "eventHostFailed": event(
        "host_failed",
        {
            "error": string(),
            "code": string(),
            "hint": nullable("string"),
        },
        required=["error", "code", "hint"],
        description="A host could not be read or followed; `exception` keeps a bug's traceback.",
    ),
    "eventConnectionLost": event(
        "connection_lost",
        {
            "elapsed": number(),
            "error": string(),
        },
        required=["elapsed", "error"],
        description="The connection to a host dropped while it was waited for or followed; retrying.",
    ),
    "eventReconnected": event(
        "reconnected",
        {
            "elapsed": number(),
        },
        required=["elapsed"],
        description="A lost connection is back.",
    ),
    "patchActions": obj({"hosts": map_of(ref("patchesHost"))}, required=["hosts"]),
    "patchesHost": host_entry_shape("patches"),
    "patchesDeployment": deployment_entry("patches"),
    "patchesOutcome": obj(
        {**OUTCOME, "patches": array(ref("action"))}, required=["ok"], required_when_ok=["patches"]
    ),
    "action": obj(
        {
            "set": string(),
            "version": string(),
            "action": string(
                "applied, replaced <old version>, adopted (the files had it: recorded, no file changed), unchanged, would apply, would adopt, reverted or not applied."
            ),
            "files": array(string()),
            "detail": string(
                "How: a partly applied set completed, what an adopted set's backup holds, a set taken out by its reverse diff; empty when nothing is to be said."
            ),
        },
        required=["set", "version", "action", "files", "detail"],
    ),
    "rollout": obj(
        {
            "ok": boolean(),
            "dry_run": boolean(),
            "interrupted": boolean(
                "Ctrl-C: the units in hand finished (or went back), no other was started."
            ),
            "units": array(ref("rolloutUnit")),
        },
        required=["ok", "dry_run", "interrupted", "units"],
    ),
    "canary": obj(
        {
            **CANARY_FIELDS,
            "ok": boolean(
                "A clear verdict acted on: promoted, or kept (no regression with --no-promote, or inconclusive); false for a rollback, a failed canary (a split that did not serve, a router that stopped answering, nothing to compare) or Ctrl-C."
            ),
            "dry_run": boolean(),
            "already_current": array(
                string(),
                "Replicas that already run the inventory's configuration: neither canary nor control.",
            ),
            "not_judged": map_of(
                string(),
                "Replicas that differ but that a canary cannot judge (a prefill records no time to first token or inter-token latency; a replica whose role changes has no like to compare with) -> why: neither canary nor control, and left as they run by a promotion.",
            ),
            "units": array(
                ref("rolloutUnit"),
                "The canaries' and the control's plans, and what was last done with each (split, then the promotion or rollback; `steps` keeps every one).",
            ),
            "keep_error": nullable(
                "string", "Why the record could not be kept on the router's host (null: kept)."
            ),
        },
        required=[
            *CANARY_FIELDS,
            "ok",
            "dry_run",
            "already_current",
            "not_judged",
            "units",
            "keep_error",
        ],
    ),
    "tuneLive": obj(
        {
            "ok": boolean(
                "The window ended with the threshold rolled out (promoted) or reported, and every action after it worked; false when it failed (a replica that did not serve, a router that stopped answering) or on Ctrl-C."
            ),
            "interrupted": boolean("Ctrl-C: both replicas were put back."),
            "router": string(),
            "speculative": nullable(
                "string",
                "The replica relaunched with speculation always on; null: --race-threshold (no crossover window).",
            ),
            "plain": nullable("string", "The replica relaunched without speculation."),
            "others": array(string(), "The router's other selected replicas: left serving."),
            "decision": {"enum": ["promoted", "reported", "failed", "interrupted"]},
            "reason": string(),
            "elapsed_s": number("The windows' lengths, summed."),
            "precision": obj(
                {
                    "buckets": integer(
                        "--precision: the crossover's bracket, in CUDA-graph buckets, that ends the window (0: it runs whole)."
                    ),
                    "reached": boolean(
                        "The window ended early, its bracket that narrow; its intervals are then the always-valid ones it stopped on."
                    ),
                },
                required=["buckets", "reached"],
            ),
            "samples": obj(
                {"speculative": integer(), "plain": integer()},
                required=["speculative", "plain"],
                description="Intervals read from each replica that carried a sample.",
            ),
            "buckets": array(
                obj(
                    {
                        "bucket": integer(
                            "A CUDA-graph batch size: the samples' running requests up to it."
                        ),
                        "samples": integer(),
                        "gain": number(
                            "Speculative ÷ plain output tok/s per running request in the bucket."
                        ),
                        "low": nullable("number", "The gain's interval; null: unbounded."),
                        "high": nullable("number"),
                        "detectable": nullable(
                            "number",
                            "The interval's half-width as a fraction: the smallest gain the bucket's samples could tell from none; null: unbounded.",
                        ),
                        "verdict": {"enum": ["win", "loss", "undecided"]},
                    },
                    required=["bucket", "samples", "gain", "low", "high", "detectable", "verdict"],
                ),
                "Each load bucket both replicas served at (5 samples each, at least), ascending.",
            ),
            "crossover": {
                "anyOf": [
                    obj(
                        {
                            "last_win": nullable(
                                "integer",
                                "The largest bucket where speculation is better beyond its interval, below the first loss.",
                            ),
                            "first_loss": nullable(
                                "integer",
                                "The smallest bucket where it is worse beyond its interval.",
                            ),
                            "threshold": nullable(
                                "integer", "T: last_win when both exist; null otherwise."
                            ),
                            "speculation": {"enum": ["threshold", "never", "always", "undecided"]},
                            "reached": integer(
                                "The largest bucket both replicas served at: nothing is said above it."
                            ),
                            "sizes": array(
                                integer(),
                                "The buckets there are: the replicas' decode CUDA-graph batch sizes (past the largest, 16 wide).",
                            ),
                        },
                        required=[
                            "last_win",
                            "first_loss",
                            "threshold",
                            "speculation",
                            "reached",
                            "sizes",
                        ],
                    ),
                    {"type": "null"},
                ]
            },
            "threshold": nullable(
                "integer", "T: the crossover's, or --race-threshold; null: none decided."
            ),
            "inventory_threshold": nullable(
                "integer",
                "The replicas' `threshold` in the inventory (what tune wrote from a synthetic bench); null: none set.",
            ),
            "inventory_verdict": {
                "anyOf": [{"enum": ["agrees", "too high", "too low"]}, {"type": "null"}],
                "description": "That threshold on this traffic: too high (it speculates at a bucket speculation lost), too low (it stops below a bucket speculation won); null: none set, or nothing decided.",
            },
            "race": {"anyOf": [ref("policyRace"), {"type": "null"}]},
            "kept": {
                "anyOf": [POLICY, {"type": "null"}],
                "description": "The policy that serves after (promoted), or would (reported); null: the replicas are back as they were.",
            },
            "units": array(ref("rolloutUnit"), "The two replicas' relaunch for the window."),
            "actions": array(
                {"type": "object"},
                "After the windows: the kept policy's rollout, or every replica touched put back.",
            ),
            "window": nullable(
                "integer",
                "The crossover window's number on the router's host (tune --live --report N, --resume N); null: not kept.",
            ),
            "keep_error": nullable("string", "Why the window's record could not be kept."),
        },
        required=[
            "ok",
            "interrupted",
            "router",
            "speculative",
            "plain",
            "others",
            "decision",
            "reason",
            "elapsed_s",
            "precision",
            "samples",
            "buckets",
            "crossover",
            "threshold",
            "inventory_threshold",
            "inventory_verdict",
            "race",
            "kept",
            "units",
            "actions",
            "window",
            "keep_error",
        ],
        description="tune --live: the window's per-bucket comparison, the live crossover, the policies raced and what followed.",
    ),
    "policyRace": obj(
        {
            "policies": array(POLICY, "In race order, one replica each."),
            "replicas": array(string(), "The replica each policy served on, in that order."),
            "buckets": array(
                obj(
                    {
                        "bucket": integer("A CUDA-graph batch size."),
                        "samples": {
                            "type": "object",
                            "additionalProperties": integer(),
                            "description": "Policy -> its samples in the bucket.",
                        },
                        "values": {
                            "type": "object",
                            "additionalProperties": number(),
                            "description": "Policy -> output tok/s per running request (geometric mean).",
                        },
                        "winner": nullable(
                            "string",
                            "null: a policy has too few samples here to compare (under 5).",
                        ),
                        "decided": boolean(
                            "The winner is better than every other policy beyond their interval."
                        ),
                    },
                    required=["bucket", "samples", "values", "winner", "decided"],
                ),
                "Each load bucket a policy served at, ascending.",
            ),
            "winner": nullable(
                "string", "The best policy weighted by the traffic's share of each bucket."
            ),
            "decided": boolean("Its lead over every other policy is beyond the interval."),
            "versus": {
                "type": "object",
                "additionalProperties": obj(
                    {"gain": number(), "low": nullable("number"), "high": nullable("number")},
                    required=["gain", "low", "high"],
                ),
                "description": "Each other policy -> the winner's traffic-weighted gain over it and its interval.",
            },
            "shares": {
                "type": "object",
                "additionalProperties": number(),
                "description": "Bucket -> its share of the traffic (the buckets every policy served at).",
            },
        },
        required=["policies", "replicas", "buckets", "winner", "decided", "versus", "shares"],
        description="tune --live --policies: the policies raced on one replica each.",
    ),
    **kept_report("live", "liveRecord", "tune --live", "window", "live windows"),
    "liveRecord": obj(
        {
            "window": nullable("integer", "Its number on the router's host (tune-live/N.json)."),
            "router": string(),
            "state": {"enum": ["running", "done"]},
            "started_at": number(),
            "updated_at": number(),
            "speculative": string(),
            "plain": string(),
            "confidence": number(),
            "resumed": array(integer(), "The windows whose samples it started from, oldest first."),
            "sizes": array(
                integer(),
                "The decode CUDA-graph batch sizes its samples are bucketed by (the speculative replica's; absent in a record kept before windows said theirs).",
            ),
            "samples": obj(
                {"speculative": integer(), "plain": integer()},
                required=["speculative", "plain"],
                description="Samples kept of each replica (the record holds them; the report counts them).",
            ),
            "decision": nullable("string", "null while running."),
            "threshold": nullable("integer", "The crossover's T when the window ended."),
            "elapsed_s": number("Its sampling, and the resumed windows'."),
            "end_look": obj(
                {
                    "always_valid": boolean(
                        "Its end took the always-valid intervals (a window that looked every round, or a resumed one)."
                    ),
                    "error_share": number("The share of the error rate its end look spent."),
                },
                required=["always_valid", "error_share"],
                description="How a window that ended judged its buckets (absent while running, and in records kept before windows said it).",
            ),
            "buckets": array(
                {"type": "object"},
                "Each bucket judged from the samples, as tune --live's buckets: for a window that ended, as its end look judged them (the same look again); for a running one, with always-valid intervals (a report is one look more).",
            ),
            "crossover": {"type": "object", "description": "As tune --live's crossover."},
        },
        required=[
            "window",
            "router",
            "state",
            "started_at",
            "updated_at",
            "speculative",
            "plain",
            "confidence",
            "resumed",
            "samples",
            "decision",
            "threshold",
            "elapsed_s",
            "buckets",
            "crossover",
        ],
        description="One live window of one router, as kept on the router's host and judged again.",
    ),
    "canaryRecord": declared(
        CanaryRecord,
        CANARY_FIELDS,
        "One canary of one router, as kept on the router's host (canaries/N.json).",
    ),
    **kept_report("canary", "canaryRecord", "canary", "canary", "canaries"),
    "rolloutUnit": obj(
        {
            "unit": string(),
            "changes": boolean(),
            "reasons": array(string()),
            "command_diff": array(
                string(),
                description="`- word`/`+ word`: the command's words that change (secrets masked).",
            ),
            "env_diff": array(string()),
            "patches": map_of(array(string())),
            "router": nullable("string"),
            "outcome": {
                "enum": ["skipped", "replaced", "failed", "refused", "undone", "not reached"]
            },
            "ok": boolean(),
            "old_run": nullable("string"),
            "new_run": nullable("string"),
            "state": nullable("string"),
            "error": string(),
            "crash": {"anyOf": [ref("crashReport"), {"type": "null"}]},
            "warnings": array(string()),
            "drained": nullable("boolean"),
            "drain_signal": {
                "enum": ["metrics", "router load", "timeout", None],
                "description": "What the drain watched to know the worker was idle: its own num_running_reqs (metrics), the router's load for it (router load), or neither, so the whole --drain-timeout was waited (timeout); null: not drained (no router, or not serving).",
            },
            "timings_s": map_of(
                number(),
                description="Seconds per step: remove, drain, stop, patches, launch, server_start (the server's own wait), total.",
            ),
            "overhead_s": nullable(
                "number", "deployctl's own time: total less the drain and the server's start."
            ),
            "patches_done": array(
                obj(
                    {"set": string(), "version": string(), "action": string()},
                    required=["set", "version", "action"],
                )
            ),
            "gpus_clean": nullable(
                "boolean",
                "The unit's GPUs were clean after its stop, before its start (null: not checked, e.g. a router).",
            ),
            "blocked": string(
                "Why the unit cannot be replaced (its router is not in the inventory, its run could not be read); empty when it can."
            ),
            "job": ref("job"),
        },
        required=[
            "unit",
            "changes",
            "reasons",
            "command_diff",
            "env_diff",
            "patches",
            "router",
            "blocked",
        ],
        description="One unit: a deployment, or a multi-node server as `NAME (node, node…)`. Outcome keys (those `outcome` requires) are present unless --dry-run.",
        dependentRequired={
            "outcome": [
                "ok",
                "old_run",
                "new_run",
                "state",
                "error",
                "crash",
                "warnings",
                "drained",
                "drain_signal",
                "gpus_clean",
                "timings_s",
                "overhead_s",
                "patches_done",
            ]
        },
    ),
    "audit": obj({"hosts": map_of(ref("auditHost"))}, required=["hosts"]),
    "auditHost": host_entry_shape("audit"),
    "auditDeployment": deployment_entry("audit"),
    "auditOutcome": obj(
        {**OUTCOME, "sglang_version": nullable("string"), "patches": map_of(ref("setState"))},
        required=["ok"],
        required_when_ok=["sglang_version", "patches"],
    ),
    "setState": obj(
        {
            "state": {
                "enum": [
                    "applied",
                    "partly applied",
                    "missing",
                    "outdated",
                    "drifted",
                    "unsupported",
                ],
                "description": "What the installation's files are, told by each file's shipped hashes, else hunk by hunk; the record of this state_dir second. applied: every hunk is in the files (detail `no record here` when this state_dir has no record of it); partly applied: some are (detail names the files that lack it); missing: none is; outdated: recorded here as an older version (or other content), the files as that apply left them; drifted: a file has, for some hunk, neither its lines nor those it expects (detail names it), or SGLang was reinstalled since apply; unsupported: no variant for this SGLang.",
            },
            "version": nullable(
                "string", "The version the files carry (applied), else the one recorded here."
            ),
            "expected_version": string(),
            "detail": string(),
            "recorded": boolean("This state_dir has a record of the set on this installation."),
            "files": map_of(
                {"enum": ["applied", "partly applied", "missing", "differs"]},
                "Each file of the set's variant for this SGLang: applied, partly applied (some hunks), missing, or differs (a hunk whose lines are neither the set's nor the release's).",
            ),
        },
        required=["state", "version", "expected_version", "detail", "recorded", "files"],
    ),
    "patchList": obj(
        {
            "patches": array(
                obj(
                    {
                        "name": string(),
                        "version": string(),
                        "hash": string(),
                        "sglang_versions": array(string()),
                        "description": string(),
                        "requires": array(string()),
                        "flags": array(string()),
                    },
                    required=[
                        "name",
                        "version",
                        "hash",
                        "sglang_versions",
                        "description",
                        "requires",
                        "flags",
                    ],
                )
            )
        },
        required=["patches"],
    ),
    "port": obj(
        {
            "set": string(),
            "from_version": string(),
            "to_version": string(),
            "source": string(),
            "out": string(),
            "ok": boolean(),
            "hunks": array(
                obj(
                    {
                        "diff": string(),
                        "file": string(),
                        "hunk": integer(),
                        "outcome": string("exact, offset, fuzz or failed."),
                        "detail": string(),
                    },
                    required=["diff", "file", "hunk", "outcome", "detail"],
                )
            ),
            "verify": map_of(
                string(), description="Verify script → passed, failed: … or not run: …."
            ),
        },
        required=["set", "from_version", "to_version", "source", "out", "ok", "hunks", "verify"],
    ),
    "rendered": obj(
        {"hosts": map_of(ref("renderedHost"))},
        required=["hosts"],
        description="deployctl render --json",
    ),
    "checked": obj(
        {"hosts": map_of(ref("checkedHost"))},
        required=["hosts"],
        description="deployctl render --check --json",
    ),
    "renderedHost": host_entry_shape("rendered"),
    "renderedDeployment": deployment_entry("rendered"),
    "renderedOutcome": obj(
        {
            **OUTCOME,
            "command": string(),
            "env": map_of(string()),
            "threshold_mode": nullable("string", "patch or adaptive; null: no threshold."),
            "files": map_of(
                string(), description="Files launch writes on the host first: path → text."
            ),
            "batch_script": nullable(
                "string",
                "A Slurm job's batch script as sbatch is given it, secrets masked (launcher: slurm); null otherwise",
            ),
        },
        required=["ok"],
        required_when_ok=["command", "env", "threshold_mode", "files"],
    ),
    "checkedHost": host_entry_shape("checked"),
    "checkedDeployment": deployment_entry("checked"),
    "checkedOutcome": obj(
        {
            **OUTCOME,
            "command": string(),
            "env": map_of(string()),
            "threshold_mode": nullable("string", "patch or adaptive; null: no threshold."),
            "files": map_of(
                string(), description="Files launch writes on the host first: path → text."
            ),
            "flags": ref("flags"),
            "batch_script": nullable(
                "string",
                "A Slurm job's batch script as sbatch is given it, secrets masked (launcher: slurm); null otherwise",
            ),
        },
        required=["ok"],
        required_when_ok=["command", "env", "threshold_mode", "files", "flags"],
    ),
    "nothingRestarted": obj(
        {"restarted": array(string()), "hosts": map_of(ref("statusHost"))},
        required=["restarted", "hosts"],
        description="No run needed a restart.",
    ),
    "statusHost": host_entry_shape("status"),
    "statusDeployment": deployment_entry("status"),
    "statusOutcome": obj(
        {
            **OUTCOME,
            "run": nullable("string"),
            "pid": nullable("integer"),
            **RUN_LOOK,
        },
        required=["ok"],
        dependentRequired={"metrics": ["metrics_note"], "metrics_note": ["metrics"]},
        required_when_ok=[
            "run",
            "pid",
            "alive",
            "ready",
            "crashed",
            "status",
            "uptime_s",
            "log",
            "gpus",
            "last_line",
            "crash",
            "warning",
            "gpu_memory_used_mib",
        ],
    ),
    "runStatus": obj(
        {
            "run": nullable("string"),
            "pid": nullable("integer"),
            "state": nullable(
                "string",
                "The run's state as this look saw it (ready, starting, crashed, stopped, …); null without a run.",
            ),
            **RUN_LOOK,
        },
        dependentRequired={"metrics": ["metrics_note"], "metrics_note": ["metrics"]},
    ),
    # The keys the metrics module reads from SGLang: a metric added there changes the schema.
    "metrics": obj(
        {
            **{gauge: nullable("number") for gauge in [*GAUGES, *COUNTERS]},
            **{histogram: ref("histogram") for histogram in HISTOGRAMS},
        },
        required=[*GAUGES, *COUNTERS, *HISTOGRAMS],
        description="SGLang's metrics keyed by their names without `sglang:`: gauges and counters (null when not exported) and histograms in seconds.",
    ),
    "histogram": obj(
        {"p50": nullable("number"), "p99": nullable("number"), "count": integer()},
        required=["p50", "p99", "count"],
    ),
    "router": obj(
        {
            "router": string(),
            "api": {
                "enum": ["workers", "legacy", None],
                "description": "`workers` (0.3 and later), `legacy` (up to 0.2.1), null: no router answered.",
            },
            "error": string(),
            "workers": array(
                obj(
                    {
                        "url": string(),
                        "healthy": nullable("boolean"),
                        "load": nullable("integer"),
                        "deployment": nullable("string", "Which worker of ours it is; null: none."),
                        "role": {
                            "enum": ["prefill", "decode", "regular", None],
                            "description": "As the router lists it: a prefill or decode of a router in PD mode, `regular` for a whole-request worker; null: the router does not say (legacy API).",
                        },
                        "bootstrap_port": nullable(
                            "integer", "A prefill's bootstrap port as the router lists it."
                        ),
                    },
                    required=["url", "healthy", "load", "deployment", "role", "bootstrap_port"],
                )
            ),
            "unregistered": map_of(string()),
            "stray": array(string()),
            "unknown": map_of(string()),
            "unread": map_of(string()),
            "not_ours": array(string()),
            "miscast": map_of(
                string(),
                "URL → the worker of ours serving there as another role (or bootstrap port) than the router lists: drift, which `router sync` mends.",
            ),
            "drift": boolean(),
            "pd": boolean("The router routes prefill/decode pairs (`pd: true`)."),
            "missing_roles": array(
                {"enum": ["prefill", "decode"]},
                "A router in PD mode serves only with a healthy prefill and a healthy decode listed: the roles it has none of.",
            ),
        },
        required=[
            "router",
            "api",
            "error",
            "workers",
            "unregistered",
            "stray",
            "unknown",
            "unread",
            "not_ours",
            "miscast",
            "drift",
            "pd",
            "missing_roles",
        ],
        description="A live router's worker list, and its drift from the inventory: `unregistered` (worker → URL) serve but are not listed; `stray` URLs are listed where a worker of ours is known not to serve; `miscast` are listed in another role than they serve. Not drift, and removed by `router sync` only with --force: `unknown` (URL → worker) are listed where a worker of ours may serve but its host cannot be read (`unread`: worker → why); `not_ours` URLs are listed where no worker of the inventory is.",
    ),
    "sync": obj({"hosts": map_of(ref("syncHost"))}, required=["hosts"]),
    "syncHost": host_entry_shape("sync"),
    "syncDeployment": deployment_entry("sync"),
    "syncOutcome": obj(
        {
            **OUTCOME,
            "dry_run": boolean(),
            "force": boolean(
                "--force: URLs whose owner cannot be read, and URLs no worker of the inventory has, are removed too."
            ),
            "before": ref("router"),
            "changes": array(ref("registration")),
            "kept": array(
                string(),
                description="Listed URLs left in the router, unknown or not ours (see `before`); --force removes them.",
            ),
        },
        required=["ok"],
        required_when_ok=["dry_run", "force", "before", "changes", "kept"],
    ),
    "status": obj(
        {
            "hosts": map_of(ref("statusHost")),
            "deployments": map_of(
                ref("multiNodeUnit"), description="Multi-node servers as a whole, by deployment."
            ),
        },
        required=["hosts"],
        description="Each deployment's current run.",
    ),
    "multiNodeUnit": obj(
        {
            "state": string(
                "The server as a whole: ready, starting, stopped, degraded (a node other than rank 0 down) or crashed (rank 0 down)."
            ),
            "ok": boolean(),
            "nnodes": integer(minimum=2),
            "nodes": array(
                obj(
                    {
                        "host": string(),
                        "node_rank": integer(),
                        "ok": boolean(),
                        "error": nullable("string"),
                    },
                    required=["host", "node_rank", "ok", "error"],
                    allOf=[ref("runStatus")],
                )
            ),
            "down": array(
                string(),
                description="The nodes that crashed, died or could not be read while meant to run.",
            ),
        },
        required=["state", "ok", "nnodes", "nodes", "down"],
        description="A multi-node server as a whole, its nodes in rank order.",
    ),
    "stop": obj({"hosts": map_of(ref("stopHost"))}, required=["hosts"]),
    "stopHost": host_entry_shape("stop"),
    "stopDeployment": deployment_entry("stop"),
    "stopOutcome": obj(
        {
            **OUTCOME,
            "run": nullable("string"),
            "ended": array(integer()),
            "killed": array(integer()),
            "gpus_clean": nullable("boolean"),
            "note": string(),
            "shutdown": {
                "enum": ["drained", "cut", None],
                "description": "How the run ended: drained (by itself within the timeout "
                "after SIGTERM to its main process, or, a node > 0 of a multi-node server, "
                "to its rank 0's: what it ran finished), cut (still running at the "
                "timeout: its whole group was signalled, what it ran was cut); null: "
                "nothing of it was running.",
            },
            "shutdown_s": nullable(
                "number",
                "Seconds from the first signal until nothing of the run was left; null: "
                "nothing of it was running.",
            ),
            "router": {
                "$ref": "#/$defs/registration",
                "description": "Its removal from its router before the stop.",
            },
            "job": ref("job"),
        },
        required=["ok"],
        required_when_ok=["run", "ended", "killed", "gpus_clean", "note", "shutdown", "shutdown_s"],
    ),
    "tuned": obj(
        {
            "hosts": map_of(ref("tuneHost")),
            "interrupted": boolean(
                "Ctrl-C ended the tune; each deployment's previous run was put back."
            ),
        },
        required=["hosts"],
        description="deployctl tune --json",
    ),
    "planned": obj(
        {"hosts": map_of(ref("planHost"))},
        required=["hosts"],
        description="deployctl tune --dry-run --json",
    ),
    "reported": obj(
        {"hosts": map_of(ref("keptHost"))},
        required=["hosts"],
        description="deployctl tune --report --json",
    ),
    "tuneHost": tune_host_entry("tuneOutcome", "tune"),
    "tuneOutcome": obj(
        TUNE_OUTCOME,
        required=["ok", "error", "code"],
        anyOf=[
            {"properties": {"ok": {"const": False}}, "required": ["error", "code"]},
            {"required": ["outcome", "phases"]},
        ],
        allOf=[{"anyOf": [{"properties": {"ok": {"const": False}}}, ref("record")]}],
    ),
    "planHost": tune_host_entry("planOutcome", "plan"),
    "planOutcome": obj(
        TUNE_OUTCOME,
        required=["ok", "error", "code"],
        anyOf=[
            {"properties": {"ok": {"const": False}}, "required": ["error", "code"]},
            {"required": ["phases"]},
        ],
        allOf=[{"anyOf": [{"properties": {"ok": {"const": False}}}, ref("plan")]}],
    ),
    "keptHost": tune_host_entry("keptOutcome", "kept tune"),
    "keptOutcome": obj(
        TUNE_OUTCOME,
        required=["ok", "error", "code"],
        anyOf=[
            {
                "properties": {"ok": {"const": False}, "error": string(), "code": string()},
                "required": ["error", "code"],
            },
            {
                "properties": {"ok": {"const": True}, "record": ref("record")},
                "required": ["record"],
            },
        ],
        allOf=[{"anyOf": [{"properties": {"ok": {"const": False}}}, ref("kept")]}],
    ),
    "record": declared(
        TuneRecord,
        {
            "host": string(),
            "deployment": nullable("string"),
            "tune": nullable("integer"),
            "outcome": {"enum": ["tuned", "crashed", "failed", "interrupted"]},
            "outcome_note": string(),
            "threshold": nullable(
                "integer",
                "T: speculation on while the batch is at most T; null when it never wins or wins at every level (see speculation).",
            ),
            "threshold_mode": {"enum": ["patch", "adaptive"]},
            "speculation": {"enum": ["never", "always", "up_to", ""]},
            "crossover": {
                **declared(
                    Crossover,
                    {"last_win": nullable("integer"), "first_loss": nullable("integer")},
                ),
                "type": ["object", "null"],
            },
            "phases": obj(
                {"baseline": ref("phase"), "speculative": ref("phase"), "tuned": ref("phase")},
                additionalProperties=False,
            ),
            "refined_levels": array(integer()),
            "wins_again": array(integer()),
            "verdicts": map_of(
                declared(
                    Verdict,
                    {
                        "verdict": {"enum": ["win", "loss", "tie"]},
                        "baseline": number(),
                        "speculative": number(),
                        "spread": map_of(number()),
                        "samples": map_of(integer()),
                        "level_spread": map_of(
                            nullable("number"),
                            description="Phase → the spread of all its rounds at this level (per_level's).",
                        ),
                        "within_spread": boolean(
                            "The two phases' spreads together (in quadrature) exceed |speculative ÷ baseline - 1|: the samples do not decide this level (measured up to --repeats times, then judged by the medians)."
                        ),
                    },
                )
            ),
            "envelope_ratio": map_of(
                number(),
                description="Concurrency → tuned tok/s ÷ the better of baseline and speculative.",
            ),
            "min_ratio": number(),
            "held": boolean(),
            "capacity": nullable("integer"),
            "serving": nullable("string"),
            "serving_known": boolean(
                "false: the host did not answer when tune last asked, so `serving` is not known (records before this key: true)."
            ),
            "previous": nullable("string"),
            "crash": nullable("object"),
            "patches": array(string()),
            "params": obj({}),
            "started_at": number(),
            "wall_s": number(),
            "launches": integer(),
            "levels_measured": integer(),
            "narrowed": nullable(
                "boolean",
                "The crossover's bracket ends are adjacent levels (false: --max-launches stopped the search first).",
            ),
        },
    ),
    "phase": declared(
        PhaseRecord,
        {
            "run": nullable("string"),
            "template": string(),
            "threshold": nullable("integer"),
            "state": string(),
            "levels": array(
                ref("level"),
                description="One per concurrency, as bench --json has them: the median sample of a level measured more than once.",
            ),
            "samples": map_of(
                array(number()),
                description="Concurrency → every output tok/s measured there, in order.",
            ),
            "sweeps": array(
                string(), description="The kept bench files of this phase on the host."
            ),
            "runs": array(
                string(),
                description="The phase's runs, one per visit of its server (the search comes back to it).",
            ),
            "per_level": map_of(
                declared(
                    LevelFigures,
                    {
                        "warmup_s": nullable(
                            "number",
                            "The warm-ups at this level on the phase's servers, in seconds; null: none.",
                        ),
                        "first_sample_bias": nullable(
                            "number",
                            "The first warm-up's sample ÷ the level's median - 1; null: no warm-up.",
                        ),
                        "spread": nullable(
                            "number",
                            "Of all the rounds of the level's samples, as in a level's spread.",
                        ),
                        "drift": nullable("number", "Of all those rounds, as in a level's drift."),
                        "drifting": boolean("|drift| > spread."),
                        "rounds": integer(),
                    },
                ),
                description="Concurrency → how warm and how steady this phase measured it.",
            ),
        },
    ),
    "plan": obj(
        {
            "deployment": nullable("string"),
            "phases": map_of(
                obj({"template": string(), "command": string()}, required=["template", "command"])
            ),
            "params": obj({}),
            "launches": integer(),
            "levels": integer(),
            "estimated_s": number(),
            "assumed": obj({}),
        },
        required=["phases", "launches", "levels", "estimated_s"],
    ),
    "kept": obj(
        {
            "record": {"anyOf": [ref("record"), {"type": "null"}]},
            "numbers": array(integer()),
            "unreadable": array(string()),
        },
        required=["record", "numbers", "unreadable"],
    ),
    "eventRestarting": event(
        "restarting",
        {
            "run": string(),
            "signature": string(),
            "attempt": integer(),
            "down": array(string()),
        },
        required=["run", "signature", "attempt", "down"],
        description="A run crashed (on `down`, for a multi-node server) and is being replaced.",
    ),
    "eventCrashLoop": event(
        "crash_loop",
        {
            "run": string(),
            "signature": string(),
            "repeated": boolean(),
            "crashes": integer(),
            "window_s": number(),
        },
        required=["run", "signature", "repeated", "crashes", "window_s"],
        description="A run crashed too often (or the same way twice): it is left down.",
    ),
    "eventDecodeHeld": event(
        "decode_held",
        {
            "run": string(),
            "prefill": string("The prefill of its router seen down."),
            "down_s": number("How long ago it was seen down."),
            "window_s": number(),
        },
        required=["run", "prefill", "down_s", "window_s"],
        description="A decode fails its health check but is not restarted: a prefill of its router was down within the window (a decode's health fails while its prefill is gone, sglang#12779).",
    ),
    "eventStuckTransfer": event(
        "stuck_transfer",
        {"run": string(), "waiting": integer(), "stuck_s": number()},
        required=["run", "waiting", "stuck_s"],
        description="A decode has requests waiting for their KV and has sent no token for `stuck_s` seconds.",
    ),
    "eventStopFailed": event(
        "stop_failed",
        {
            "error": string(),
            "code": string(),
            "hint": nullable("string"),
        },
        required=["error", "code", "hint"],
        description="A run to be replaced could not be stopped; it is not relaunched.",
    ),
    "eventReplaced": event(
        "replaced",
        {
            "old_run": string(),
            "new_run": nullable("string"),
            "state": string(),
        },
        required=["old_run", "new_run", "state"],
        description="A run was replaced by `new_run` (None: its launch was refused), now in `state`.",
    ),
    "eventWatching": event(
        "watching",
        {
            "deployments": integer("Deployments (a multi-node group counts once) found."),
            "hosts": integer(),
            "unreadable": integer("Hosts that could not be read (each also has its own event)."),
            "interval_s": number(),
        },
        required=["deployments", "hosts", "unreadable", "interval_s"],
        description="Supervision began: its first look is done. Once, before that look's own events.",
    ),
    "eventWatchStopped": event(
        "watch_stopped",
        {
            "gave_up": boolean(),
        },
        required=["gave_up"],
        description="Supervision ended: told to (Ctrl-C; the servers keep running), or because it gave up",
    ),
    "eventRouterChanged": event(
        "router_changed",
        {
            "router": string(),
            "url": string(),
            "added": boolean(),
            "error": string(),
        },
        required=["router", "url", "added", "error"],
        description="A worker was added to its router (`added`) or removed from it; `error` says why not (empty when done).",
    ),
    "eventTimeLimitNear": event(
        "time_limit_near",
        {
            "run": string(),
            "job": string(),
            "time_left_s": number(),
            "renewing": boolean(),
        },
        required=["run", "job", "time_left_s", "renewing"],
        description="A Slurm job is within --renew-before of its time limit: `renewing` its successor now (it has a router), or not (no router: down from the limit until its successor serves).",
    ),
    "eventRenewed": event(
        "renewed",
        {
            "old_run": string(),
            "new_run": nullable("string"),
            "state": string(),
            "error": string(),
        },
        required=["old_run", "new_run", "state", "error"],
        description="A Slurm job's successor `new_run` (null: refused) is in `state`; with `error` empty it serves in the router, and the old job was taken out and cancelled.",
    ),
}

COMMANDS: dict[str, Schema] = {
    "bench": command(
        "deployctl bench --json",
        "Each deployment's sweep (kept on its host); with --compare, kept sweeps side by side; with --suggest-threshold, the --threshold a baseline and a speculative run give.",
        ref("sweep"),
        ref("comparison"),
        ref("suggestion"),
    ),
    "crash": command(
        "deployctl crash --json",
        "The crashes found in each host's log (a failed host keeps `log` and `crashes`); with --file, in a local file.",
        ref("fleet"),
        ref("local"),
    ),
    "dashboard": command(
        "deployctl dashboard --json",
        "The dashboard serves until Ctrl-C and prints no document; with --new-token, a note saying where the token went. Its web API's /api/status is the `status --metrics --json` document (status.json).",
        ref("note"),
    ),
    "gpus": command(
        "deployctl gpus --json",
        "Each host's GPUs, their compute processes and whether the host is clean.",
        ref("gpus"),
    ),
    "hosts": command(
        "deployctl hosts --json",
        "The selected hosts with their connection and merged variables (secrets masked); with --graph, the group tree instead.",
        ref("inventory"),
        ref("graph"),
    ),
    "launch": command(
        "deployctl launch --json",
        "Every host's preflight and, once started, how its run came up.",
        ref("launch"),
    ),
    "logs": {
        "$schema": DRAFT,
        "title": "deployctl logs --json",
        "description": "JSON lines: one object per event (a log line, a crash it completes, a host that could not be read, a connection lost and back), each with its kind (`event`), its target and when (`at`); `logs --crash --json` without --follow is one crash-scan document, as `crash --json`'s.",
        "type": "object",
        "required": ["schema"],
        "properties": {
            "schema": ref("schemaVersion"),
            "event": string(),
            "target": string(),
            "at": number(),
        },
        "anyOf": [
            ref("eventLogLine"),
            ref("eventCrash"),
            ref("eventHostFailed"),
            ref("eventConnectionLost"),
            ref("eventReconnected"),
            ref("fleet"),
            ref("failure"),
        ],
    },
    "metrics-targets": {
        "$schema": DRAFT,
        "title": "deployctl metrics-targets",
        "description": "Prometheus file_sd entries, one per deployment that serves /metrics. Always JSON (it takes no --json) and a bare list, as Prometheus reads it: no `schema` key.",
        "type": "array",
        "items": obj(
            {
                "targets": array(string(), description="host:port of the server.", minItems=1),
                "labels": obj(
                    {
                        "host": string(),
                        "deployment": string(),
                        "group": string(),
                        "template": string(),
                    },
                    required=["host", "deployment", "group", "template"],
                ),
            },
            required=["targets", "labels"],
        ),
    },
    "patch-apply": command(
        "deployctl patch apply --json",
        "Per SGLang installation, the patch sets applied (or checked, with --dry-run).",
        ref("patchActions"),
        ref("rollout", "--rolling: the rollout document (see rollout.json)."),
    ),
    "patch-audit": command(
        "deployctl patch audit --json", "Which patch set versions each host has.", ref("audit")
    ),
    "patch-list": command(
        "deployctl patch list --json",
        "The patch sets with version, content hash and supported SGLang versions.",
        ref("patchList"),
    ),
    "patch-port": command(
        "deployctl patch port --json",
        "A set ported to another SGLang release: the candidate and each hunk's outcome.",
        ref("port"),
    ),
    "patch-revert": command(
        "deployctl patch revert --json",
        "Per SGLang installation, the patch sets reverted.",
        ref("patchActions"),
        ref("rollout", "--rolling: the rollout document (see rollout.json)."),
    ),
    "render": command(
        "deployctl render --json",
        "Per host (and deployment), the command launch will run, secrets masked; with --check, also what the host's SGLang says of its flags.",
        ref("rendered"),
        ref("checked"),
    ),
    "restart": command(
        "deployctl restart --json",
        "The launch of the runs restarted; when none was, `restarted` is empty and `hosts` holds what restart saw on each host.",
        ref("launch"),
        ref("nothingRestarted"),
        ref("rollout", "restart --rolling: the rollout document (see rollout.json)."),
    ),
    "canary": command(
        "deployctl canary --json",
        "The canaries and the control behind one router, the verdict at matched load with its per-bucket table, and the decision (promoted, rolled back, kept); with --report, a kept canary per router.",
        ref("canary"),
        ref("canaryReported"),
    ),
    "rollout": command(
        "deployctl rollout --json",
        "Each unit of the rollout in order: whether and why it changes (the plan), and, unless --dry-run, what the rollout did with it.",
        ref("rollout"),
    ),
    "router-sync": command(
        "deployctl router sync --json",
        "Each selected router's list before the sync, and what was added and removed (or, with --dry-run, would be).",
        ref("sync"),
    ),
    "status": command(
        "deployctl status --json",
        "Each host's current run: alive, ready, uptime, log, crash, GPU memory (and metrics when asked for); multi-node servers also whole, under `deployments`.",
        ref("status"),
    ),
    "stop": command(
        "deployctl stop --json",
        "Each deployment's run ended, and whether its GPUs are clean.",
        ref("stop"),
    ),
    "top": command(
        "deployctl top --json",
        "One `status --metrics` document per refresh, one per line (JSON lines); with --once, one document. Each host's current run: alive, ready, uptime, log, crash, GPU memory (and metrics when asked for); multi-node servers also whole, under `deployments`.",
        ref("status"),
    ),
    "tune": command(
        "deployctl tune --json",
        "Each deployment's tune record (as kept on its host); with --dry-run, the plan; with --report, a kept record; with --live, the live window.",
        ref("tuned"),
        ref("planned"),
        ref("reported"),
        ref("tuneLive"),
        ref("liveReported"),
    ),
    "watch": {
        "$schema": DRAFT,
        "title": "deployctl watch --json",
        "description": "JSON lines: one object per event while watch supervises, each with its kind (`event`), its target (a deployment, or a multi-node server as `group (nodes)`; empty for watch itself) and when (`at`, seconds since the epoch).",
        "type": "object",
        "required": ["schema"],
        "properties": {
            "schema": ref("schemaVersion"),
            "event": string(),
            "target": string(),
            "at": number(),
        },
        "anyOf": [
            ref("eventHostFailed"),
            ref("eventWatching"),
            ref("eventRestarting"),
            ref("eventCrashLoop"),
            ref("eventDecodeHeld"),
            ref("eventStuckTransfer"),
            ref("eventStopFailed"),
            ref("eventReplaced"),
            ref("eventWatchStopped"),
            ref("eventRouterChanged"),
            ref("eventTimeLimitNear"),
            ref("eventRenewed"),
            ref("failure"),
        ],
    },
}


def references(schema: Any) -> Iterator[str]:
    """The names of the shapes `schema` refers to, in order, at any depth."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and value.startswith("#/$defs/"):
                yield value.removeprefix("#/$defs/")
            else:
                yield from references(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from references(value)


def command_schema(command: str) -> Schema:
    """The command's schema, self-contained: every shape it uses (and they use) in `$defs`, so
    a single file validates offline."""
    body = COMMANDS[command]
    used: dict[str, Schema] = {}
    pending = list(references(body))
    while pending:
        name = pending.pop(0)
        if name not in used:
            used[name] = DEFINITIONS[name]
            pending.extend(references(used[name]))
    return {**body, "$defs": used} if used else body


def rendered(command: str) -> str:
    return json.dumps(command_schema(command), indent=2) + "\n"


def drift() -> Iterator[str]:
    """A unified diff per shipped file that is not what the source generates (or is left over
    from a command that has no schema any more)."""
    for command in COMMANDS:
        path = SCHEMAS / f"{command}.json"
        shipped = path.read_text(encoding="utf-8") if path.exists() else ""
        wanted = rendered(command)
        if shipped != wanted:
            yield "".join(
                difflib.unified_diff(
                    shipped.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    f"{path.name} (shipped)",
                    f"{path.name} (generated)",
                )
            )
    for path in sorted(SCHEMAS.glob("*.json")):
        if path.stem not in COMMANDS:
            yield f"{path.name}: no command declares it; --write removes it\n"


def write() -> None:
    for command in COMMANDS:
        (SCHEMAS / f"{command}.json").write_text(rendered(command), encoding="utf-8")
    for path in SCHEMAS.glob("*.json"):
        if path.stem not in COMMANDS:
            path.unlink()


def main(argv: Sequence[str]) -> int:
    if list(argv) == ["--write"]:
        write()
        return 0
    if list(argv) == ["--check"]:
        found = list(drift())
        if found:
            sys.stderr.write("".join(found))
            sys.stderr.write(f"The shipped schemas drifted from their source: run {REGENERATE}\n")
        return 1 if found else 0
    sys.stderr.write("usage: python -m tools.contract --write | --check\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
