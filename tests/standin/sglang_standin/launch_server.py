"""Entry point: main() with launch_server's command line (__main__ runs a rank itself)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import NoReturn

from .adaptive_spec import load_adaptive_config
from .knobs import load_knobs
from .launcher import Launcher
from .log_lines import log, write
from .server_args import DEPRECATED, build_parser
from .sglang_sources import sglang_root, threshold_flag_supported


def _model_path_from_argv(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg in ("--model-path", "--model") and i + 1 < len(argv):
            return argv[i + 1]
        for flag in ("--model-path=", "--model="):
            if arg.startswith(flag):
                return arg[len(flag) :]
    return None


def record_argv(argv: list[str]) -> None:
    """Append this start's exact argv to <model_path>/standin-argv.jsonl."""
    model_path = _model_path_from_argv(argv)
    if model_path is None or not os.path.isdir(model_path):
        return
    entry = {
        "argv": argv,
        "env": dict(os.environ),
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
        "sid": os.getsid(0),
        "time": time.time(),
    }
    fd = os.open(
        os.path.join(model_path, "standin-argv.jsonl"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def _launch_warning() -> None:
    # launch_server.py warns at import under `python -m`; the log shows it.
    root = sglang_root()
    write(
        2,
        f"{root}/launch_server.py:71: UserWarning: 'python -m sglang.launch_server' is still "
        "supported, but 'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]\n"
        "  warnings.warn(\n",
    )


def _exit_bad_model_path(path: str) -> NoReturn:
    # A path that is not a local folder is taken for a Hub repo id, and
    # transformers rejects it; launch_server dies with this traceback.
    root = sglang_root()
    write(
        2,
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n'
        f'  File "{root}/launch_server.py", line 81, in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f"OSError: Incorrect path_or_model_id: {path!r}. Please provide either the path "
        "to a local folder or the repo_id of a model on the Hub.\n",
    )
    sys.exit(1)


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the stand-in with launch_server's command line."""
    argv = sys.argv[1:] if argv is None else argv
    record_argv(argv)
    _launch_warning()
    args = build_parser(threshold_flag_supported()).parse_args(argv)
    for flag, new_flag in DEPRECATED.items():
        if getattr(args, flag[2:].replace("-", "_")):
            # Printed before logging is configured, so without a timestamp.
            write(
                2,
                f"\033[1;33m'{flag}' is deprecated and will be removed in a future release. "
                f"Use '{new_flag}' instead.\033[0m\n",
            )
    if not os.path.isdir(args.model_path):
        _exit_bad_model_path(args.model_path)
    slots = (
        load_adaptive_config(args.speculative_adaptive_config)
        if args.speculative_adaptive
        else None
    )
    knobs = load_knobs(args.model_path)
    launcher = Launcher(args, knobs, slots)
    # SGLang logs the dataclass's repr, secrets and all: ServerArgs(model_path='…', …) (the
    # real 0.5.17 capture; 0.5.23's engine.py logs a dict, which deployctl masks too).
    fields = ", ".join(f"{k}={v!r}" for k, v in launcher.server_args.items())
    log(f"server_args=ServerArgs({fields})")
    if args.enable_flashinfer_allreduce_fusion:
        log(
            "--enable-flashinfer-allreduce-fusion is deprecated. "
            "Please use --flashinfer-allreduce-fusion-backend=auto instead."
        )
    launcher.run()
