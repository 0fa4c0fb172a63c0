"""What a check found, in one type: the launchers' own preflight, a router's pair checks, the
host's flag check and each of preflight's checks all answer with it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Findings:
    """Problems refuse the launch; warnings are said and refuse nothing; hints say what to do.

    The lists are keyword-only, so that a result with fields of its own (`FlagReport`,
    `Preflight`) keeps them first and positional."""

    problems: list[str] = field(default_factory=list, kw_only=True)
    hints: list[str] = field(default_factory=list, kw_only=True)
    warnings: list[str] = field(default_factory=list, kw_only=True)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str, hint: str | None = None) -> None:
        self.problems.append(text)
        if hint is not None:
            self.hints.append(hint)

    def add(self, other: Findings) -> None:
        """Take on another check's findings after this one's."""
        self.problems += other.problems
        self.hints += other.hints
        self.warnings += other.warnings
