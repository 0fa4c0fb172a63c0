"""Small text helpers shared by the parsers and the presentation (cheap to load)."""

from __future__ import annotations

import re
from typing import Any

# Terminal control sequences (colours, cursor moves) and other control characters but tab.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")


def one_line(text: str) -> str:
    """Return `text` on one line, its runs of whitespace collapsed to single spaces."""
    return " ".join(text.split())


def counted(count: int, noun: str) -> str:
    """`1 host`, `2 hosts`: a count and its noun (plural by an `s`)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def is_number(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts superscripts, which `int` refuses."""
    return text.isascii() and text.isdigit()


def plain(text: str) -> str:
    """A log line as text: without the colour codes a logger wrote (SGLang's router colours
    its log even into a file) or any control character that would reach a terminal."""
    return _CONTROL.sub("", text)


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*\Z")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float | None:
    """Seconds in `90`, `90s`, `10m`, `2h`, `1d`; None for anything else."""
    match = _DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def fast_safe_loader() -> Any:
    """PyYAML's safe loader, parsed by libyaml where PyYAML has it: ten times faster on a large
    inventory and on the patch sets' and the crash catalog's block texts."""
    import yaml  # loaded only where YAML is read

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """YAML text as plain data, through `fast_safe_loader`."""
    import yaml

    try:
        return yaml.load(text, Loader=fast_safe_loader())
    except yaml.YAMLError:
        # PyYAML's own parser says more (the character, what it expected): its error is raised
        return yaml.load(text, Loader=yaml.SafeLoader)
