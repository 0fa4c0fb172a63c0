"""Each agent call's handler, and one call answered: its reply, or its error as one line."""

from __future__ import annotations

import sys

from .files import CallFailed
from .lean import dumps
from .wire import REPLY_MARK

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Each call's handler, by the call's name on the wire (protocol.CALLS names the same calls:
# tests/test_agent_calls.py), as
# (module, function): a call imports its own module only, as each module's imports cost a
# one-shot call's Python its start-up time. The handler takes the call's args (and `apply` its
# payload, read from stdin) and returns the reply.
HANDLERS: dict[str, tuple[str, str]] = {
    "probe": ("patches", "cmd_probe"),
    "read": ("files", "cmd_read"),
    "apply": ("patches", "cmd_apply"),
    "revert": ("patches", "cmd_revert"),
    "preflight": ("runs", "cmd_preflight"),
    "check_args": ("sglang_options", "cmd_check_args"),
    "start": ("runs", "cmd_start"),
    "poll": ("runs", "cmd_poll"),
    "status": ("runs", "cmd_status"),
    "stop": ("runs", "cmd_stop"),
    "release": ("locks", "cmd_release"),
    "point": ("runs", "cmd_point"),
    "runs": ("runs", "cmd_runs"),
    "bench": ("bench", "cmd_bench"),
    "bench_save": ("records", "cmd_bench_save"),
    "bench_results": ("records", "cmd_bench_results"),
    "tune_save": ("records", "cmd_tune_save"),
    "tune_records": ("records", "cmd_tune_records"),
    "tune_lock": ("locks", "cmd_tune_lock"),
    "tune_unlock": ("locks", "cmd_tune_unlock"),
    "router": ("router", "cmd_router"),
    "workers": ("router", "cmd_workers"),
    "hold": ("router", "cmd_hold"),
    "canary_keep": ("records", "cmd_canary_keep"),
    "canary_records": ("records", "cmd_canary_records"),
    "live_keep": ("records", "cmd_live_keep"),
    "live_records": ("records", "cmd_live_records"),
    "survey": ("survey", "cmd_survey"),
}


def handler(call: str) -> Callable[..., Any]:
    """The function that answers `call` (KeyError: no such call)."""
    module, function = HANDLERS[call]
    name = f"{__package__}.{module}"
    __import__(name)  # not importlib's import_module: its own import costs a call ~1 ms
    return getattr(sys.modules[name], function)  # type: ignore[no-any-return]


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
        sys.stdout.write(REPLY_MARK + dumps(document) + "\n")
        sys.stdout.flush()
    except OSError:
        return False
    return True
