"""The agent's entry point: one call's name and JSON arguments in, one reply out."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from .bench import cmd_bench
from .files import cmd_read
from .kept_agent import handle, serve, write_reply
from .locks import cmd_release, cmd_tune_lock, cmd_tune_unlock
from .patches import cmd_apply, cmd_probe, cmd_revert
from .protocol import (
    APPLY,
    BENCH,
    BENCH_RESULTS,
    BENCH_SAVE,
    CANARY_KEEP,
    CANARY_RECORDS,
    CHECK_ARGS,
    HOLD,
    LIVE_KEEP,
    LIVE_RECORDS,
    POINT,
    POLL,
    PREFLIGHT,
    PROBE,
    READ,
    RELEASE,
    REVERT,
    ROUTER,
    RUNS,
    SESSION,
    START,
    STATUS,
    STOP,
    SURVEY,
    TUNE_LOCK,
    TUNE_RECORDS,
    TUNE_SAVE,
    TUNE_UNLOCK,
    WORKERS,
)
from .records import (
    cmd_bench_results,
    cmd_bench_save,
    cmd_canary_keep,
    cmd_canary_records,
    cmd_live_keep,
    cmd_live_records,
    cmd_tune_records,
    cmd_tune_save,
)
from .router import cmd_hold, cmd_router, cmd_workers, held, hold_until_eof
from .runs import cmd_point, cmd_poll, cmd_preflight, cmd_runs, cmd_start, cmd_status, cmd_stop
from .sglang_options import cmd_check_args
from .survey import cmd_survey

# Each call's handler, by the call's name on the wire (protocol.CALLS names the same calls):
# it takes the call's args (and `apply` its payload, read from stdin) and returns the reply.
HANDLERS: dict[str, Callable[..., Any]] = {
    PROBE.name: cmd_probe,
    READ.name: cmd_read,
    APPLY.name: cmd_apply,
    REVERT.name: cmd_revert,
    PREFLIGHT.name: cmd_preflight,
    CHECK_ARGS.name: cmd_check_args,
    START.name: cmd_start,
    POLL.name: cmd_poll,
    STATUS.name: cmd_status,
    STOP.name: cmd_stop,
    RELEASE.name: cmd_release,
    POINT.name: cmd_point,
    RUNS.name: cmd_runs,
    BENCH.name: cmd_bench,
    BENCH_SAVE.name: cmd_bench_save,
    BENCH_RESULTS.name: cmd_bench_results,
    TUNE_SAVE.name: cmd_tune_save,
    TUNE_RECORDS.name: cmd_tune_records,
    TUNE_LOCK.name: cmd_tune_lock,
    TUNE_UNLOCK.name: cmd_tune_unlock,
    ROUTER.name: cmd_router,
    WORKERS.name: cmd_workers,
    HOLD.name: cmd_hold,
    CANARY_KEEP.name: cmd_canary_keep,
    CANARY_RECORDS.name: cmd_canary_records,
    LIVE_KEEP.name: cmd_live_keep,
    LIVE_RECORDS.name: cmd_live_records,
    SURVEY.name: cmd_survey,
}


def main() -> None:
    # A dropped connection must not interrupt a change half-way: finish or roll back.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # The server runs `python -m` from the home folder (cmd_start): look for modules there,
    # not in the working folder (`python -c` puts "" on the path).
    home = os.path.expanduser("~")
    sys.path[:] = [home if entry == "" else entry for entry in sys.path]
    if sys.argv[1] == SESSION:  # a kept agent: calls on stdin until the client goes
        # The folder the bundle was unpacked into is named by its hash; a bundle imported
        # from memory (bootstrap.IN_MEMORY) has no file, and says "<bundle>".
        where = globals().get("__file__")
        serve(
            HANDLERS,
            os.path.basename(os.path.dirname(os.path.dirname(where))) if where else "<bundle>",
        )
        return
    call, args = sys.argv[1], json.loads(sys.argv[2])
    payload = sys.stdin.buffer.read() if call == APPLY.name else None
    reply = handle(HANDLERS, call, args, payload)
    write_reply(reply)
    if "error" in reply:
        sys.exit(1)
    if held:
        hold_until_eof()
