"""The order the suite's tests are handed to the workers in (tests/conftest.py): windows in
the middle, longest first; other long tests after them; never a long one last."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests import conftest


class Item:
    """What the ordering reads of a collected test: its name and its markers."""

    def __init__(self, name: str, **marks: dict[str, Any]) -> None:
        self.name = name
        self.marks = marks

    def get_closest_marker(self, name: str) -> SimpleNamespace | None:
        return SimpleNamespace(kwargs=self.marks[name]) if name in self.marks else None

    def __repr__(self) -> str:
        return self.name


def test_windows_go_to_the_middle_longest_first_and_long_tests_after_them() -> None:
    plain = [Item(f"t{i}") for i in range(100)]
    short_window, long_window = Item("w3", window={"minutes": 3}), Item("w5", window={"minutes": 5})
    longs = [Item("long1", long={}), Item("long2", long={})]
    items: list[Any] = [*plain[:50], short_window, *plain[50:], long_window, *longs]
    conftest.spread_long_tests(items)
    where = {item.name: items.index(item) / len(items) for item in items}
    assert sorted(map(repr, items)) == sorted(
        map(repr, [*plain, short_window, long_window, *longs])
    )
    assert 0.15 <= where["w5"] < where["w3"] <= 0.62
    assert 0.58 <= where["long1"] < where["long2"] <= 0.87
    assert [repr(i) for i in items if repr(i).startswith("t")] == [f"t{i}" for i in range(100)]
