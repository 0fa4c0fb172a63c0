"""Behaviour of the crash scanner and its signature catalog on SGLang 0.5.23 logs."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from deployctl.crash import (
    SHIPPED_CATALOG,
    STORED_LINE_CAP,
    Catalog,
    CatalogError,
    CrashReport,
    CrashScanner,
    _literal_anchors,
    crash_lines,
    format_ranks,
    load_catalog,
    scan_lines,
    scan_text,
)
from deployctl.crash.catalog import Signature

LOGS = Path(__file__).parent / "data" / "logs"
ALL_LOGS = sorted(p.name for p in LOGS.glob("*.log"))
SP = "/home/ml/env/lib/python3.11/site-packages"


def read_log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def line_number_of(text: str, needle: str) -> int:
    """Return the 1-based number of the first line containing `needle`."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


def scheduler_traceback(rank: str, message: str, exception: str = "RuntimeError") -> str:
    prefix = f" {rank}" if rank else ""
    return (
        f"[2026-11-29 10:12:33{prefix}] Scheduler hit an exception: "
        "Traceback (most recent call last):\n"
        f'  File "{SP}/sglang/srt/managers/scheduler.py", line 6368, in run_scheduler_process\n'
        "    scheduler.run_event_loop()\n"
        f'  File "{SP}/sglang/srt/layers/logits_processor.py", line 402, in forward\n'
        "    logits = logits[sample_indices] + bias\n"
        "             ~~~~~~~~~~~~~~~~~~~~~~~^~~~~~\n"
        f"{exception}: {message}\n"
        "\n"
    )


SHAPE = (
    "The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension 0"
)


SIGQUIT = (
    "[2026-11-29 10:12:34] Received sigquit from a child process. "
    "It usually means the child failed.\n"
)

KEYERROR = Signature(id="key", title="Key", hint="h", exception=re.compile("^KeyError$"))
RUNTIME = Signature(id="runtime", title="Runtime", hint="h", exception=re.compile("^RuntimeError$"))
CHILD = Signature(
    id="child-failed",
    title="Child failed",
    hint="h",
    line=re.compile("Received sigquit from a child process"),
    secondary=True,
)
SEPARATOR = "\nDuring handling of the above exception, another exception occurred:\n\n"
# A chained traceback whose exception no signature knows.
UNKNOWN = 'Traceback (most recent call last):\n  File "/srv/x.py", line 1, in f\nOSError: boom\n'


# --- real crash forms ----------------------------------------------------------------------


def test_same_traceback_from_eight_ranks_is_one_report_listing_the_ranks() -> None:
    text = read_log("tp8_spec_shape_mismatch.log")

    reports = scan_text(text)

    assert len(reports) == 1
    report = reports[0]
    assert report.ranks == tuple(f"TP{r}" for r in range(8))
    assert report.signature == "tensor-shape-mismatch"
    assert report.exception == "RuntimeError"
    assert report.message == SHAPE.format(a=160, b=2)
    assert report.file == f"{SP}/sglang/srt/layers/logits_processor.py"
    assert (report.line, report.function) == (402, "forward")
    assert report.log_line == line_number_of(text, "TP0] Scheduler hit an exception")


def test_tensor_shape_hint_names_batch_times_draft_tokens_from_the_server_args() -> None:
    (report,) = scan_text(read_log("tp8_spec_shape_mismatch.log"))

    assert (
        "160 = 10 × 16 (batch × draft tokens): speculative shapes reached a non-speculative step"
        in report.hint
    )
    # Both sizes and their ratio are spelled out.
    assert "Tensor a has size 160 where tensor b has 2 (ratio a/b = 80)" in report.hint


def test_tensor_shape_hint_uses_the_ratio_as_second_factor_without_server_args() -> None:
    (report,) = scan_text(scheduler_traceback("TP0", SHAPE.format(a=160, b=10)))

    assert "160 = 10 × 16: if 10 is the batch and 16 the number of draft tokens" in report.hint
    assert "ratio a/b = 16" in report.hint


def test_tensor_shape_hint_says_when_sizes_are_not_multiples() -> None:
    (report,) = scan_text(scheduler_traceback("TP0", SHAPE.format(a=7, b=3)))

    assert "not multiples of each other" in report.hint


def test_tensor_shape_hint_does_not_read_a_huge_ratio_as_draft_tokens() -> None:
    (report,) = scan_text(scheduler_traceback("TP0", SHAPE.format(a=2, b=4096)))

    assert "Tensor b has size 4096 where tensor a has 2 (ratio b/a = 2048)." in report.hint
    assert "draft tokens" not in report.hint


def test_parent_sigquit_after_a_traceback_is_part_of_that_crash() -> None:
    text = scheduler_traceback("TP0", SHAPE.format(a=160, b=2)) + (
        "[2026-11-29 10:12:34] Received sigquit from a child process. "
        "It usually means the child failed.\n"
    )

    assert [r.signature for r in scan_text(text)] == ["tensor-shape-mismatch"]


def test_parent_sigquit_alone_is_reported() -> None:
    text = (
        "[2026-11-29 10:12:34] Received sigquit from a child process. "
        "It usually means the child failed.\n"
    )

    (report,) = scan_text(text)

    assert report.signature == "child-failed"
    assert report.exception == ""
    assert report.log_line == 1


def test_syntax_error_in_patched_server_args_points_at_the_file_and_line() -> None:
    (report,) = scan_text(read_log("syntax_error_server_args.log"))

    assert report.signature == "sglang-syntax-error"
    assert report.exception == "SyntaxError"
    assert report.message == "invalid syntax. Perhaps you forgot a comma?"
    assert report.file == f"{SP}/sglang/srt/server_args.py"
    assert report.line == 123
    assert report.function is None
    assert report.ranks == ()
    assert report.log_line == 1
    assert "deployctl patch audit" in report.hint
    assert "deployctl patch revert" in report.hint


def test_import_error_inside_sglang_blames_a_patch() -> None:
    text = (
        "Traceback (most recent call last):\n"
        f'  File "{SP}/sglang/srt/speculative/eagle_worker_v2.py", line 41, in <module>\n'
        "    from sglang.srt.speculative.spec_disable import SpecDisablePolicy\n"
        "ModuleNotFoundError: No module named 'sglang.srt.speculative.spec_disable'\n"
    )

    (report,) = scan_text(text)

    assert report.signature == "sglang-import-error"
    assert "deployctl patch revert" in report.hint


def test_out_of_memory_while_capturing_cuda_graphs() -> None:
    text = read_log("cuda_graph_oom.log")

    (report,) = scan_text(text)

    assert report.signature == "cuda-graph-capture-oom"
    # The chained traceback's final exception is SGLang's wrapper around torch's OOM.
    assert report.exception == "Exception"
    assert report.message.startswith("Capture cuda graph failed: CUDA out of memory.")
    # The OOM message names each rank's GPU, yet it is one crash.
    assert report.ranks == ("TP0", "TP1", "TP2", "TP3")
    assert report.log_line == line_number_of(text, "TP0] Scheduler hit an exception")
    assert "--mem-fraction-static" in report.hint
    assert "--cuda-graph-max-bs" in report.hint


def test_plain_cuda_out_of_memory() -> None:
    text = scheduler_traceback(
        "TP0",
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "139.81 GiB of which 1.06 GiB is free.",
        exception="torch.OutOfMemoryError",
    )

    (report,) = scan_text(text)

    assert report.signature == "cuda-oom"
    assert report.exception == "torch.OutOfMemoryError"
    assert "--mem-fraction-static" in report.hint


def test_not_enough_memory_as_exception_and_as_log_line() -> None:
    message = "Not enough memory. Please try to increase --mem-fraction-static."
    as_exception = scheduler_traceback("TP0", message)
    as_line = f"[2026-11-29 10:12:33 TP0] {message}\n"

    assert [r.signature for r in scan_text(as_exception)] == ["not-enough-memory"]
    assert [r.signature for r in scan_text(as_line)] == ["not-enough-memory"]


def test_nccl_watchdog_timeout_then_subprocess_crash_is_one_report() -> None:
    text = read_log("nccl_watchdog_timeout.log")

    (report,) = scan_text(text)

    assert report.signature == "nccl-timeout"
    assert report.message.startswith("Watchdog caught collective operation timeout: WorkNCCL(")
    assert report.ranks == ("rank3",)
    assert report.log_line == line_number_of(text, "[rank3]:")
    assert report.file is None and report.line is None


