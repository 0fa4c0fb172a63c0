"""A record kept on a host (a tune's, a canary's) as one lookup found it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

R = TypeVar("R")


@dataclass
class Kept(Generic[R]):
    """Record `wanted` (None: the newest) of one deployment, or None when there is no such
    record; the numbers kept, and the files that are not records of the kind."""

    kind: str  # the command that keeps such records: tune, canary
    record: R | None
    numbers: list[int]
    unreadable: list[str]
    wanted: int | None = None

    @property
    def ok(self) -> bool:
        return self.record is not None

    @property
    def missing(self) -> str:
        """Why there is no record to show ("" when there is one)."""
        if self.record is not None:
            return ""
        which = f"no {self.kind}" if self.wanted is None else f"no {self.kind} {self.wanted}"
        return f"{which} is kept here (kept: {', '.join(map(str, self.numbers)) or 'none'})"

    @property
    def hint(self) -> str:
        """Where such a record comes from."""
        return f"deployctl {self.kind}"
