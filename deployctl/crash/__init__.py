"""Find crashes in SGLang server logs and explain them with an ordered signature catalog.

The scanner is pure: it reads text and returns `CrashReport`s. It knows SGLang 0.5.23's log
forms (`[2026-11-29 10:12:33 DP1 TP3] message`), the scheduler's
`Scheduler hit an exception: Traceback …` wrapper whose traceback lines follow unprefixed,
plain and chained Python tracebacks, torch's `[rank3]:[E…]` C++ lines, and one-line fatal
messages. What a crash means, and what to do about it, lives in the catalog
(`data/signatures.yml`, plus the user's own file): an ordered list where the first match wins.

Modules: `model` (the report), `catalog` (signatures), `prefilter` (literal anchors), `scanner`.
"""

from deployctl.crash.catalog import SHIPPED_CATALOG, Catalog, CatalogError, load_catalog
from deployctl.crash.model import CrashReport, crash_lines, format_ranks
from deployctl.crash.prefilter import _literal_anchors
from deployctl.crash.scanner import STORED_LINE_CAP, CrashScanner, scan_lines, scan_text

__all__ = [
    "SHIPPED_CATALOG",
    "STORED_LINE_CAP",
    "Catalog",
    "CatalogError",
    "CrashReport",
    "CrashScanner",
    "_literal_anchors",
    "crash_lines",
    "format_ranks",
    "load_catalog",
    "scan_lines",
    "scan_text",
]