def test_subprocess_crash_alone_names_its_signal() -> None:
    text = (
        "[2026-11-29 10:22:42] Subprocess scheduler_5 (pid=48219) crashed with exit code -9. "
        "Triggering SIGQUIT for cleanup...\n"
        "[2026-11-29 10:22:42] Received sigquit from a child process. "
        "It usually means the child failed.\n"
    )

    (report,) = scan_text(text)

    assert report.signature == "subprocess-crashed"
    assert "exit code -9 = killed by SIGKILL" in report.hint
    assert "scheduler_5 (pid 48219)" in report.hint


def test_nccl_error_exception() -> None:
    text = scheduler_traceback(
        "TP2",
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled "
        "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3",
        exception="torch.distributed.DistBackendError",
    )

    (report,) = scan_text(text)

    assert report.signature == "nccl-error"
    assert report.ranks == ("TP2",)


def test_port_in_use_reported_by_uvicorn() -> None:
    text = read_log("port_in_use.log")

    (report,) = scan_text(text)

    assert report.signature == "port-in-use"
    assert report.message.startswith("[Errno 98] error while attempting to bind")
    assert report.log_line == line_number_of(text, "[Errno 98]")


def test_port_in_use_raised_as_oserror() -> None:
    text = (
        "Traceback (most recent call last):\n"
        f'  File "{SP}/sglang/srt/entrypoints/http_server.py", line 2590, in launch_server\n'
        "    sock.bind((server_args.host, server_args.port))\n"
        "OSError: [Errno 98] Address already in use\n"
    )

    assert [r.signature for r in scan_text(text)] == ["port-in-use"]


def test_scheduler_watchdog_timeout_printed_by_every_rank_is_merged() -> None:
    text = "".join(
        f"[2026-11-29 10:40:0{r} TP{r}] Scheduler watchdog timeout "
        "(self.watchdog_timeout=300, self.soft=False)\n"
        for r in (3, 0, 2, 1)
    )

    (report,) = scan_text(text)

    assert report.signature == "scheduler-watchdog-timeout"
    assert report.ranks == ("TP0", "TP1", "TP2", "TP3")
    assert report.log_line == 1


def test_scheduler_died_during_initialization_points_at_the_oom_killer() -> None:
    text = (
        "Traceback (most recent call last):\n"
        f'  File "{SP}/sglang/srt/entrypoints/engine.py", line 2026, in _wait_for_scheduler_ready\n'
        "    raise _scheduler_died_error(j, scheduler_procs[j])\n"
        "RuntimeError: Rank 2 scheduler died during initialization (exit code: -9). If exit "
        "code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i "
        "oom` to check.\n"
    )

    (report,) = scan_text(text)

    assert report.signature == "scheduler-died-init"
    assert "rank 2" in report.hint
    assert "SIGKILL" in report.hint
    assert "dmesg" in report.hint


def test_chained_traceback_reports_the_final_exception() -> None:
    text = read_log("chained_tokenizer_load.log")

    (report,) = scan_text(text)

    assert report.exception == "RuntimeError"
    assert report.message.startswith("Failed to load the tokenizer.")
    assert report.file == f"{SP}/sglang/srt/utils/hf_transformers/tokenizer.py"
    assert (report.line, report.function) == (208, "_auto_tokenizer_from_pretrained")
    assert report.signature == "trust-remote-code"
    # The crash starts where its first traceback starts.
    assert report.log_line == line_number_of(text, "Traceback (most recent call last):")


def test_too_many_values_to_unpack_is_an_api_mismatch() -> None:
    text = read_log("too_many_values_to_unpack.log")

    (report,) = scan_text(text)

    assert report.signature == "api-mismatch-unpack"
    assert report.message == "too many values to unpack (expected 2)"
    assert report.ranks == ("TP0", "TP1")
    assert "patch" in report.hint and "SGLang version" in report.hint


def test_unknown_exception_falls_back() -> None:
    (report,) = scan_text(scheduler_traceback("TP0", "frobnicator exploded", "KeyError"))

    assert report.signature == "unknown-exception"
    assert report.exception == "KeyError"


# --- no false positives --------------------------------------------------------------------


def test_healthy_log_with_ready_line_has_no_crash() -> None:
    text = read_log("healthy_ready.log")

    assert "The server is fired up and ready to roll!" in text
    assert scan_text(text) == []


def test_warnings_about_errors_and_exceptions_are_not_crashes() -> None:
    text = read_log("healthy_warnings.log")

    assert "error handling is deprecated" in text
    assert "Exception handling enabled" in text
    assert "max_retries on error" in text
    assert scan_text(text) == []


def test_exception_ignored_at_shutdown_is_not_a_crash() -> None:
    text = (
        "Exception ignored in: <function ZmqSocket.__del__ at 0x7f3c2b9e1d80>\n"
        "Traceback (most recent call last):\n"
        f'  File "{SP}/zmq/sugar/socket.py", line 185, in __del__\n'
        "    self.close()\n"
        "RuntimeError: Event loop is closed\n"
    )

    assert scan_text(text) == []


def test_sigquit_after_an_exception_ignored_at_shutdown_is_reported() -> None:
    ignored = (
        "Exception ignored in: <function ZmqSocket.__del__ at 0x7f3c2b9e1d80>\n"
        "Traceback (most recent call last):\n"
        f'  File "{SP}/zmq/sugar/socket.py", line 185, in __del__\n'
        "    self.close()\n"
        "RuntimeError: Event loop is closed\n"
    )

    assert [(r.signature, r.log_line) for r in scan_text(ignored + SIGQUIT)] == [
        ("child-failed", 6)
    ]


def test_a_consequence_printed_while_a_traceback_is_still_open_defers_to_it() -> None:
    # TP0's traceback is half written when TP1's death is logged: the death is a consequence.
    tb = scheduler_traceback("TP0", SHAPE.format(a=160, b=2)).splitlines(keepends=True)
    died = "[2026-11-29 10:12:33 TP1] Rank 1 scheduler died during initialization\n"
    text = "".join([*tb[:3], died, *tb[3:]])

    assert [r.signature for r in scan_text(text)] == ["tensor-shape-mismatch"]
    assert [r.signature for r in scan_text(died)] == ["scheduler-died-init"]


def test_a_consequence_counts_again_once_a_chained_crash_is_taken_back() -> None:
    # The catalog knows the inner exception only; the chained one that replaces it is
    # unknown, so no crash stands and the parent's sigquit is the crash to report.
    known = Signature(id="inner", title="Inner", hint="h", exception=re.compile("^KeyError$"))
    inner = scheduler_traceback("TP0", "'x'", exception="KeyError").rstrip("\n")
    outer = scheduler_traceback("", "boom", exception="OSError").split("\n", 1)[1]
    chained = (
        inner + "\n\nDuring handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n" + outer
    )

    catalog = Catalog([known, CHILD])
    assert scan_text(inner + "\n", catalog)[0].signature == "inner"
    assert [(r.signature, r.log_line) for r in scan_text(chained + SIGQUIT, catalog)] == [
        ("child-failed", line_number_of(chained + SIGQUIT, "Received sigquit"))
    ]


def test_soft_watchdog_timeout_is_not_a_crash() -> None:
    text = (
        "[2026-11-29 10:40:00 TP0] Scheduler watchdog timeout "
        "(self.watchdog_timeout=30.0, self.soft=True)\n"
    )

    assert scan_text(text) == []


# --- log forms -----------------------------------------------------------------------------


def test_rank_prefixes_with_dp_tp_milliseconds_and_no_rank() -> None:
    text = (
        scheduler_traceback("DP1 TP3", SHAPE.format(a=160, b=2))
        + scheduler_traceback("DP0 TP10", SHAPE.format(a=160, b=2))
        + scheduler_traceback("DP0 TP2", SHAPE.format(a=160, b=2)).replace(":33 DP0", ":33.412 DP0")
        + scheduler_traceback("", SHAPE.format(a=160, b=2))
    )

    (report,) = scan_text(text)

    # Ranks sort by number, not by text; the unprefixed copy adds no rank.
    assert report.ranks == ("DP0 TP2", "DP0 TP10", "DP1 TP3")


