"""The agent's entry point: one call's name and JSON arguments in, one reply out."""

from __future__ import annotations

import json
import os
import signal
import sys

from .handlers import handle, write_reply
from .protocol import APPLY, HOLD, SESSION


def main() -> None:
    # A dropped connection must not interrupt a change half-way: finish or roll back.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # The server runs `python -m` from the home folder (cmd_start): look for modules there,
    # not in the working folder (`python -c` puts "" on the path).
    home = os.path.expanduser("~")
    sys.path[:] = [home if entry == "" else entry for entry in sys.path]
    if sys.argv[1] == SESSION:  # a kept agent: calls on stdin until the client goes
        from .kept_agent import serve

        # The folder the bundle was unpacked into is named by its hash; a bundle imported
        # from memory (bootstrap.IN_MEMORY) has no file, and says "<bundle>".
        where = globals().get("__file__")
        serve(os.path.basename(os.path.dirname(os.path.dirname(where))) if where else "<bundle>")
        return
    call, args = sys.argv[1], json.loads(sys.argv[2])
    payload = sys.stdin.buffer.read() if call == APPLY.name else None
    reply = handle(call, args, payload)
    write_reply(reply)
    if "error" in reply:
        sys.exit(1)
    if call == HOLD.name:
        from .router import held, hold_until_eof

        if held:
            hold_until_eof()
