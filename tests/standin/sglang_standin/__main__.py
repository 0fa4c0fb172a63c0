"""Run the stand-in: ``python -m sglang_standin`` (the package's parent directory on the
path, as on test hosts) or ``python path/to/sglang_standin`` (tests, and the ranks)."""

import importlib
import json
import os
import sys

if __package__:
    _package = __package__
else:
    # Run by path, this directory is sys.path[0] and its modules would be top-level ones
    # (and shadow any like-named module): put its parent there instead, import the package.
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0]) == _here:
        sys.path[0] = os.path.dirname(_here)
    else:
        sys.path.insert(0, os.path.dirname(_here))
    _package = os.path.basename(_here)

if __name__ == "__main__":
    # A rank (Launcher._spawn: the package by path, a hidden first argument) needs only the
    # ranks module; the server's modules would cost every rank about 13 ms of CPU.
    ranks = importlib.import_module(f"{_package}.ranks")
    if sys.argv[1:2] == [ranks.CHILD_FLAG]:
        ranks.child_main(json.loads(sys.argv[2]))
    importlib.import_module(f"{_package}.launch_server").main()