def test_traceback_lines_from_two_ranks_interleaved_line_by_line() -> None:
    one = scheduler_traceback("TP0", SHAPE.format(a=160, b=2)).splitlines()
    two = scheduler_traceback("TP1", SHAPE.format(a=160, b=2)).splitlines()
    mixed = [one[0], two[0]]
    for a, b in zip(one[1:], two[1:], strict=True):
        mixed += [a, b]

    (report,) = scan_text("\n".join(mixed) + "\n")

    assert report.ranks == ("TP0", "TP1")
    assert (report.line, report.function) == (402, "forward")


def test_different_crashes_on_different_ranks_are_separate_reports() -> None:
    text = scheduler_traceback("TP0", SHAPE.format(a=160, b=2)) + scheduler_traceback(
        "TP1", "too many values to unpack (expected 2)", "ValueError"
    )

    reports = scan_text(text)

    assert [(r.signature, r.ranks) for r in reports] == [
        ("tensor-shape-mismatch", ("TP0",)),
        ("api-mismatch-unpack", ("TP1",)),
    ]


def test_abandoned_traceback_does_not_swallow_a_later_crash() -> None:
    text = (
        "[2026-11-29 10:12:30 TP0] Scheduler hit an exception: "
        "Traceback (most recent call last):\n"
        + "[2026-11-29 10:12:31 TP1] Decode batch, #running-req: 3, cuda graph: True\n" * 5
        + scheduler_traceback("TP1", SHAPE.format(a=160, b=2))
    )

    (report,) = scan_text(text)

    assert report.ranks == ("TP1",)
    assert report.log_line == 7


def test_scan_of_a_log_tail_ignores_orphan_traceback_lines() -> None:
    lines = read_log("tp8_spec_shape_mismatch.log").splitlines(keepends=True)
    tp0 = line_number_of("".join(lines), "TP0] Scheduler hit an exception")
    # Start in the middle of TP0's traceback, as a reader of the last few MB would.
    tail = lines[tp0 + 4 :]

    (report,) = scan_text("".join(tail))

    assert report.ranks == tuple(f"TP{r}" for r in range(1, 8))
    assert report.signature == "tensor-shape-mismatch"


def test_a_tail_holding_only_the_end_of_a_traceback_yields_nothing() -> None:
    text = (
        "    logits = logits[sample_indices] + bias\n"
        "             ~~~~~~~~~~~~~~~~~~~~~~~^~~~~~\n"
        f"RuntimeError: {SHAPE.format(a=160, b=2)}\n"
        "\n"
        "[2026-11-29 10:12:35 TP3] Decode batch, #running-req: 10, cuda graph: True\n"
    )

    assert scan_text(text) == []


def test_scan_lines_numbers_lines_from_start_line() -> None:
    lines = scheduler_traceback("TP0", SHAPE.format(a=160, b=2)).splitlines()

    (report,) = scan_lines(["[2026-11-29 10:12:00 TP0] Decode batch", *lines], start_line=1001)

    assert report.log_line == 1002


def test_scan_lines_accepts_lines_with_or_without_newlines() -> None:
    text = read_log("tp8_spec_shape_mismatch.log")

    assert scan_lines(text.splitlines()) == scan_text(text)
    assert scan_lines(text.splitlines(keepends=True)) == scan_text(text)


def test_scan_lines_with_mixed_line_endings_keeps_the_line_numbers() -> None:
    lines = scheduler_traceback("TP0", SHAPE.format(a=160, b=2)).splitlines(keepends=True)
    mixed = ["[2026-11-29 10:12:00 TP0] Decode batch\n", "second line", *lines]

    (report,) = scan_lines(mixed)

    assert report.log_line == 3
    assert report.line == 402


def test_scan_lines_uses_the_catalog_given() -> None:
    text = read_log("tp8_spec_shape_mismatch.log")

    assert scan_lines(text.splitlines(), Catalog([])) == []


def test_a_one_line_crash_without_prefix_takes_its_rank_from_the_text() -> None:
    text = (
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48213) ran "
        "for 600046 milliseconds before timing out.\n"
    )

    (report,) = scan_text(text)

    assert (report.signature, report.ranks) == ("nccl-timeout", ("rank3",))


def test_crash_ranks_are_listed_in_numeric_order() -> None:
    order = [7, 10, 0, 11, 3, 1, 9, 2, 8, 5, 4, 6]
    text = "".join(
        f"[rank{r}]:[E1129 10:22:41.5 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=48213) ran for 600046 milliseconds\n"
        for r in order
    )

    (report,) = scan_text(text)

    assert report.ranks == tuple(f"rank{r}" for r in range(12))


# --- follow mode ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_LOGS)
def test_feeding_byte_by_byte_gives_the_same_reports_as_scan_text(name: str) -> None:
    text = read_log(name)
    scanner = CrashScanner()

    emitted: list[CrashReport] = []
    for char in text:
        emitted += scanner.feed(char)
    emitted += scanner.finish()

    expected = scan_text(text)
    assert scanner.reports == expected
    key = [(r.signature, r.log_line, r.message) for r in expected]
    got = [(r.signature, r.log_line, r.message) for r in emitted]
    if "During handling of the above exception" in text:
        # Follow mode cannot wait for a chain to go on: an inner exception of a chained
        # traceback may come first, at the log line where the final one starts.
        assert set(key) <= set(got)
        assert {line for _, line, _ in got} == {line for _, line, _ in key}
    else:
        # Each crash is returned once, as soon as its first copy is complete.
        assert got == key


@pytest.mark.parametrize("seed", range(4))
def test_feeding_random_chunks_gives_the_same_reports_as_scan_text(seed: int) -> None:
    rng = random.Random(seed)
    for name in ALL_LOGS:
        text = read_log(name)
        scanner = CrashScanner()
        pos = 0
        while pos < len(text):
            size = rng.choice([1, 2, 7, 64, 333, 4096])
            scanner.feed(text[pos : pos + size])
            pos += size
        scanner.finish()

        assert scanner.reports == scan_text(text), name


def test_feed_returns_a_crash_as_soon_as_its_exception_line_arrives() -> None:
    scanner = CrashScanner()
    tp0 = scheduler_traceback("TP0", SHAPE.format(a=160, b=2))
    exception_line = tp0.splitlines(keepends=True)[-2]
    before, after = tp0.split(exception_line)

    assert scanner.feed(before) == []
    (report,) = scanner.feed(exception_line)
    assert report.ranks == ("TP0",)
    # The same crash from another rank is not returned again, but is merged.
    assert scanner.feed(after + scheduler_traceback("TP1", SHAPE.format(a=160, b=2))) == []
    assert scanner.finish() == []
    assert scanner.reports[0].ranks == ("TP0", "TP1")


def test_feed_buffers_a_partial_last_line() -> None:
    scanner = CrashScanner()
    line = "[2026-11-29 10:12:34] Received sigquit from a child process. It usually means"

    assert scanner.feed(line) == []
    assert scanner.feed(" the child failed.") == []
    (report,) = scanner.feed("\n")
    assert report.signature == "child-failed"


def test_finish_scans_an_unterminated_last_line() -> None:
    scanner = CrashScanner()
    scanner.feed("[2026-11-29 10:12:33 TP0] Scheduler watchdog timeout (self.soft=False)")

    (report,) = scanner.finish()

    assert report.signature == "scheduler-watchdog-timeout"


def test_chained_traceback_split_after_inner_exception_is_corrected_in_reports() -> None:
    text = read_log("chained_tokenizer_load.log")
    cut = text.index("\nDuring handling") + 1
    scanner = CrashScanner()

    early = scanner.feed(text[:cut])
    later = scanner.feed(text[cut:]) + scanner.finish()

    # Follow mode cannot wait: the inner exception is returned when it completes ...
    assert [r.exception for r in early] == ["KeyError"]
    # ... and the consolidated view keeps only the final one.
    assert [r.exception for r in later] == ["RuntimeError"]
    assert scanner.reports == scan_text(text)


def test_is_crash_line_marks_crash_lines_only() -> None:
    scanner = CrashScanner()
    crash = read_log("tp8_spec_shape_mismatch.log").splitlines()
    healthy = read_log("healthy_ready.log").splitlines()

    assert scanner.is_crash_line(next(x for x in crash if "Scheduler hit an exception" in x))
    assert scanner.is_crash_line(next(x for x in crash if x.startswith("RuntimeError:")))
    assert scanner.is_crash_line(next(x for x in crash if x.startswith('  File "')))
    assert scanner.is_crash_line("[2026-11-29 10:12:21] Received sigquit from a child process.")
    assert not any(scanner.is_crash_line(line) for line in healthy)
    assert not scanner.is_crash_line(
        "[2026-11-29 10:11:02] WARNING: Exception handling enabled for custom logit processors."
    )


