"""What the HTTP surface asks of the launcher: health, the requests in flight, model and
server info, and the /metrics page (the Launcher's HTTP-facing state)."""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any

from .http_surface import uuid_hex
from .log_lines import log
from .request_metrics import REQUEST_METRICS, RequestMetrics
from .sglang_sources import SGLANG_VERSION

if TYPE_CHECKING:
    import argparse
    import threading
    from collections.abc import Iterator

    from .decoder import Decoder
    from .pd_decode import DecodePD
    from .pd_prefill import PrefillPD


class HTTPFacing:
    """The Launcher's state as its HTTP handlers read it; the Launcher sets it up."""

    args: argparse.Namespace
    knobs: dict[str, Any]
    server_args: dict[str, Any]
    served_model_name: str
    arch: str
    model_type: str | None
    context_len: int
    startup_time: float
    decoder: Decoder
    pd: PrefillPD | DecodePD | None
    ready: bool
    exiting: bool
    requests: dict[str, float]
    requests_lock: threading.Lock

    def healthy(self) -> bool:
        return self.ready and not self.exiting

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count a request as the tokenizer manager's rid_to_state does, until its answer
        is written: a drain waits for it."""
        rid = uuid_hex()
        with self.requests_lock:
            self.requests[rid] = time.time()
        try:
            yield
        finally:
            with self.requests_lock:
                del self.requests[rid]

    def log_health_check_failed(self) -> None:
        # http_server.health_generate after HEALTH_CHECK_TIMEOUT (20 s; here health_s).
        tic = time.strftime("%H:%M:%S", time.localtime())
        log(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"20 seconds. tic start time: {tic}. last_heartbeat time: {tic}"
        )

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.server_args["tokenizer_path"],
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": self.args.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": self.args.disaggregation_mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model_type,
            "architectures": [self.arch],
        }

    def metrics_text(self) -> str:
        """SGLang's Prometheus page: the scheduler's gauges and latency histograms."""
        # DisaggregationMode.to_engine_type: "prefill", "decode", else "unified".
        engine = {"prefill": "prefill", "decode": "decode"}.get(
            self.args.disaggregation_mode, "unified"
        )
        labels = (
            f'engine_type="{engine}",model_name="{self.served_model_name}",'
            'moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        )
        with self.decoder.cond:
            accept_length = self.decoder.stats.accept_length
        values = {
            "num_running_reqs": len(self.decoder.running),
            "gen_throughput": self.decoder.gen_throughput(),
            "spec_accept_length": accept_length,
            **self.knobs["metrics"],
        }
        names = ["num_running_reqs", "num_queue_reqs", "gen_throughput", "cache_hit_rate",
                 "token_usage"]  # fmt: skip
        if self.args.speculative_algorithm:
            names.append("spec_accept_length")
        counters: dict[str, int] = {}
        if self.pd is not None:
            # In PD a request waiting for its KV is in a queue of its own, not running.
            with self.pd.lock:
                values.update(self.pd.queues)
                counters = dict(self.pd.counters)
            names += list(self.pd.queues)
        lines = []
        for name in names:
            lines += [f"# HELP sglang:{name} {name}.", f"# TYPE sglang:{name} gauge"]
            lines.append(f"sglang:{name}{{{labels}}} {float(values.get(name, 0))}")
        for name, count in counters.items():
            base = name.removesuffix("_total")  # prometheus_client's counter naming
            lines += [f"# HELP sglang:{base} {base}.", f"# TYPE sglang:{base} counter"]
            lines.append(f"sglang:{name}{{{labels}}} {float(count)}")
        # The tokenizer manager's metrics carry no rank labels (real 0.5.17's page).
        labels = f'engine_type="{engine}",model_name="{self.served_model_name}"'
        observations = self.knobs["observations"]
        with self.decoder.cond:
            histograms = {key: list(row) for key, row in self.decoder.metrics.histograms.items()}
            live = dict(self.decoder.metrics.counters)
        for name, doc, bounds, by_stream in REQUEST_METRICS:
            lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} "
                      + ("counter" if bounds is None else "histogram")]  # fmt: skip
            if bounds is None:
                for (key, streaming), value in sorted(live.items()):
                    if key == name:
                        child = f',is_streaming="{streaming}"' if by_stream else ""
                        lines.append(f"sglang:{name}{{{labels}{child}}} {value}")
                continue
            if name in observations:  # the knob's values stand for the streamed series
                knob, series = RequestMetrics(), (name, "true" if by_stream else "")
                for x in observations[name]:
                    knob.observe(*series, float(x))
                histograms = {k: v for k, v in histograms.items() if k[0] != name}
                histograms[series] = knob.histograms[series]
            for (key, streaming), row in sorted(histograms.items()):
                if key != name:
                    continue
                child = f',is_streaming="{streaming}"' if by_stream else ""
                cumulative = 0.0
                for bound, in_bucket in zip((*bounds, math.inf), row, strict=False):
                    cumulative += in_bucket
                    le = "+Inf" if bound == math.inf else repr(float(bound))
                    lines.append(f'sglang:{name}_bucket{{{labels}{child},le="{le}"}} {cumulative}')
                lines.append(f"sglang:{name}_count{{{labels}{child}}} {cumulative}")
                lines.append(f"sglang:{name}_sum{{{labels}{child}}} {row[-1]}")
        return "\n".join(lines) + "\n"

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.served_model_name,
            "parent": None,
            "max_model_len": self.context_len,
        }

    def server_info(self) -> dict[str, Any]:
        return {
            **self.server_args,
            "startup_time": self.startup_time,
            "internal_states": [{}],
            "version": SGLANG_VERSION,
            "frontend": "python",
        }
