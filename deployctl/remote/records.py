"""Kept benchmark results, tune records, canary records and live windows under state_dir."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, cast

from .files import fail, read_json, state_path, write_atomic
from .measures import (
    BenchResultsArgs,
    BenchResultsReply,
    BenchSaveArgs,
    BenchSaveReply,
    CanaryKeepArgs,
    CanaryKeepReply,
    CanaryRecord,
    CanaryRecordsArgs,
    CanaryRecordsReply,
    LiveKeepArgs,
    LiveRecord,
    LiveRecordsArgs,
    LiveRecordsReply,
    TuneRecord,
    TuneRecordsArgs,
    TuneRecordsReply,
    TuneSaveArgs,
    TuneSaveReply,
)
from .shapes import shape_problems


def bench_dir(state_dir: str, run: str) -> str:
    return state_path(state_dir, "runs", run + ".bench")


def keep_numbered(folder: str, document: Callable[[int], Any]) -> tuple[int, str]:
    """Write `document(number)` as the folder's next numbered JSON file, never overwriting
    one."""
    os.makedirs(folder, exist_ok=True)
    number = 1 + max((int(n[:-5]) for n in os.listdir(folder) if n[:-5].isdigit()), default=0)
    while True:
        path = os.path.join(folder, f"{number}.json")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            number += 1
    with os.fdopen(fd, "w") as handle:
        json.dump(document(number), handle)
    return number, path


def numbered_files(folder: str) -> list[tuple[int, str]]:
    """The folder's numbered JSON files, oldest first."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted((int(n[:-5]), os.path.join(folder, n)) for n in names if n[:-5].isdigit())


def cmd_bench_save(args: BenchSaveArgs) -> BenchSaveReply:
    """Keep a bench result beside its run's record as the next numbered file."""
    _, path = keep_numbered(bench_dir(args["state_dir"], args["run"]), lambda _: args["result"])
    return {"path": path}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_QUANTILES = ("p50", "p99")


def _level_shape(level: Any) -> bool:
    """A level as BenchLevel declares it: what `--compare`, `--plot` and `--json` read."""
    if not isinstance(level, dict) or not isinstance(level.get("errors"), list):
        return False
    counts = ("concurrency", "prompts", "completed", "failed", "output_tokens")
    rates = ("duration_s", "output_tokens_per_s", "requests_per_s")
    spreads = [level.get(key) for key in ("ttft_ms", "itl_ms", "e2e_ms")]
    return (
        all(_number(level.get(key)) and isinstance(level[key], int) for key in counts)
        and all(_number(level.get(key)) for key in rates)
        and all(
            isinstance(s, dict)
            and all(q in s and (s[q] is None or _number(s[q])) for q in _QUANTILES)
            for s in spreads
        )
    )


def is_sweep(document: Any) -> bool:
    """A kept bench result: a mapping whose `levels` are each shaped as BenchLevel."""
    if not isinstance(document, dict) or not isinstance(document.get("levels"), list):
        return False
    return all(_level_shape(level) for level in document["levels"])


def cmd_bench_results(args: BenchResultsArgs) -> BenchResultsReply:
    found: dict[str, list[dict[str, Any]]] = {}
    unreadable: list[str] = []
    for run in args["runs"]:
        found[run] = []
        for _, path in numbered_files(bench_dir(args["state_dir"], run)):
            document = read_json(path)
            if is_sweep(document):
                found[run].append(document)
            else:  # said, not skipped silently, nor left for the client to trip over
                unreadable.append(path)
    return {"results": found, "unreadable": unreadable}


def tune_dir(state_dir: str) -> str:
    return state_path(state_dir, "tunes")


def cmd_tune_save(args: TuneSaveArgs) -> TuneSaveReply:
    """Keep a tune record as the next numbered file, with its number in it."""
    record = args["record"]
    number, path = keep_numbered(tune_dir(args["state_dir"]), lambda n: {**record, "tune": n})
    return {"number": number, "path": path}