@pytest.mark.parametrize(
    ("line", "crash"),
    [
        ("Traceback (most recent call last):\n", True),
        ("During handling of the above exception, another exception occurred:", True),
        ("The above exception was the direct cause of the following exception:", True),
        (
            "[2026-11-29 10:12:33 TP0] Scheduler hit an exception: Traceback (most recent call last): ",
            True,
        ),
        ("  what():  std::bad_alloc", True),
        ("ValueError: bad value", True),
        (
            "[rank3]:[E1129 10:22:41.5 ProcessGroupNCCL.cpp:632] Watchdog caught collective "
            "operation timeout",
            True,
        ),
        ("[rank3]:[W1129 10:22:41.5 ProcessGroupNCCL.cpp:632] Warning: nothing wrong", False),
        ("[2026-11-29 10:12:33 TP0] Decode batch, #running-req: 10", False),
        ("ERROR: nothing to see", False),
        ("terminate called after throwing an instance of 'c10::Error'", True),
        ("ValueErrorX", False),
        ('  File "/x/scheduler.py", line 12, in run', True),
    ],
)
def test_is_crash_line_on_each_kind_of_line(line: str, crash: bool) -> None:
    assert CrashScanner().is_crash_line(line) is crash


def test_is_crash_line_applies_line_rules_to_the_message_after_the_prefix(
    tmp_path: Path,
) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text("- id: panic\n  title: P\n  line: '^kernel panic'\n  hint: h\n")
    scanner = CrashScanner(load_catalog([user]))

    assert scanner.is_crash_line("[2026-11-29 10:00:00] kernel panic now")
    assert not scanner.is_crash_line("[2026-11-29 10:00:00] no kernel panic")


@pytest.mark.parametrize(
    "line",
    [
        "kernel panic",
        "[2026-11-29 10:00:00] kernel panic",
        "[2026-11-29 10:00:00 TP1] kernel panic",
        "[rank2]:kernel panic",
        "kernel panic   ",
        "kernel panicX",
        "no kernel panic",
        "[rank2]:no kernel panic",
    ],
)
def test_is_crash_line_agrees_with_the_scanner_on_one_line_rules(tmp_path: Path, line: str) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text("- id: panic\n  title: P\n  line: '^kernel panic$'\n  hint: h\n")
    catalog = load_catalog([user])

    assert CrashScanner(catalog).is_crash_line(line) is bool(scan_text(line + "\n", catalog))


# --- hardening -----------------------------------------------------------------------------


def test_empty_input_yields_nothing() -> None:
    assert scan_text("") == []
    assert scan_lines([]) == []
    assert CrashScanner().finish() == []
    assert CrashScanner().feed("") == []


def test_binary_garbage_does_not_raise() -> None:
    rng = random.Random(7)
    garbage = bytes(rng.randrange(256) for _ in range(200_000)).decode("utf-8", errors="replace")
    text = garbage + "\n" + scheduler_traceback("TP0", SHAPE.format(a=160, b=2)) + garbage

    reports = scan_text(text)

    assert [r.signature for r in reports] == ["tensor-shape-mismatch"]


def test_very_long_lines_are_capped_in_reports() -> None:
    huge = "x" * 1_000_000
    text = scheduler_traceback("TP0", f"boom {huge}") + huge + "\n"

    (report,) = scan_text(text)

    assert len(report.message) <= STORED_LINE_CAP
    assert report.message.startswith("boom x")


def test_a_huge_line_without_newline_fed_in_chunks_does_not_grow_memory() -> None:
    scanner = CrashScanner()
    for _ in range(200):
        scanner.feed("y" * 100_000)
    scanner.feed("\n[2026-11-29 10:12:34] Received sigquit from a child process.\n")

    assert [r.signature for r in scanner.reports] == ["child-failed"]
    assert scanner.reports[0].log_line == 2


def test_a_line_arriving_in_pieces_is_scanned_as_far_as_a_whole_one() -> None:
    died = "Rank 3 scheduler died during initialization"
    long_line = "y" * (65536 - len(died)) + died  # the message ends at the scanned prefix's end
    scanner = CrashScanner()
    scanner.feed("[2026-11-29 10:12:30] Load weight begin")  # a line held, then completed
    scanner.feed("\n" + long_line)
    scanner.feed("\n")

    assert [r.signature for r in scan_text("x\n" + long_line + "\n")] == ["scheduler-died-init"]
    assert scanner.reports == scan_text("x\n" + long_line + "\n")


def test_healthy_log_scans_fast() -> None:
    # A loose floor that catches a lost pre-filter or quadratic behaviour, not a benchmark.
    line = (
        "[2026-11-29 10:12:09 TP0] Decode batch, #running-req: 10, #token: 15300, token usage: "
        "0.01, cuda graph: True, gen throughput (token/s): 917.00, #queue-req: 0, \n"
    )
    text = line * 100_000 + read_log("healthy_warnings.log") * 20

    started = time.process_time()  # CPU time: a loaded machine stretches the wall time
    assert scan_text(text) == []
    elapsed = time.process_time() - started

    rate = len(text) / 1e6 / elapsed
    assert rate > 10, f"scanned {rate:.1f} MB per CPU-s ({elapsed:.2f} CPU-s), bound 10"


# --- catalog -------------------------------------------------------------------------------


def test_shipped_catalog_ends_with_the_fallback() -> None:
    ids = [s.id for s in load_catalog().signatures]

    assert ids[-1] == "unknown-exception"
    assert len(ids) == len(set(ids))
    for required in (
        "tensor-shape-mismatch",
        "api-mismatch-unpack",
        "sglang-syntax-error",
        "sglang-import-error",
        "cuda-oom",
        "not-enough-memory",
        "cuda-graph-capture-failed",
        "nccl-timeout",
        "nccl-error",
        "port-in-use",
        "scheduler-watchdog-timeout",
        "scheduler-died-init",
        "subprocess-crashed",
    ):
        assert required in ids


def test_user_catalog_comes_before_the_shipped_one(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "signatures:\n"
        "  - id: our-logits-bug\n"
        "    title: Known logits bug\n"
        "    message: 'tensor a \\((?P<a>\\d+)\\)'\n"
        "    file: 'logits_processor\\.py$'\n"
        "    hint: 'Tensor a was {a}: upgrade to our build 2026.11.3 ({function}).'\n",
        encoding="utf-8",
    )
    catalog = load_catalog([user])

    (report,) = scan_text(read_log("tp8_spec_shape_mismatch.log"), catalog)

    assert catalog.signatures[0].id == "our-logits-bug"
    assert report.signature == "our-logits-bug"
    assert report.hint == "Tensor a was 160: upgrade to our build 2026.11.3 (forward)."
    # Other crashes still meet the shipped signatures.
    assert scan_text(read_log("port_in_use.log"), catalog)[0].signature == "port-in-use"


def test_hints_can_name_the_exception_message_and_frame(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "- id: any\n  title: Any\n  exception: Error\n  line: 'Received sigquit'\n"
        "  hint: '{exception}|{message}|{file}|{line}|{function}'\n",
        encoding="utf-8",
    )
    catalog = load_catalog([user])

    (traceback,) = scan_text(scheduler_traceback("TP0", "boom"), catalog)
    (one_line,) = scan_text(SIGQUIT, catalog)

    assert (
        traceback.hint
        == f"RuntimeError|boom|{SP}/sglang/srt/layers/logits_processor.py|402|forward"
    )
    assert (
        one_line.hint
        == "|Received sigquit from a child process. It usually means the child failed.|?|?|?"
    )


def test_user_catalog_line_rule_finds_new_one_line_crashes(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "- id: xid-error\n"
        "  title: GPU Xid error\n"
        "  line: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-f:.]+)\\): (?P<xid>\\d+)'\n"
        "  hint: 'GPU {pci} reported Xid {xid}: drain the host.'\n",
        encoding="utf-8",
    )
    text = "[2026-11-29 10:12:33] NVRM: Xid (PCI:0000:18:00): 79, pid=48200, GPU has fallen off\n"

    (report,) = scan_text(text, load_catalog([user]))

    assert report.hint == "GPU 0000:18:00 reported Xid 79: drain the host."


