"""Kept benchmark results and tune records under state_dir."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .files import read_json, state_path
from .measures import (
    BenchResultsArgs,
    BenchResultsReply,
    BenchSaveArgs,
    BenchSaveReply,
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


def cmd_tune_records(args: TuneRecordsArgs) -> TuneRecordsReply:
    kept: dict[int, TuneRecord] = {}
    unreadable: list[str] = []
    for number, path in numbered_files(tune_dir(args["state_dir"])):
        document = read_json(path)
        if not is_tune_record(document):
            unreadable.append(path)
        elif document.get("deployment") == args["deployment"]:
            kept[number] = document
    wanted = args["number"] if args["number"] is not None else max(kept, default=None)
    return {
        "record": kept.get(wanted) if wanted is not None else None,
        "numbers": sorted(kept),
        "unreadable": unreadable,
    }
