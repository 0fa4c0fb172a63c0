"""Test double for SGLang 0.5.23's ``python -m sglang.launch_server``.

This package lives in tests/ and is never part of deployctl.  It lets tests run
deployctl against hosts without GPUs: it accepts the launch_server flags that
deployctl renders, writes SGLang 0.5.23's log line forms (wording taken from
the 0.5.23 wheel), serves /health, /health_generate, /model_info and /v1/models,
and starts one ``sglang::scheduler_TP{i}`` process per rank.  Behaviour knobs
come from ``<model_path>/standin.json``; see README.md beside this package.

Run it as ``python -m sglang_standin`` (its parent directory on the path, as on
test hosts) or by path, ``python path/to/sglang_standin``; both run __main__.py.

Stdlib only; torch is imported only by rank processes in GPU mode
(``gpu_mib > 0``).  Rank processes are this same package re-executed by path
with a hidden first argument (ranks.CHILD_FLAG).

Modules, by concern:
  launch_server    main(): the command line, argv record, launch-time errors
  knobs            standin.json: KNOB_DEFAULTS and their checks
  server_args      the launch_server argument parser
  sglang_sources   the installed sglang, if any: threshold flag, traceback root
  log_lines        output: log lines in SGLang's and uvicorn's wording
  proctitle        process titles and prctl
  tracebacks       scheduler tracebacks with 0.5.23's frames
  ranks            rank and detokenizer processes: GPU hold, crash modes
  launcher         the main process: ranks, signals, readiness, multi-node, drain
  http_facing      the launcher's state as its HTTP handlers read it (/metrics too)
  http_surface     the HTTP server and its endpoints
  decoder          the decode model (Decoder, DecodeRequest, DecodeStats, ColdStart)
  request_metrics  the tokenizer manager's request metrics
  adaptive_spec    adaptive speculation: CUDA-graph batch sizes, slot steps, config
  pd_common        PD disaggregation: what prefill and decode share
  pd_prefill       PD: the prefill side and its bootstrap server
  pd_decode        PD: the decode side
"""