def catalog_error(user: Path, content: str) -> CatalogError:
    """The error loading a user catalog of this content raises."""
    user.write_text(content, encoding="utf-8")
    with pytest.raises(CatalogError) as caught:
        load_catalog([user])
    return caught.value


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("signatures: [\n", "invalid YAML"),
        ("- id: a\n  title: t\n  hint: h\n  message: '(unclosed'\n", "not a valid regex"),
        ("- id: a\n  title: t\n  message: x\n", "'hint' must be a non-empty string"),
        ("- id: a\n  title: t\n  hint: h\n  mesage: x\n", "unknown key 'mesage'"),
        ("- id: a\n  title: t\n  hint: h\n", "has no match rule"),
        ("- id: a\n  title: t\n  hint: 'see {0}'\n  message: x\n", "must be a plain name"),
        ("- id: a\n  title: t\n  hint: 'unbalanced {'\n  message: x\n", "bad hint template"),
        ("- id: a\n  title: t\n  hint: h\n  explain: magic\n  message: x\n", "unknown explain"),
        (
            "- id: a\n  title: t\n  hint: h\n  message: x\n- id: a\n  title: t\n  hint: h\n"
            "  message: y\n",
            "defined twice",
        ),
        ("just a string\n", "expected a list of signatures"),
        ("version: 2\nsignatures: []\n", "unsupported catalog version 2"),
        ("context:\n  n: 'no value group'\n", "(?P<value>"),
    ],
)
def test_malformed_user_catalog_raises_one_line_error_naming_the_file(
    tmp_path: Path, content: str, complaint: str
) -> None:
    user = tmp_path / "signatures.yml"
    error = catalog_error(user, content)
    message = str(error)
    assert isinstance(error, ValueError)
    assert message.startswith(f"{user}: ")
    assert complaint in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "signatures: [\n",
            "invalid YAML at line 2: expected the node content, but found '<stream end>'",
        ),
        ("\t- x\n", "invalid YAML at line 1: found character '\\t' that cannot start any token"),
        ("a: \x07\n", "invalid YAML: syntax error"),
        (
            "version: 1\nsignatures: []\nextra: 1\nalso: 2\n",
            "unknown top-level key 'also' (expected signatures, context)",
        ),
        ("- just text\n", "signature #1 must be a mapping"),
        ("42\n", "expected a list of signatures or a mapping with 'signatures'"),
        ("- title: t\n  hint: h\n  message: x\n", "signature #1 needs an 'id' without spaces"),
        (
            "- id: ''\n  title: t\n  hint: h\n  message: x\n",
            "signature #1 needs an 'id' without spaces",
        ),
        ("signatures: {a: 1}\n", "'signatures' must be a list"),
        ("context: [1]\n", "'context' must be a mapping of name to regex"),
        ("context:\n  1bad: '(?P<value>x)'\n", "context name '1bad' must be an identifier"),
        ("context:\n  n: ''\n", "context 'n' must be a non-empty regex string"),
        ("context:\n  n: 'no value group'\n", "context 'n': the regex needs a (?P<value>…) group"),
        (
            "- id: 'a b'\n  title: t\n  hint: h\n  message: x\n",
            "signature #1 needs an 'id' without spaces",
        ),
        (
            "- id: '  '\n  title: t\n  hint: h\n  message: x\n",
            "signature #1 needs an 'id' without spaces",
        ),
        ("- id: a\n  title: t\n  hint: h\n  message: x\n- 7\n", "signature #2 must be a mapping"),
        (
            "- id: a\n  title: t\n  hint: h\n  message: ''\n",
            "signature 'a' 'message' must be a non-empty regex string",
        ),
        (
            "- id: a\n  title: t\n  hint: h\n  message: 5\n",
            "signature 'a' 'message' must be a non-empty regex string",
        ),
        (
            "- id: a\n  title: t\n  hint: h\n  message: x\n  secondary: 'yes'\n",
            "signature 'a': 'secondary' must be true or false",
        ),
        (
            "- id: a\n  title: t\n  hint: h\n  explain: magic\n  message: x\n",
            "signature 'a': unknown explain 'magic' (known: exit-code, tensor-sizes)",
        ),
        (
            "- id: a\n  title: t\n  hint: 'see {{this}} and {0}'\n  message: x\n",
            "signature 'a': hint field {0} must be a plain name",
        ),
        (
            "- id: a\n  title: t\n  hint: 'see {x:{y}}'\n  message: x\n",
            "signature 'a': hint field {x} must be a plain name",
        ),
    ],
)
def test_malformed_user_catalog_says_exactly_what_is_wrong(
    tmp_path: Path, content: str, message: str
) -> None:
    user = tmp_path / "signatures.yml"
    assert str(catalog_error(user, content)) == f"{user}: {message}"


def test_user_signature_rules_each_narrow_the_match(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "- id: elsewhere\n  title: Elsewhere\n  exception: RuntimeError\n"
        "  file: 'nowhere\\.py$'\n  hint: h\n"
        "- id: other-exception\n  title: Other\n  exception: KeyError\n  hint: h\n"
        "- id: ours\n  title: Our logits bug\n  exception: RuntimeError\n"
        "  file: 'logits_processor\\.py$'\n  hint: 'rank width {rank:>3}'\n",
        encoding="utf-8",
    )
    catalog = load_catalog([user])

    (report,) = scan_text(scheduler_traceback("TP0", "boom"), catalog)

    assert (report.signature, report.title, report.hint) == (
        "ours",
        "Our logits bug",
        "rank width   ?",
    )


def test_user_signature_explains_an_exit_code(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "- id: worker-died\n  title: Worker died\n"
        "  line: 'worker exited with code (?P<code>-?\\d+)'\n"
        "  explain: exit-code\n  hint: 'The worker died: {signal}.'\n",
        encoding="utf-8",
    )

    (report,) = scan_text(
        "[2026-11-29 10:12:33] worker exited with code -9\n", load_catalog([user])
    )

    assert report.hint == "The worker died: exit code -9 = killed by SIGKILL."


@pytest.mark.parametrize(
    ("secondary", "found"), [("true", ["our-crash"]), ("false", ["our-crash", "our-echo"])]
)
def test_user_secondary_signature_defers_to_a_crash_already_found(
    tmp_path: Path, secondary: str, found: list[str]
) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "- id: our-crash\n  title: Crash\n  line: 'engine fell over'\n  hint: h\n"
        f"- id: our-echo\n  title: Echo\n  line: 'watcher saw the engine go'\n  hint: h\n"
        f"  secondary: {secondary}\n",
        encoding="utf-8",
    )
    text = (
        "[2026-11-29 10:12:33] engine fell over\n[2026-11-29 10:12:34] watcher saw the engine go\n"
    )

    assert [r.signature for r in scan_text(text, load_catalog([user]))] == found


