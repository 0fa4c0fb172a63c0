"""deployctl.text's YAML reading: libyaml's speed, PyYAML's data and PyYAML's words."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployctl.text import load_yaml

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*REPO.glob("patches/*/patch.yml"), REPO / "deployctl/data/signatures.yml"])


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_a_shipped_file_reads_as_pyyamls_pure_python_parser_reads_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert load_yaml(text) == yaml.safe_load(text)


def test_libyaml_reads_where_pyyaml_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[str] = []
    real = yaml.load

    def load(text: str, Loader: type) -> object:
        used.append(Loader.__name__)
        return real(text, Loader)

    monkeypatch.setattr(yaml, "load", load)
    assert load_yaml("a: [1, 2]\n") == {"a": [1, 2]}
    assert used == ["CSafeLoader" if yaml.__with_libyaml__ else "SafeLoader"]


def test_a_syntax_error_is_told_in_pyyamls_own_words() -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        load_yaml("\t- x\n")
    assert "found character '\\t' that cannot start any token" in str(caught.value)
