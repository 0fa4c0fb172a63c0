"""How long finding a crash in a 1 GB SGLang log takes: raw read vs tail scan vs full scan.

Builds a 1 GB synthetic log in /tmp (healthy decode lines, warnings, and an 8-rank scheduler
crash near the end), then measures, median of 3:
  read   reading the file end to end in 16 MiB blocks, no scanning (the I/O floor)
  tail   deployctl's scan_local_file (growing windows from the end: 4, 16, 64 MiB)
  full   scan_text's scanner over the whole file, streamed in 16 MiB chunks
Run: python benchmarks/crash_scan.py [--size-mb 1024]. Results go to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deployctl.crash import CrashReport, CrashScanner, load_catalog
from deployctl.ops.logs import SCAN_TAIL_BYTES, scan_local_file

RESULTS = Path(__file__).resolve().parent / "results"
BLOCK = 16 << 20
TRIALS = 3


def healthy_block(seed: int) -> str:
    """Return ~1 MiB of the lines a busy SGLang server writes."""
    lines: list[str] = []
    n, total = seed, 0
    while total < 1 << 20:
        n += 1
        stamp = f"2026-11-29 10:{(n // 60) % 60:02d}:{n % 60:02d}"
        batch = [
            f"[{stamp} TP0] Decode batch, #running-req: {n % 48}, #token: {n * 37 % 90000}, "
            f"token usage: 0.{n % 97:02d}, accept len: 3.{n % 10}, cuda graph: True, "
            f"gen throughput (token/s): {n % 1000}.00, #queue-req: 0, \n"
        ]
        if n % 50 == 0:
            batch.append(
                f'INFO:     127.0.0.1:{40000 + n % 20000} - "POST /generate HTTP/1.1" 200 OK\n'
            )
        if n % 400 == 0:
            batch.append(
                f"[{stamp} TP{n % 8}] WARNING: KV cache pool is nearly full, retracting requests.\n"
            )
        lines.extend(batch)
        total += sum(map(len, batch))
    return "".join(lines)


def crash_text() -> str:
    """Return an 8-rank scheduler crash, as SGLang 0.5.23 logs it."""
    out = []
    for rank in range(8):
        out.append(
            f"[2026-11-29 11:12:20 TP{rank}] Scheduler hit an exception: "
            "Traceback (most recent call last):\n"
            '  File "/env/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", '
            "line 3012, in run_scheduler_process\n"
            "    scheduler.event_loop_overlap()\n"
            '  File "/env/lib/python3.11/site-packages/sglang/srt/layers/logits_processor.py", '
            "line 402, in forward\n"
            "    hidden = hidden_states[pruned] + bias\n"
            "RuntimeError: The size of tensor a (160) must match the size of tensor b (2) at "
            "non-singleton dimension 0\n\n"
        )
    out.append(
        "[2026-11-29 11:12:20] Received sigquit from a child process. "
        "It usually means the child failed.\n"
    )
    return "".join(out)


def build_log(path: Path, size: int) -> None:
    """Write `size` bytes of log: healthy blocks, the crash ~200 kB before the end."""
    blocks = [healthy_block(seed * 100_000).encode() for seed in range(8)]
    crash = crash_text().encode()
    tail = blocks[0][:200_000]
    with path.open("wb") as handle:
        written, i = 0, 0
        while written + len(blocks[i % 8]) < size - len(crash) - len(tail):
            written += handle.write(blocks[i % 8])
            i += 1
        handle.write(crash)
        handle.write(tail)


def read_all(path: Path) -> int:
    """Read the file end to end in 16 MiB blocks; return the bytes read."""
    total = 0
    with path.open("rb", buffering=0) as handle:
        while chunk := handle.read(BLOCK):
            total += len(chunk)
    return total


def full_scan(path: Path) -> list[CrashReport]:
    """Scan the whole file through one CrashScanner, 16 MiB at a time."""
    scanner = CrashScanner(load_catalog())
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with path.open("rb", buffering=0) as handle:
        while chunk := handle.read(BLOCK):
            scanner.feed(decoder.decode(chunk))
    scanner.feed(decoder.decode(b"", final=True))
    scanner.finish()
    return scanner.reports


def median_time(action: Callable[[], object]) -> tuple[float, list[float], object]:
    times, result = [], None
    for _ in range(TRIALS):
        start = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="log size in MiB")
    size = parser.parse_args().size_mb << 20

    catalog = load_catalog()
    folder = Path(tempfile.mkdtemp(prefix="deployctl-bench-", dir="/tmp"))
    log = folder / "server_v1.log"
    try:
        started = time.perf_counter()
        build_log(log, size)
        build_s = time.perf_counter() - started
        actual = log.stat().st_size
        read_s, read_all_s, _ = median_time(lambda: read_all(log))
        tail_s, tail_all_s, tail_found = median_time(lambda: scan_local_file(log, catalog))
        full_s, full_all_s, full_found = median_time(lambda: full_scan(log))
    finally:
        log.unlink(missing_ok=True)
        folder.rmdir()

    def describe(found: object) -> str:
        assert isinstance(found, list)
        return ", ".join(f"{c.signature} x{len(c.ranks)} ranks" for c in found) or "none"

    rows = [
        ("read end to end (16 MiB blocks)", read_s, read_all_s, "-"),
        ("scan_local_file (from the end)", tail_s, tail_all_s, describe(tail_found)),
        ("full scan (CrashScanner, 16 MiB chunks)", full_s, full_all_s, describe(full_found)),
    ]
    print(f"log: {actual / (1 << 20):.0f} MiB synthetic SGLang log (built in {build_s:.1f} s)")
    print(f"{'measure':42} {'median s':>9} {'MB/s':>8}  crashes found")
    for name, median, _, found in rows:
        scanned = min(actual, SCAN_TAIL_BYTES) if name.startswith("scan_local") else actual
        print(f"{name:42} {median:9.3f} {scanned / median / 1e6:8.0f}  {found}")
    print(
        f"ratios: full/read {full_s / read_s:.1f}x, read/tail {read_s / tail_s:.1f}x, "
        f"full/tail {full_s / tail_s:.1f}x"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "crash_scan.json"
    out.write_text(
        json.dumps(
            {
                "log_bytes": actual,
                "tail_bytes": SCAN_TAIL_BYTES,
                "trials": TRIALS,
                "seconds": {
                    "read": read_all_s,
                    "scan_local_file": tail_all_s,
                    "full_scan": full_all_s,
                },
                "median_s": {"read": read_s, "scan_local_file": tail_s, "full_scan": full_s},
                "found": {
                    "scan_local_file": describe(tail_found),
                    "full_scan": describe(full_found),
                },
                "python": platform.python_version(),
                "cpu_count": os.cpu_count(),
                "note": "file in page cache after being written: read is memory bandwidth, not disk",
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
