"""The site's generated reference (tools/docs_reference.py): every command of the CLI, every
shipped `--json` schema and every declared inventory variable has its entry, and the checks
that say so catch an entry that is missing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deployctl.settings import SETTINGS
from tools import docs_reference as ref

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def commands_page() -> str:
    return ref.commands_page()


def missing_commands(page: str) -> list[str]:
    """The commands of the CLI's tree that a commands page has no entry for."""
    documented = ref.documented_commands(page)
    return [name for name in ref.command_names() if name not in documented]


def section(page: str, name: str) -> str:
    """One command's entry of a commands page, up to the next heading."""
    heading = re.search(rf"^#+ `{name}` \{{#", page, re.MULTILINE)
    assert heading is not None, name
    rest = re.search(r"^#+ `", page[heading.end() :], re.MULTILINE)
    return page[heading.start() : heading.end() + rest.start()] if rest else page[heading.start() :]


def test_the_walk_sees_every_command_and_subcommand() -> None:
    names = ref.command_names()
    assert names[0] == "deployctl"
    assert {"deployctl launch", "deployctl tune", "deployctl metrics-targets"} <= set(names)
    assert {f"deployctl patch {c}" for c in ("list", "apply", "revert", "port", "audit")} <= set(
        names
    )
    assert {"deployctl router", "deployctl router sync"} <= set(names)
    assert len(names) == len(set(names))


def test_every_command_has_its_entry(commands_page: str) -> None:
    assert missing_commands(commands_page) == []
    assert ref.documented_commands(commands_page) == set(ref.command_names())


def test_a_command_left_out_is_caught(commands_page: str) -> None:
    entry = section(commands_page, "deployctl patch audit")
    without = commands_page.replace(entry, "")
    assert missing_commands(without) == ["deployctl patch audit"]


def test_an_entry_holds_the_usage_help_and_every_option(commands_page: str) -> None:
    entry = section(commands_page, "deployctl launch")
    assert "Usage: deployctl launch [OPTIONS]" in entry
    assert "Preflight every host, start the server detached" in entry
    for option in ("`--threshold`", "`-i` / `--inventory`", "`--dry-run`", "`--json`"):
        assert option in entry, option
    assert "| `--timeout` | number (x>=1) | `900` | Seconds to wait until ready. |" in entry
    # An argument, a choice and a --x/--no-x pair.
    tune = section(commands_page, "deployctl tune")
    assert "`NUMBER`" in tune and "one of `tuned`, `baseline`, `none`" in tune
    assert "`--warmup` / `--no-warmup`" in tune


def test_every_shipped_schema_has_its_entry() -> None:
    page = ref.schemas_page()
    shipped = sorted(p.name for p in ref.SCHEMAS.glob("*.json"))
    assert len(shipped) > 20
    assert sorted(ref.documented_schemas(page)) == shipped
    # The whole schema is there, as shipped.
    status = json.loads((ref.SCHEMAS / "status.json").read_text(encoding="utf-8"))
    body = json.dumps(status, indent=2, ensure_ascii=False)
    assert "\n".join(f"    {line}" for line in body.splitlines()) in page


def test_a_schema_left_out_is_caught(tmp_path: Path) -> None:
    for path in ref.SCHEMAS.glob("*.json"):
        if path.name != "top.json":
            (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    documented = ref.documented_schemas(ref.schemas_page(tmp_path))
    shipped = {p.name for p in ref.SCHEMAS.glob("*.json")}
    assert shipped - documented == {"top.json"}


def test_every_setting_has_its_row_with_type_default_and_meaning() -> None:
    page = ref.settings_page()
    assert ref.documented_settings(page) == set(SETTINGS)
    port = SETTINGS["port"]
    assert f"| `port` | {port.what} | `30000` | {port.help} |" in page
    assert "| `launcher` | one of `ssh`, `slurm` |" in page


def test_a_setting_left_out_is_caught() -> None:
    fewer = {name: s for name, s in SETTINGS.items() if name != "bootstrap_port"}
    assert set(SETTINGS) - ref.documented_settings(ref.settings_page(fewer)) == {"bootstrap_port"}


def test_the_pages_are_the_ones_the_site_lists() -> None:
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = ref.pages()
    assert set(pages) == {ref.COMMANDS_PAGE, ref.SCHEMAS_PAGE, ref.SETTINGS_PAGE}
    for path in pages:
        assert f" {path}\n" in nav, path
        assert not (REPO / "docs" / path).exists(), f"docs/{path} is generated: not checked in"
