"""Run the stand-in: ``python -m sglang_standin`` (the package's parent directory on the
path, as on test hosts) or ``python path/to/sglang_standin`` (tests, and the ranks)."""

import importlib
import os
import sys

if __package__:
    from .launch_server import main
else:
    # Run by path, this directory is sys.path[0] and its modules would be top-level ones
    # (and shadow any like-named module): put its parent there instead, import the package.
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0]) == _here:
        sys.path[0] = os.path.dirname(_here)
    else:
        sys.path.insert(0, os.path.dirname(_here))
    main = importlib.import_module(f"{os.path.basename(_here)}.launch_server").main

if __name__ == "__main__":
    main()
