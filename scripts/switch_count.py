"""Count the speculation switches a spec-disable (or adaptive) server logged, per TP rank.

The patch logs at most one `Switch adaptive runtime state` line a minute and counts the rest
into the next line ("(N more since the last line)"); with TP > 1 each rank's scheduler logs
its own lines, prefixed `[time TPn]`. The state alternates between the draft steps and 0,
starting at the draft steps. Usage: python3 scripts/switch_count.py LOG [--expect N]
(exit 1 unless every rank logged at least N switches).
"""

from __future__ import annotations

import argparse
import re
import sys

SWITCH = re.compile(
    r"\[(?P<head>[^\]]*)\] Switch adaptive runtime state: steps \d+ -> \d+"
    r".*?(?:\((?P<more>\d+) more since the last line\))?$"
)
RANK = re.compile(r"\bTP(\d+)\b")


def count(lines: list[str]) -> dict[int, tuple[int, int]]:
    """Each rank's (switches, lines): a line stands for itself and the ones it counts."""
    found: dict[int, tuple[int, int]] = {}
    for line in lines:
        m = SWITCH.search(line.rstrip())
        if m:
            rank_in_head = RANK.search(m.group("head"))
            rank = int(rank_in_head.group(1)) if rank_in_head else 0
            switches, seen = found.get(rank, (0, 0))
            found[rank] = (switches + 1 + int(m.group("more") or 0), seen + 1)
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--expect", type=int, default=1)
    args = parser.parse_args()
    with open(args.log, errors="replace") as log:
        found = count(log.readlines())
    if not found:
        print("switches counted from the log: none")
        return 1
    for rank, (total, seen) in sorted(found.items()):
        print(
            f"TP{rank}: switches counted from the log: {total} ({seen} lines): "
            f"{(total + 1) // 2} to 0 steps, {total // 2} back to drafting"
        )
    short = [rank for rank, (total, _) in found.items() if total < args.expect]
    if short:
        print(f"fewer than {args.expect} switches on rank(s) {sorted(short)}")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