def is_tune_record(document: Any) -> bool:
    """A kept record with every key TuneRecord requires, each value (and those of the keys it
    may lack) of its declared type: as the client checks the reply, so one record of the
    wrong shape is named as unreadable and skipped, never shown half nor failing the rest."""
    return not shape_problems(document, TuneRecord, "record")


def kept_records(
    folder: str, mine: Callable[[Any], bool], valid: Callable[[Any], bool], number: int | None
) -> tuple[Any, list[int], list[str]]:
    """The folder's record `number` (None: the newest) among those `mine` picks, the numbers
    of those, and the files that are not `valid` records (named, never shown half)."""
    kept: dict[int, Any] = {}
    unreadable: list[str] = []
    for n, path in numbered_files(folder):
        document = read_json(path)
        if not valid(document):
            unreadable.append(path)
        elif mine(document):
            kept[n] = document
    wanted = number if number is not None else max(kept, default=None)
    return (kept.get(wanted) if wanted is not None else None), sorted(kept), unreadable


def cmd_tune_records(args: TuneRecordsArgs) -> TuneRecordsReply:
    record, numbers, unreadable = kept_records(
        tune_dir(args["state_dir"]),
        lambda d: d.get("deployment") == args["deployment"],
        is_tune_record,
        args["number"],
    )
    return {"record": record, "numbers": numbers, "unreadable": unreadable}


def canary_dir(state_dir: str) -> str:
    return state_path(state_dir, "canaries")


def is_canary_record(document: Any) -> bool:
    return not shape_problems(document, CanaryRecord, "record")


def keep_running(
    folder: str, key: str, record: Any, number: int | None, valid: Callable[[Any], bool]
) -> CanaryKeepReply:
    """Keep a router's `key` record (a canary, a live window) as the folder's next numbered
    file (its number under `key`),
    or update the running one it was kept as (only a running record of the same router: a
    finished one is never rewritten)."""
    if number is None:
        number, path = keep_numbered(folder, lambda n: {**record, key: n})
        return {"number": number, "path": path}
    path = os.path.join(folder, f"{number}.json")
    kept = read_json(path)
    if not (valid(kept) and kept["state"] == "running" and kept["router"] == record["router"]):
        fail(f"{path} is not this {key}'s running record: not rewritten", "host")
    write_atomic(path, json.dumps({**record, key: number}).encode(), 0o600)
    return {"number": number, "path": path}


def cmd_canary_keep(args: CanaryKeepArgs) -> CanaryKeepReply:
    return keep_running(
        canary_dir(args["state_dir"]), "canary", args["record"], args["number"], is_canary_record
    )


def routers_records(
    folder: str, router: str, valid: Callable[[Any], bool], number: int | None
) -> dict[str, Any]:
    """A router's kept record `number` (None: its newest), its numbers, the unreadable files."""
    record, numbers, unreadable = kept_records(
        folder, lambda d: d.get("router") == router, valid, number
    )
    return {"record": record, "numbers": numbers, "unreadable": unreadable}


def cmd_canary_records(args: CanaryRecordsArgs) -> CanaryRecordsReply:
    folder = canary_dir(args["state_dir"])
    found = routers_records(folder, args["router"], is_canary_record, args["number"])
    return cast(CanaryRecordsReply, found)


def live_dir(state_dir: str) -> str:
    return state_path(state_dir, "tune-live")


def is_live_record(document: Any) -> bool:
    return not shape_problems(document, LiveRecord, "record")


def cmd_live_keep(args: LiveKeepArgs) -> CanaryKeepReply:
    return keep_running(
        live_dir(args["state_dir"]), "window", args["record"], args["number"], is_live_record
    )


def cmd_live_records(args: LiveRecordsArgs) -> LiveRecordsReply:
    folder = live_dir(args["state_dir"])
    found = routers_records(folder, args["router"], is_live_record, args["number"])
    return cast(LiveRecordsReply, found)