def test_a_user_signature_is_not_secondary_unless_it_says_so(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text("- id: ours\n  title: Ours\n  line: 'engine fell over'\n  hint: h\n")

    (signature,) = load_catalog([user]).signatures[:1]

    assert signature.secondary is False


def test_the_shipped_catalog_reads_the_draft_token_count_from_the_server_args() -> None:
    catalog = load_catalog()  # a fresh load, not the cached default catalog

    (report,) = scan_text(read_log("tp8_spec_shape_mismatch.log"), catalog)

    assert "(the server args set 16 draft tokens)" in report.hint


def test_every_shipped_line_rule_is_prefiltered_by_a_literal() -> None:
    # Literals are searched at str.find speed; a regex trigger would scan every line slowly.
    assert all(isinstance(trigger, str) for trigger in load_catalog().triggers)


def test_a_line_rule_without_a_literal_finds_its_line_in_the_middle_of_a_log(
    tmp_path: Path,
) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(r"- id: xi-lost" "\n  title: Xi\n  line: '^Xi\\d+ (?:lost|gone)$'\n  hint: h\n")
    text = "[2026-11-29 10:00:00] ok\n[2026-11-29 10:00:01] Xi79 lost\n[2026-11-29 10:00:02] ok\n"

    (report,) = scan_text(text, load_catalog([user]))

    assert (report.signature, report.log_line) == ("xi-lost", 2)


def test_missing_user_catalog_raises_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog([tmp_path / "nope.yml"])


def test_catalog_without_a_matching_signature_reports_nothing() -> None:
    empty = Catalog([])

    assert scan_text(read_log("tp8_spec_shape_mismatch.log"), empty) == []


# --- reports -------------------------------------------------------------------------------


def test_report_to_json_and_summary() -> None:
    (report,) = scan_text(read_log("tp8_spec_shape_mismatch.log"))

    data = report.to_json()

    assert list(data) == [
        "exception",
        "message",
        "file",
        "line",
        "function",
        "ranks",
        "signature",
        "title",
        "hint",
        "log_line",
    ]
    assert data["ranks"] == [f"TP{r}" for r in range(8)]
    assert report.summary() == ("Tensor shape mismatch: RuntimeError: " + SHAPE.format(a=160, b=2))


def test_summary_shortens_long_messages_to_one_line() -> None:
    (report,) = scan_text(scheduler_traceback("TP0", "boom " + "z" * 500))

    summary = report.summary()

    assert "\n" not in summary
    assert len(summary) < 250
    assert summary.endswith("…")


def test_summary_keeps_a_160_character_message_whole() -> None:
    (whole,) = scan_text(scheduler_traceback("TP0", "m" * 160))
    (cut,) = scan_text(scheduler_traceback("TP0", "m" * 161))

    assert whole.summary().endswith(": " + "m" * 160)
    assert cut.summary().endswith(": " + "m" * 159 + "…")


# --- the pre-filter ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "sample"),
    [
        (
            r"Scheduler watchdog timeout(?! \([^)]*self\.soft=True)",
            "TP0] Scheduler watchdog timeout",
        ),
        (r"Rank (?P<rank>\d+) scheduler died during init", "Rank 3 scheduler died during init"),
        (r"\[Errno 98\]", "ERROR: [Errno 98] bind"),
        (r"colou?r failure", "color failure"),
        (r"NCCL error in:|ncclSystemError", "x ncclSystemError y"),
        (r"a{2,3}bbbb", "aabbbb"),
    ],
)
def test_literal_anchors_are_found_in_every_match(pattern: str, sample: str) -> None:
    anchors = _literal_anchors(pattern)

    assert re.search(pattern, sample)
    assert anchors is not None
    assert any(anchor in sample for anchor in anchors)


@pytest.mark.parametrize(
    ("pattern", "anchors", "samples"),
    [
        (
            r"\[Errno 98\] error while attempting to bind",
            ["[Errno 98] error while attempting to bind"],
            ["ERROR:    [Errno 98] error while attempting to bind on address"],
        ),
        (r"Errno \d+: bind failed", [": bind failed"], ["Errno 98: bind failed"]),
        (
            r"Scheduler ((?:TP|DP)\d+ )?died in init",
            ["died in init"],
            ["Scheduler died in init", "Scheduler TP3 died in init"],
        ),
        (r"(a)bcdef", ["bcdef"], ["abcdef"]),
        (r"abc|defg", ["abc", "defg"], ["xabcx", "xdefgx"]),
        (
            r"NCCL error in:|ncclSystemError",
            ["NCCL error in:", "ncclSystemError"],
            ["NCCL error in: ../init.cc", "ncclSystemError: x"],
        ),
        (r"NVRM: Xid \(PCI:", ["NVRM: Xid (PCI:"], ["NVRM: Xid (PCI:0000:18:00): 79"]),
        (r'{"error": "boom"}', ['{"error": "boom"}'], ['reply {"error": "boom"}']),
        (r'x{"error": "boom"}', ['x{"error": "boom"}'], ['x{"error": "boom"}']),
        (r"[a]] tail", ["] tail"], ["a] tail"]),
        (r"[]] tail", [" tail"], ["] tail"]),
        (r"colou?r failure", ["r failure"], ["color failure", "colour failure"]),
        (r"[0-9a-f]+ Xid error", [" Xid error"], ["0a Xid error"]),
        (r"[]x] after class", [" after class"], ["] after class", "x after class"]),
        (r"[^]x] after class", [" after class"], ["a after class"]),
        (r"[\]x] after class", [" after class"], ["] after class"]),
        (r"[abc]def", ["def"], ["bdef"]),
        (r"^Fatal: .* exit$", ["Fatal: "], ["Fatal: it did exit"]),
        (r"x*yz+abcd", ["abcd"], ["yzzabcd"]),
        (r"ab{2}cdefg", ["cdefg"], ["abbcdefg"]),
        (r"ab{,3}cdefg", ["cdefg"], ["acdefg"]),
        (r"(?s)kernel panic", ["kernel panic"], ["kernel panic"]),
    ],
)
def test_literal_anchors_are_the_longest_literal_every_match_needs(
    pattern: str, anchors: list[str], samples: list[str]
) -> None:
    # Exact anchors: a shorter one costs speed; a wrong one (a literal some match lacks)
    # makes the scanner skip that crash line.
    assert _literal_anchors(pattern) == anchors
    for sample in samples:
        assert re.search(pattern, sample), sample
        assert any(anchor in sample for anchor in anchors), sample


@pytest.mark.parametrize(
    "pattern",
    [r"(?i)nccl error", r"(?x)nccl error", r"a|\d+", r"[abc]+x", r"(unclosed", r"abcd|\d+"],
)
def test_literal_anchors_give_up_when_no_literal_is_certain(pattern: str) -> None:
    assert _literal_anchors(pattern) is None


def test_line_rule_without_a_literal_still_finds_its_lines(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "- id: shouty\n  title: Shouty\n  line: '(?i)^kernel panic'\n  hint: h\n",
        encoding="utf-8",
    )

    (report,) = scan_text("ok\n[2026-11-29 10:00:00] KERNEL PANIC now\n", load_catalog([user]))

    assert (report.signature, report.log_line) == ("shouty", 2)


@pytest.mark.parametrize(
    ("fields", "sizes"),
    [
        ({}, "The two tensors have different sizes."),
        ({"a": "x", "b": "2"}, "The two tensors have different sizes."),
        (
            {"a": "7", "b": "3"},
            "Tensor a has size 7 where tensor b has 3. The sizes are not multiples of each other.",
        ),
        (
            {"a": "128", "b": "2"},
            "Tensor a has size 128 where tensor b has 2 (ratio a/b = 64). 128 = 2 × 64: if 2 is "
            "the batch and 64 the number of draft tokens, speculative shapes reached a "
            "non-speculative step.",
        ),
        (
            # No batch of one read in: the size equals the draft-token count.
            {"a": "16", "b": "2", "draft_tokens": "16"},
            "Tensor a has size 16 where tensor b has 2 (ratio a/b = 8). 16 = 2 × 8: if 2 is the "
            "batch and 8 the number of draft tokens, speculative shapes reached a "
            "non-speculative step.",
        ),
        ({"a": "2", "b": "260"}, "Tensor b has size 260 where tensor a has 2 (ratio b/a = 130)."),
    ],
)
def test_the_tensor_sizes_explanation(fields: dict[str, str], sizes: str) -> None:
    from deployctl.crash.catalog import _explain_tensor_sizes

    assert _explain_tensor_sizes(fields) == {"sizes": sizes}


@pytest.mark.parametrize(
    ("code", "signal"),
    [
        (None, "exit code unknown"),
        ("x", "exit code unknown"),
        ("-9", "exit code -9 = killed by SIGKILL"),
        ("-99", "exit code -99 = killed by signal 99"),
        ("0", "exit code 0"),
        ("1", "exit code 1"),
    ],
)
def test_the_exit_code_explanation(code: str | None, signal: str) -> None:
    from deployctl.crash.catalog import _explain_exit_code

    assert _explain_exit_code({} if code is None else {"code": code}) == {"signal": signal}


@pytest.mark.parametrize(
    ("a", "b", "draft", "claims"),
    [
        ("160", "2", "16", "160 = 10 \u00d7 16 (batch \u00d7 draft tokens)"),
        ("161", "10", "16", None),  # 161 is no multiple of 16: no batch-times-draft claim
        ("48", "3", "16", "48 = 3 \u00d7 16 (batch \u00d7 draft tokens)"),
        ("8", "4", "2", "8 = 4 \u00d7 2 (batch \u00d7 draft tokens)"),
        ("160", "2", "1", None),  # one draft token is no speculation
    ],
)
def test_the_draft_token_hint_is_claimed_only_for_an_exact_product(
    a: str, b: str, draft: str, claims: str | None
) -> None:
    from deployctl.crash.catalog import _explain_tensor_sizes

    text = _explain_tensor_sizes({"a": a, "b": b, "draft_tokens": draft})["sizes"]
    if claims is None:
        assert "draft tokens" not in text and f"{a} = " not in text, text
    else:
        assert claims in text, text


