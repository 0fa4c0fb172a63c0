"""The agent's entry point: one call's name and JSON arguments in, one reply out."""

from __future__ import annotations

import os
import sys

from .handlers import handle, write_reply
from .lean import ignore_hangup, loads
from .wire import SESSION


def main() -> None:
    ignore_hangup()  # a dropped connection must not interrupt a change: finish or roll back
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
    call, args = sys.argv[1], loads(sys.argv[2])
    payload = sys.stdin.buffer.read() if call == "apply" else None
    reply = handle(call, args, payload)
    write_reply(reply)
    if "error" in reply:
        sys.exit(1)
    if call == "hold":
        from .router import held, hold_until_eof

        if held:
            hold_until_eof()
