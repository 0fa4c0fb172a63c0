"""Each agent call's handler, and one call answered: its reply, or its error as one line."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

from . import protocol
from .files import CallFailed

# Each call's handler, by the call's name on the wire (protocol.CALLS names the same calls), as
# (module, function): a call imports its own module only, as each module's imports cost a
# one-shot call's Python its start-up time. The handler takes the call's args (and `apply` its
# payload, read from stdin) and returns the reply.
HANDLERS: dict[str, tuple[str, str]] = {
    protocol.PROBE.name: ("patches", "cmd_probe"),
    protocol.READ.name: ("files", "cmd_read"),
    protocol.APPLY.name: ("patches", "cmd_apply"),
    protocol.REVERT.name: ("patches", "cmd_revert"),
    protocol.PREFLIGHT.name: ("runs", "cmd_preflight"),
    protocol.CHECK_ARGS.name: ("sglang_options", "cmd_check_args"),
    protocol.START.name: ("runs", "cmd_start"),
    protocol.POLL.name: ("runs", "cmd_poll"),
    protocol.STATUS.name: ("runs", "cmd_status"),
    protocol.STOP.name: ("runs", "cmd_stop"),
    protocol.RELEASE.name: ("locks", "cmd_release"),
    protocol.POINT.name: ("runs", "cmd_point"),
    protocol.RUNS.name: ("runs", "cmd_runs"),
    protocol.BENCH.name: ("bench", "cmd_bench"),
    protocol.BENCH_SAVE.name: ("records", "cmd_bench_save"),
    protocol.BENCH_RESULTS.name: ("records", "cmd_bench_results"),
    protocol.TUNE_SAVE.name: ("records", "cmd_tune_save"),
    protocol.TUNE_RECORDS.name: ("records", "cmd_tune_records"),
    protocol.TUNE_LOCK.name: ("locks", "cmd_tune_lock"),
    protocol.TUNE_UNLOCK.name: ("locks", "cmd_tune_unlock"),
    protocol.ROUTER.name: ("router", "cmd_router"),
    protocol.WORKERS.name: ("router", "cmd_workers"),
    protocol.HOLD.name: ("router", "cmd_hold"),
    protocol.CANARY_KEEP.name: ("records", "cmd_canary_keep"),
    protocol.CANARY_RECORDS.name: ("records", "cmd_canary_records"),
    protocol.LIVE_KEEP.name: ("records", "cmd_live_keep"),
    protocol.LIVE_RECORDS.name: ("records", "cmd_live_records"),
    protocol.SURVEY.name: ("survey", "cmd_survey"),
}


def handler(call: str) -> Callable[..., Any]:
    """The function that answers `call` (KeyError: no such call)."""
    module, function = HANDLERS[call]
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)  # type: ignore[no-any-return]


def handle(call: str, args: Any, payload: bytes | None = None) -> Any:
    """One call's reply, or its error as `{"error", "code"}` (one line for the client, never
    a traceback on its screen); `payload`: the input of a call that reads one (apply)."""
    try:
        if call not in HANDLERS:
            return error(f"unknown agent call {call!r}", "agent")
        answer = handler(call)
        return answer(args) if payload is None else answer(args, payload)
    except CallFailed as failed:
        return error(failed.message, failed.code)
    except OSError as exc:  # a missing home, a state_dir that is a file, a read-only disk
        where = f": {exc.filename}" if exc.filename else ""
        return error(f"{call} failed on the host: {exc.strerror or exc}{where}", "host")
    except Exception as exc:
        return error(f"{call} failed on the host: {type(exc).__name__}: {exc}", "agent")


def error(message: str, code: str) -> dict[str, str]:
    return {"error": message, "code": code}


def write_reply(document: Any) -> bool:
    """One reply line on stdout; False where it cannot be written (the client went)."""
    try:
        sys.stdout.write(protocol.REPLY_MARK + json.dumps(document) + "\n")
        sys.stdout.flush()
    except OSError:
        return False
    return True