@pytest.mark.parametrize("quiet_lines", [None, 0, 300])
def test_a_chained_traceback_cut_off_after_its_separator_keeps_the_first_exception(
    quiet_lines: int | None,
) -> None:
    log = (
        scheduler_traceback("TP2", "boom")
        + "During handling of the above exception, another exception occurred:\n\n"
    )
    if quiet_lines is not None:  # None: the log ends there, and only finish() can tell
        log += "ordinary line\n" * quiet_lines
        log += "Received sigquit from a child process. It usually means the child failed.\n"
    found = scan_text(log, load_catalog())
    assert [(r.exception, r.message) for r in found][:1] == [("RuntimeError", "boom")]
    assert "TP2" in found[0].ranks


def test_a_chained_exception_that_arrives_still_replaces_the_first() -> None:
    log = (
        scheduler_traceback("", "first")
        + "During handling of the above exception, another exception occurred:\n\n"
        + "Traceback (most recent call last):\n"
        + f'  File "{SP}/sglang/srt/managers/scheduler.py", line 9, in run\n'
        + "    again()\n"
        + "ValueError: second\n"
    )
    assert [(r.exception, r.message) for r in scan_text(log, load_catalog())] == [
        ("ValueError", "second")
    ]


# --- the human lines of a report -------------------------------------------------------------


def report_of(**fields: object) -> CrashReport:
    base: dict[str, object] = {
        "exception": "RuntimeError",
        "message": "boom",
        "file": "/x/scheduler.py",
        "line": 12,
        "function": "run",
        "ranks": ("TP0", "TP1", "TP2"),
        "log_line": 40,
        "signature": "sig-id",
        "title": "Some crash",
        "hint": "Do\n  this.",
    }
    base.update(fields)
    return CrashReport(**base)  # type: ignore[arg-type]


def test_crash_lines_give_title_exception_frame_ranks_line_and_hint() -> None:
    assert crash_lines(report_of()) == [
        "crash: Some crash [sig-id]",
        "  RuntimeError: boom",
        "  at /x/scheduler.py:12 in run",
        "  ranks: TP0-TP2 (3)",
        "  log line 40",
        "  hint: Do this.",
    ]


def test_crash_lines_of_a_one_line_crash_in_a_scanned_tail() -> None:
    report = report_of(exception="", file=None, line=None, function=None, ranks=())

    assert crash_lines(report, whole_log=False) == [
        "crash: Some crash [sig-id]",
        "  boom",
        "  line 40 of the scanned tail",
        "  hint: Do this.",
    ]


def test_crash_lines_show_a_frame_without_line_or_function() -> None:
    (_, _, where, *_) = crash_lines(report_of(line=None, function=None))
    (_, _, at_line, *_) = crash_lines(report_of(line=0, function=None))

    assert where == "  at /x/scheduler.py"
    assert at_line == "  at /x/scheduler.py:0"


def test_crash_lines_put_a_long_message_on_one_capped_line() -> None:
    kept = crash_lines(report_of(message="a\n b " + "m" * 496))[1]  # 500 characters once joined
    cut = crash_lines(report_of(message="m" * 501))[1]

    assert kept == "  RuntimeError: a b " + "m" * 496
    assert cut == "  RuntimeError: " + "m" * 499 + "…"


@pytest.mark.parametrize(
    ("ranks", "shown"),
    [
        (("TP0",), "TP0"),
        (("TP0", "TP1"), "TP0, TP1 (2)"),
        (("TP0", "TP1", "TP2"), "TP0-TP2 (3)"),
        (("TP3", "TP4", "TP5", "TP6"), "TP3-TP6 (4)"),
        (("TP0", "TP1", "TP3"), "TP0, TP1, TP3 (3)"),
        (("TP0", "TP2", "TP3"), "TP0, TP2, TP3 (3)"),
        (("TP0", "TP1", "TP1"), "TP0, TP1, TP1 (3)"),
        (("TP0", "TP1", "DP2"), "TP0, TP1, DP2 (3)"),
        (("TP", "TP1", "TP2"), "TP, TP1, TP2 (3)"),
        (("TP1", "TP", "TP2"), "TP1, TP, TP2 (3)"),
        (("DP1 TP0", "DP1 TP1", "DP1 TP2"), "DP1 TP0-DP1 TP2 (3)"),
        (("rank8", "rank9", "rank10"), "rank8-rank10 (3)"),
    ],
)
def test_format_ranks_shortens_only_a_consecutive_run_of_one_kind(
    ranks: tuple[str, ...], shown: str
) -> None:
    assert format_ranks(ranks) == shown


def test_user_catalog_context_values_reach_the_hints(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text(
        "context:\n"
        "  build: 'our build (?P<value>\\S+)'\n"
        "signatures:\n"
        "  - id: boom\n"
        "    title: Boom\n"
        "    message: boom\n"
        "    hint: 'Seen on build {build}.'\n",
        encoding="utf-8",
    )
    text = "[2026-11-29 10:00:00] our build 2026.11.3 starting\n" + scheduler_traceback("", "boom")

    (report,) = scan_text(text, load_catalog([user]))

    assert report.hint == "Seen on build 2026.11.3."


def test_each_signature_records_the_catalog_file_it_came_from(tmp_path: Path) -> None:
    user = tmp_path / "signatures.yml"
    user.write_text("- id: mine\n  title: T\n  message: x\n  hint: h\n", encoding="utf-8")

    catalog = load_catalog([user])

    assert catalog.signatures[0].source == str(user)
    assert {s.source for s in catalog.signatures[1:]} == {str(SHIPPED_CATALOG)}


# --- what belongs to a traceback -----------------------------------------------------------

WATCHDOG = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) ran for 600000 ms"
HEAD = (
    "[2026-11-29 10:12:33 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    f'  File "{SP}/sglang/srt/managers/scheduler.py", line 6368, in run_scheduler_process\n'
    "    scheduler.run_event_loop()\n"
)


def test_the_lines_of_a_multi_line_exception_message_are_part_of_it() -> None:
    text = (
        HEAD
        + "RuntimeError: worker failed:\n"
        + WATCHDOG
        + "\n"
        + "  while waiting for rank 3\n"
        + "Hint: retry with a longer timeout\n"
        + WATCHDOG
        + "\n\n[2026-11-29 10:12:34] INFO: shutting down\n"
    )

    (report,) = scan_text(text)

    assert (report.exception, report.message) == ("RuntimeError", "worker failed:")


def test_a_one_line_crash_after_an_exception_message_has_ended_is_its_own() -> None:
    (first, second) = scan_text(HEAD + "RuntimeError: worker failed\n\n" + WATCHDOG + "\n")

    assert (first.exception, second.signature) == ("RuntimeError", "nccl-timeout")


def test_a_one_line_crash_printed_inside_an_open_traceback_is_still_reported() -> None:
    text = HEAD + WATCHDOG + "\nRuntimeError: boom\n"

    assert sorted(r.signature for r in scan_text(text)) == ["nccl-timeout", "unknown-exception"]


def test_an_exception_without_a_message_reports_an_empty_message() -> None:
    (report,) = scan_text(HEAD + "KeyboardInterrupt\n")

    assert (report.exception, report.message) == ("KeyboardInterrupt", "")


def test_a_dotted_logger_level_line_is_not_the_exception_of_an_open_traceback() -> None:
    (report,) = scan_text(HEAD + "deep_gemm.jit.WARNING: cache miss\nRuntimeError: boom\n")

    assert (report.exception, report.message) == ("RuntimeError", "boom")


def test_terminate_called_after_throwing_is_a_crash_line_without_any_catalog() -> None:
    line = "terminate called after throwing an instance of 'c10::Error'"

    assert CrashScanner(Catalog([])).is_crash_line(line)


def test_a_torch_rank_line_crash_names_its_rank() -> None:
    (report,) = scan_text(f"[rank3]:[E1129 10:22:41.5 ProcessGroupNCCL.cpp:632] {WATCHDOG}\n")

    assert (report.signature, report.ranks) == ("nccl-timeout", ("rank3",))


def test_a_scheduler_traceback_header_with_trailing_spaces_opens_a_traceback() -> None:
    text = HEAD.replace("call last):\n", "call last):   \n", 1) + "RuntimeError: boom\n"

    (report,) = scan_text(text)

    assert (report.exception, report.ranks) == ("RuntimeError", ("TP0",))


