"""The real sglang package, if one is importable (never imported: its __init__ needs
torch): whether it knows the threshold flag, and where traceback frames say it lives."""

from __future__ import annotations

import importlib.util
import os
import sys

SGLANG_VERSION = "0.5.23"
THRESHOLD_FIELD = "speculative_disable_batch_threshold"


def _sglang_dirs() -> list[str]:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return list(spec.submodule_search_locations)


def threshold_flag_supported() -> bool:
    """Say whether the installed SGLang knows --speculative-disable-batch-threshold.

    The flag exists only once the spec-disable patch added the field; with no
    sglang installed at all the stand-in accepts it.
    """
    dirs = _sglang_dirs()
    if not dirs:
        return True
    # 0.5.23 declares fields in arg_groups/fields/spec.py; older releases
    # kept one dataclass in server_args.py.
    for rel in ("srt/arg_groups/fields/spec.py", "srt/server_args.py"):
        for root in dirs:
            try:
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    return THRESHOLD_FIELD in f.read()
            except OSError:
                continue
    return False


def sglang_root() -> str:
    """Return the directory traceback frames should name as sglang's."""
    dirs = _sglang_dirs()
    if dirs:
        return dirs[0]
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return os.path.join(sys.prefix, "lib", ver, "site-packages", "sglang")
