"""Reading one SGLang /metrics page: deployctl's parser against prometheus_client's.

`top`, the dashboard, `canary` and `tune --live` read every replica's page each round (0.5 to
1 s) on the user's machine, so the parse's CPU times the fleet's replicas is what a round
costs there. Both parsers read the real pages captured from SGLang 0.5.17 on the H200
(`tests/data/real-sglang-0.5.17/metrics-*.txt`, ~600 lines, 77 KB) in alternating order, each
read timed with `time.process_time`; figures are medians over the reads, and the ratio is
taken from reads made side by side. prometheus_client's side is what deployctl read through
it before (tests/test_metrics_parser.py's oracle), so the two give the same counts.

Run: python benchmarks/metrics_parse.py [--reads 200]
Results: a table on stdout and benchmarks/results/metrics_parse.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deployctl.metrics import read_counts  # noqa: E402
from tests.test_metrics_parser import REAL_PAGES, prometheus_counts  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_ms(parse: Callable[[str], object], text: str) -> float:
    start = time.process_time()
    parse(text)
    return (time.process_time() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200, help="reads of each page per parser")
    args = parser.parse_args()
    rows = []
    for page in REAL_PAGES:
        text = page.read_text(encoding="utf-8")
        assert repr(read_counts(text)) == repr(prometheus_counts(text))  # the same answer
        ours, theirs = [], []
        for turn in range(args.reads):
            pair = [(read_counts, ours), (prometheus_counts, theirs)]
            for parse, times in pair if turn % 2 else reversed(pair):
                times.append(cpu_ms(parse, text))
        ours_ms, theirs_ms = statistics.median(ours), statistics.median(theirs)
        rows.append(
            {
                "page": page.name,
                "lines": text.count("\n"),
                "deployctl_ms": round(ours_ms, 3),
                "prometheus_client_ms": round(theirs_ms, 3),
                "ratio": round(theirs_ms / ours_ms, 2),
                # A `top` or dashboard round over 256 replicas, read once a second.
                "cores_at_256_replicas_per_s": {
                    "deployctl": round(256 * ours_ms / 1000, 2),
                    "prometheus_client": round(256 * theirs_ms / 1000, 2),
                },
            }
        )
    print(f"{'page':36} {'lines':>5} {'deployctl ms':>12} {'prom_client ms':>14} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['page']:36} {row['lines']:5} {row['deployctl_ms']:12.3f} "
            f"{row['prometheus_client_ms']:14.3f} {row['ratio']:6.2f}"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "metrics_parse.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