def test_a_traceback_may_pause_longer_than_a_chain_may_wait() -> None:
    noise = "[2026-11-29 10:12:34] INFO: still here\n" * 300
    paused = HEAD + noise + "RuntimeError: boom\n"
    late_chain = (
        HEAD
        + "KeyError: 'a'\n"
        + noise
        + "During handling of the above exception, another exception occurred:\n"
        + HEAD.split("\n", 1)[1].join(["Traceback (most recent call last):\n", ""])
        + "RuntimeError: boom\n"
    )

    assert [r.exception for r in scan_text(paused)] == ["RuntimeError"]
    assert [r.exception for r in scan_text(late_chain)] == ["KeyError", "RuntimeError"]


# --- gaps a mutation run found (benchmarks/mutation.py crash) --------------------------------


def filler(count: int) -> str:
    return "".join(
        f"[2026-11-29 10:13:00 TP0] Decode batch, #running-req: {n}\n" for n in range(count)
    )


def test_windows_line_endings_read_like_unix_ones() -> None:
    text = scheduler_traceback("TP0", SHAPE.format(a=160, b=16))
    (unix,) = scan_text(text)
    (windows,) = scan_text(text.replace("\n", "\r\n"))
    assert windows == unix and windows.exception == "RuntimeError"


def test_a_line_overwritten_by_carriage_returns_reads_as_a_terminal_shows_it() -> None:
    message = SHAPE.format(a=160, b=16)
    text = scheduler_traceback("TP0", message).replace(
        "RuntimeError:", "Loading 10%\rLoading 80%\rRuntimeError:"
    )
    (report,) = scan_text(text)
    assert (report.exception, report.message) == ("RuntimeError", message)
    assert CrashScanner().is_crash_line("Loading 80%\r  what():  std::bad_alloc")


def test_a_traceback_quoted_indented_in_a_message_is_not_another_crash() -> None:
    text = (
        scheduler_traceback("", "remote worker failed, its traceback:").rstrip("\n") + "\n"
        " Traceback (most recent call last):\n"
        '   File "/srv/worker.py", line 2, in handle\n'
        '     x = table["k"]\n'
        "KeyError: 'k'\n"
    )
    reports = scan_text(text, Catalog([RUNTIME, KEYERROR]))
    assert [r.signature for r in reports] == ["runtime"]


def test_a_chain_cut_off_after_its_separator_is_reported_when_the_stream_ends() -> None:
    inner = scheduler_traceback("TP0", "'x'", exception="KeyError").rstrip("\n")
    scanner = CrashScanner(Catalog([KEYERROR]))
    assert scanner.feed(inner + "\n" + SEPARATOR) == []  # a chained exception may follow
    (report,) = scanner.finish()
    assert report.signature == "key" and scanner.reports == [report]


def test_an_unknown_exception_whose_chain_is_cut_off_is_no_crash() -> None:
    inner = scheduler_traceback("TP0", "odd", exception="LookupError").rstrip("\n")
    scanner = CrashScanner(Catalog([KEYERROR]))
    assert scanner.feed(inner + "\n" + SEPARATOR) == []
    assert scanner.finish() == [] and scanner.reports == []


@pytest.mark.parametrize(("gap", "chained"), [(200, True), (201, False)])
def test_a_chained_exception_continues_its_traceback_within_the_chain_window(
    gap: int, chained: bool
) -> None:
    from deployctl.crash.scanner import _CHAIN_WINDOW

    assert gap - _CHAIN_WINDOW in (0, 1)
    inner = scheduler_traceback("", "'x'", exception="KeyError").rstrip("\n")
    # The separator comes `gap` lines after the exception line; the chained one is unknown.
    text = inner + "\n" + filler(gap - 1) + SEPARATOR.lstrip("\n") + UNKNOWN
    found = [r.signature for r in scan_text(text, Catalog([KEYERROR]))]
    assert found == ([] if chained else ["key"])


def test_a_secondary_line_defers_to_every_crash_still_standing() -> None:
    """Known crashes stay counted through chains taken back, so a later consequence
    (a sigquit) is never reported as if it were the crash."""
    first = scheduler_traceback("", "'a'", exception="KeyError").rstrip("\n")
    second = scheduler_traceback("", "'b'", exception="KeyError").rstrip("\n")
    text = (
        first + "\n" + SEPARATOR  # first: taken back, for now
        + filler(150)
        + second + "\n"  # second stands
        + filler(60)  # the first's chain never came: it stands again
        + SEPARATOR.lstrip("\n") + UNKNOWN  # the second is replaced by an unknown one
        + SIGQUIT  # a consequence: deferred, the first still stands
    )  # fmt: skip
    assert [r.message for r in scan_text(text, Catalog([KEYERROR, CHILD]))] == ["'a'"]


def test_a_secondary_line_defers_to_a_line_crash_found_meanwhile() -> None:
    known = scheduler_traceback("", "'a'", exception="KeyError").rstrip("\n")
    fell = Signature(id="fell", title="Fell", hint="h", line=re.compile("engine fell over"))
    text = (
        known + "\n"
        + "[2026-11-29 10:12:34] engine fell over\n"
        + SEPARATOR.lstrip("\n") + UNKNOWN
        + SIGQUIT
    )  # fmt: skip
    assert [r.signature for r in scan_text(text, Catalog([KEYERROR, fell, CHILD]))] == ["fell"]


def test_a_line_without_newline_is_held_only_up_to_the_scan_cap() -> None:
    import tracemalloc

    from deployctl.crash.scanner import SCAN_LINE_CAP

    scanner = CrashScanner(Catalog([Signature(id="x", title="X", hint="h", line=re.compile("zz"))]))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(500):  # 5 MB of one unterminated line, read in distinct pieces
            scanner.feed("y" * 9_999 + str(n % 10))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 4 * SCAN_LINE_CAP
    assert scanner.feed("zz\n") == []  # beyond the cap: not read


def test_a_crash_at_the_very_end_of_a_capped_line_is_found() -> None:
    from deployctl.crash.scanner import SCAN_LINE_CAP

    catalog = Catalog(
        [Signature(id="fell", title="Fell", hint="h", line=re.compile("engine fell over$"))]
    )
    tail = "engine fell over"
    for extra, found in ((0, ["fell"]), (1, [])):
        scanner = CrashScanner(catalog)
        scanner.feed("x" * (SCAN_LINE_CAP - len(tail) + extra))
        assert [r.signature for r in scanner.feed(tail + "\n")] == found


@pytest.mark.heavy
def test_scan_lines_holds_a_batch_not_the_whole_log() -> None:
    import tracemalloc

    lines = (f"[2026-11-29 10:13:00 TP0] Decode batch, #running-req: {n}\n" for n in range(300_000))
    tracemalloc.start()
    try:
        assert scan_lines(lines) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000  # the 300,000 lines are 18 MB


def test_a_rule_without_literals_is_searched_whole_and_only_in_complete_lines() -> None:
    catalog = Catalog([Signature(id="code", title="Code", hint="h", line=re.compile(r"E\d+: \w+"))])
    scanner = CrashScanner(catalog)
    assert scanner.feed("ok\nE12: ba") == []  # the match is still being written
    assert [r.message for r in scanner.feed("d\n")] == ["E12: bad"]


def test_a_bracket_escaped_in_a_class_does_not_end_the_class_early() -> None:
    # `[\]]x|…`: the class holds `]`; the first alternative has no literal of 3 characters.
    assert _literal_anchors(r"[\]]x|abcd[0-9]efgh") is None
    assert _literal_anchors(r"[\]]xyz|abcd[0-9]efgh") == ["xyz", "abcd"]


def test_a_caret_line_belongs_to_the_traceback_whose_source_line_it_marks() -> None:
    """Two ranks' tracebacks interleaved: the caret follows TP1's source line, while TP0's
    frame still waits for its own source; so TP1 raised the RuntimeError, TP0 the KeyError."""
    text = (
        "[2026-11-29 10:12:33 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/srv/one.py", line 80, in forward\n'
        "[2026-11-29 10:12:33 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "    x = y[0]\n"
        '  File "/srv/zero.py", line 55, in step\n'
        "    ~^\n"
        "RuntimeError: m1\n"
        "KeyError: m0\n"
    )
    found = {r.ranks: r.exception for r in scan_text(text, Catalog([KEYERROR, RUNTIME]))}
    assert found == {("TP1",): "RuntimeError", ("TP0",): "KeyError"}
