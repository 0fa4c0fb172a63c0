"""`bench --plot`: the picture is written whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployctl.errors import LocalFileError, UsageError
from deployctl.plot import check_plot_path, plot_runs
from tests.conftest import FullDisk

SPREAD = {"p50": 12.0, "p99": 20.0}
RUNS = {
    "r1": {"levels": [{"concurrency": c, "output_tokens_per_s": 100.0 * c, "itl_ms": SPREAD}
                      for c in (1, 4, 16)]},
}  # fmt: skip


def test_a_plot_onto_a_folder_is_refused_before_any_host_is_touched(tmp_path: Path) -> None:
    (tmp_path / "curves.png").mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        check_plot_path(tmp_path / "curves.png")


def test_a_plot_on_a_full_disk_keeps_the_old_picture_and_leaves_nothing(
    full_disk: FullDisk,
) -> None:
    picture = full_disk.path / "curves.svg"
    picture.write_bytes(b"<svg/>")
    full_disk.fill()
    with pytest.raises(LocalFileError, match="No space left on device"):
        plot_runs(RUNS, picture)
    assert picture.read_bytes() == b"<svg/>"
    assert full_disk.names() == {"curves.svg"}


@pytest.mark.heavy
def test_a_plot_replaces_the_old_picture(tmp_path: Path) -> None:
    picture = tmp_path / "curves.png"
    picture.write_bytes(b"old")
    plot_runs(RUNS, picture)
    assert picture.read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]
