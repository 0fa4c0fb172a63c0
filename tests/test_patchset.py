"""Patch sets without hosts: patch.yml checks, diff paths, version order, flag rules, hashes."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployctl.errors import PatchError
from deployctl.patchset import (
    FlagRule,
    PatchSet,
    command_flags,
    diff_targets,
    flag_violations,
    load_patch_set,
    load_patch_sets,
    select_sets,
    sets_for_flags,
    version_key,
)
from deployctl.present.documents import patch_set_json
from deployctl.project import SHIPPED_DATA

DIFF = """\
--- a/sglang/version.py
+++ b/sglang/version.py
@@ -1 +1 @@
-__version__ = "0.5.23"
+__version__ = "0.5.23+patched"
"""


def diff_of(*paths: str) -> str:
    """A git-style diff touching each site-relative path once."""
    return "".join(f"--- a/{p}\n+++ b/{p}\n@@ -1 +1 @@\n-old\n+new\n" for p in paths)


def write_set(
    root: Path,
    name: str = "demo",
    files: dict[str, str] | None = None,
    **fields: Any,
) -> Path:
    """Write root/<name>/ with patch.yml made of `fields` (defaults fill the required ones)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for relpath, text in ({"0.5.23/demo.diff": DIFF} if files is None else files).items():
        (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
        (folder / relpath).write_text(text, encoding="utf-8")
    spec: dict[str, Any] = {
        "name": name,
        "version": "1.0.0",
        "description": "a demo set",
        "variants": {"0.5.23": {"diffs": ["0.5.23/demo.diff"]}},
    }
    spec.update(fields)
    spec = {k: v for k, v in spec.items() if v is not None}
    (folder / "patch.yml").write_text(
        yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    return folder


def refusal(folder: Path) -> PatchError:
    with pytest.raises(PatchError) as info:
        load_patch_set(folder)
    return info.value


def stub_set(
    name: str, requires: tuple[str, ...] = (), flags: tuple[FlagRule, ...] = ()
) -> PatchSet:
    return PatchSet(name, "1.0.0", "", requires, flags, {}, Path("/nowhere"), "0" * 64)


# --- version order ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("1.9.2", "1.10.0"),
        ("1.0.9", "1.0.10"),
        ("9.9.9", "10.0.0"),
        ("1.2", "1.2.1"),
        ("0.9", "1.0"),
        ("2", "10"),
    ],
)
def test_versions_order_as_numbers_not_text(older: str, newer: str) -> None:
    assert version_key(older) < version_key(newer)
    assert max([newer, older], key=version_key) == newer
    assert sorted([newer, older], key=version_key) == [older, newer]


def test_version_key_reads_each_dotted_number() -> None:
    assert version_key("1.10.0") == (1, 10, 0)
    assert version_key("12") == (12,)
    assert version_key("1.0.0") == version_key("1.0.0")


# --- diff paths ------------------------------------------------------------------------------


def test_diff_targets_are_site_relative_without_git_prefixes() -> None:
    text = diff_of("sglang/srt/x.py", "sglang/y.py")
    assert diff_targets(text, "d.diff") == ["sglang/srt/x.py", "sglang/y.py"]


def test_diff_targets_drop_header_timestamps_and_accept_plain_paths() -> None:
    text = (
        "--- sglang/x.py\t2024-01-01 00:00:00.000000000 +0000\n"
        "+++ sglang/x.py\t2024-01-02 00:00:00.000000000 +0000\n"
        "@@ -1 +1 @@\n-a\n+b\n"
        "--- sglang/gone.py\t2024-01-01 00:00:00.000000000 +0000\n"
        "+++ /dev/null\t1970-01-01 00:00:00.000000000 +0000\n"
        "@@ -1 +0,0 @@\n-a\n"
    )
    assert diff_targets(text, "d.diff") == ["sglang/x.py", "sglang/gone.py"]


def test_diff_paths_may_hold_spaces() -> None:
    text = (
        "--- a/sglang/my file.py\t2024-01-01 00:00:00 +0000\n"
        "+++ b/sglang/my file.py\t2024-01-02 00:00:00 +0000\n"
        "--- a/sglang/old name.py\n+++ /dev/null\n"
    )
    assert diff_targets(text, "d.diff") == ["sglang/my file.py", "sglang/old name.py"]


def test_diff_targets_name_added_and_deleted_files() -> None:
    text = (
        "--- /dev/null\n+++ b/sglang/new.py\n@@ -0,0 +1 @@\n+x\n"
        "--- a/sglang/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
    )
    assert diff_targets(text, "d.diff") == ["sglang/new.py", "sglang/gone.py"]


def test_an_added_line_that_looks_like_a_header_is_not_a_file() -> None:
    # "+++ b/evil" here is an added line "++ b/evil", after the file's headers were read.
    text = "--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1 +1,2 @@\n x\n+++ b/evil\n"
    assert diff_targets(text, "d.diff") == ["sglang/x.py"]


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("a/sglang/x.py", "sglang/x.py"),
        ("b/sglang/x.py", "sglang/x.py"),
        ("c/sglang/x.py", "c/sglang/x.py"),
        ("sglang/./srt//x.py", "sglang/srt/x.py"),
        ("a/x.py", "x.py"),
        ("top.py", "top.py"),
    ],
)
def test_diff_paths_are_normalised(path: str, target: str) -> None:
    assert diff_targets(f"--- {path}\n+++ {path}\n", "d.diff") == [target]


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../x.py", "a/../x.py", "a/sglang/../../x.py", "a/sglang/../sglang/x.py",
     "a/.", "a/sglang/.."],
)  # fmt: skip
def test_diff_paths_that_escape_site_packages_are_refused(path: str) -> None:
    with pytest.raises(PatchError) as info:
        diff_targets(f"--- {path}\n+++ {path}\n", "sets/d.diff")
    stripped = path[2:] if path.startswith("a/") else path
    assert str(info.value) == f"sets/d.diff: path {stripped!r} escapes the site-packages folder"
    assert info.value.hint == (
        "diff paths are relative to the folder holding sglang/, like a/sglang/srt/x.py"
    )


def test_a_path_part_that_starts_with_two_dots_is_refused() -> None:
    # Stricter than needed (..data/ is a legal name), on purpose: it reads like an escape.
    with pytest.raises(PatchError, match="escapes the site-packages folder"):
        diff_targets("--- a/..data/x.py\n+++ b/..data/x.py\n", "d.diff")


@pytest.mark.parametrize("text", ["", "just text\n", "+++ b/x.py\n", "--- a/x.py\n"])
def test_text_without_file_headers_is_not_a_diff(text: str) -> None:
    with pytest.raises(PatchError) as info:
        diff_targets(text, "sets/d.diff")
    assert str(info.value) == "sets/d.diff is not a unified diff (no ---/+++ file headers)"


# --- patch.yml -------------------------------------------------------------------------------


def test_a_complete_patch_yml_loads_every_field(tmp_path: Path) -> None:
    folder = write_set(
        tmp_path,
        files={
            "0.5.23/one.diff": diff_of("sglang/a.py", "sglang/b.py"),
            "0.5.23/two.diff": diff_of("sglang/b.py", "sglang/c.py"),
            "verify/check.py": "print('ok')\n",
            "0.6/one.diff": diff_of("sglang/z.py"),
        },
        version="2.10.3",
        description="  spaced description \n",
        requires=["base", "other"],
        flags={"--x": {"requires": {"--y": ["1", "2"]}, "forbids": ["--z"]}},
        variants={
            "0.5.23": {
                "diffs": ["0.5.23/one.diff", "0.5.23/two.diff"],
                "verify": ["verify/check.py"],
            },
            "0.6": {"diffs": ["0.6/one.diff"]},
        },
        verified="  checked by hand\n",
    )
    patch_set = load_patch_set(folder)
    assert patch_set.name == "demo"
    assert patch_set.version == "2.10.3"
    assert patch_set.description == "spaced description"
    assert patch_set.requires == ("base", "other")
    assert patch_set.flags == (FlagRule("--x", {"--y": ("1", "2")}, ("--z",)),)
    assert patch_set.folder == folder
    assert patch_set.verified == "checked by hand"
    assert sorted(patch_set.variants) == ["0.5.23", "0.6"]
    variant = patch_set.variant_for("0.5.23")
    assert variant.sglang_version == "0.5.23"
    assert variant.diffs == (folder / "0.5.23/one.diff", folder / "0.5.23/two.diff")
    assert variant.verify == (folder / "verify/check.py",)
    assert variant.files == ("sglang/a.py", "sglang/b.py", "sglang/c.py")  # each once, in order
    assert patch_set.variant_for("0.6").files == ("sglang/z.py",)
    assert patch_set.variant_for("0.6").verify == ()
    # `patch list --json`'s entry
    assert patch_set_json(patch_set) == {
        "name": "demo",
        "version": "2.10.3",
        "hash": patch_set.content_hash[:12],
        "sglang_versions": ["0.5.23", "0.6"],
        "description": "spaced description",
        "requires": ["base", "other"],
        "flags": ["--x"],
    }
    assert patch_set.short_hash == patch_set.content_hash[:12]


def test_optional_fields_default_to_empty(tmp_path: Path) -> None:
    patch_set = load_patch_set(write_set(tmp_path))
    assert (patch_set.requires, patch_set.flags, patch_set.verified) == ((), (), "")
    assert patch_set.variant_for("0.5.23").verify == ()


def test_a_relative_folder_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_set(tmp_path / "sets")
    monkeypatch.chdir(tmp_path)
    patch_set = load_patch_set(Path("sets/demo"))
    assert patch_set.folder == tmp_path / "sets" / "demo"
    assert patch_set.variant_for("0.5.23").files == ("sglang/version.py",)


def test_yaml_numbers_are_read_as_text(tmp_path: Path) -> None:
    # Unquoted, YAML reads 0.6 as a float and a requires entry 7 as an int.
    folder = write_set(tmp_path, files={"d.diff": DIFF})
    (folder / "patch.yml").write_text(
        "name: demo\nversion: 1\ndescription: d\nrequires: [7, base]\n"
        "flags: {--tp: {requires: {--pp: [1, 2.5]}}}\n"
        "variants: {0.6: {diffs: [d.diff]}}\n"
    )
    patch_set = load_patch_set(folder)
    assert patch_set.version == "1"
    assert patch_set.requires == ("7", "base")
    assert patch_set.flags == (FlagRule("--tp", {"--pp": ("1", "2.5")}),)
    assert list(patch_set.variants) == ["0.6"]
    assert patch_set.variant_for("0.6").sglang_version == "0.6"


def test_a_single_string_is_a_list_of_one(tmp_path: Path) -> None:
    folder = write_set(
        tmp_path,
        requires="base",
        flags={"--x": {"requires": {"--y": "on"}, "forbids": "--z"}},
        variants={"0.5.23": {"diffs": "0.5.23/demo.diff"}},
    )
    patch_set = load_patch_set(folder)
    assert patch_set.requires == ("base",)
    assert patch_set.flags == (FlagRule("--x", {"--y": ("on",)}, ("--z",)),)
    assert patch_set.variant_for("0.5.23").diffs == (folder / "0.5.23/demo.diff",)


def test_the_shipped_sets_load() -> None:
    sets = load_patch_sets([SHIPPED_DATA / "patches"])
    assert list(sets) == ["sm120-support", "spec-disable"]
    spec_disable = sets["spec-disable"]
    assert spec_disable.flags[0].flag == "--speculative-disable-batch-threshold"
    assert spec_disable.flags[0].requires["--speculative-eagle-topk"] == ("1",)
    assert "--speculative-adaptive" in spec_disable.flags[0].forbids
    assert spec_disable.verified.startswith("Verified, on CPU only")


def test_a_missing_patch_yml_is_named(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    error = refusal(tmp_path / "demo")
    assert str(error) == f"{tmp_path / 'demo' / 'patch.yml'} does not exist"


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", ""])
def test_patch_yml_that_is_not_a_mapping_is_refused(tmp_path: Path, text: str) -> None:
    folder = write_set(tmp_path)
    (folder / "patch.yml").write_text(text)
    assert str(refusal(folder)) == f"{folder / 'patch.yml'} must be a mapping"


def test_malformed_yaml_says_what_is_wrong(tmp_path: Path) -> None:
    folder = write_set(tmp_path)
    (folder / "patch.yml").write_text("name: [unclosed\n")
    error = refusal(folder)
    assert str(error).startswith(f"{folder / 'patch.yml'}: malformed YAML: expected ")
    (folder / "patch.yml").write_bytes(b"name: \xff\n")
    assert str(refusal(folder)) == (
        f"{folder / 'patch.yml'}: malformed YAML: 'utf-8' codec can't decode byte 0xff "
        "in position 6: invalid start byte"
    )


@pytest.mark.parametrize("key", ["name", "version", "description", "variants"])
def test_each_required_field_is_named_when_missing(tmp_path: Path, key: str) -> None:
    folder = write_set(tmp_path)
    spec = yaml.safe_load((folder / "patch.yml").read_text())
    (folder / "patch.yml").write_text(yaml.safe_dump({**spec, key: ""}))
    error = refusal(folder)
    assert str(error) == f"{folder / 'patch.yml'} lacks required field(s): {key}"
    assert error.hint == "a patch.yml needs name, version, description and variants"


def test_all_missing_fields_are_named_together(tmp_path: Path) -> None:
    folder = write_set(tmp_path)
    (folder / "patch.yml").write_text("name: demo\ndescription: ''\n")
    assert str(refusal(folder)).endswith("lacks required field(s): version, description, variants")


@pytest.mark.parametrize("name", ["other", "Demo", "-demo", "demo/x", "demo\n"])
def test_the_name_must_be_the_folder_name(tmp_path: Path, name: str) -> None:
    folder = write_set(tmp_path, "demo")
    (folder / "patch.yml").write_text(
        yaml.safe_dump({"name": name, "version": "1.0.0", "description": "d",
                        "variants": {"0.5.23": {"diffs": ["0.5.23/demo.diff"]}}})
    )  # fmt: skip
    error = refusal(folder)
    assert str(error) == (
        f"{folder / 'patch.yml'}: name {name!r} must match its folder name 'demo'"
    )


@pytest.mark.parametrize("name", ["demo", "x", "0fix", "a.b_c-d", "9"])
def test_lowercase_names_with_dots_dashes_and_underscores_are_fine(
    tmp_path: Path, name: str
) -> None:
    assert load_patch_set(write_set(tmp_path, name)).name == name


@pytest.mark.parametrize("name", ["Demo", "_demo", ".demo", "dem o", "démo"])
def test_names_outside_the_allowed_letters_are_refused_even_in_a_matching_folder(
    tmp_path: Path, name: str
) -> None:
    error = refusal(write_set(tmp_path, name))
    assert f"name {name!r} must match its folder name" in str(error)


@pytest.mark.parametrize("version", ["1.0.0", "1", "0.10", "2024.1.15.3"])
def test_dotted_number_versions_are_accepted(tmp_path: Path, version: str) -> None:
    assert load_patch_set(write_set(tmp_path, version=version)).version == version


@pytest.mark.parametrize("version", ["v1.0", "1.0.0-beta", "1..0", "1.", ".1", "1.0 ", "one"])
def test_versions_that_are_not_dotted_numbers_are_refused(tmp_path: Path, version: str) -> None:
    folder = write_set(tmp_path, version=version)
    error = refusal(folder)
    assert str(error) == (
        f"{folder / 'patch.yml'}: version {version!r} is not dotted numbers like 1.0.0"
    )


def test_variants_must_be_a_mapping(tmp_path: Path) -> None:
    folder = write_set(tmp_path, variants=["0.5.23"])
    assert str(refusal(folder)) == (
        f"{folder / 'patch.yml'}: variants must map SGLang versions to diffs"
    )


@pytest.mark.parametrize("body", [["0.5.23/demo.diff"], {"verify": []}, {"diffs": []}, "x"])
def test_a_variant_without_diffs_is_refused(tmp_path: Path, body: object) -> None:
    folder = write_set(tmp_path, variants={"0.5.23": body})
    assert str(refusal(folder)) == f"{folder / 'patch.yml'}: variants.0.5.23 needs a diffs: list"


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("requires", {"a": 1}, "requires"),
        ("requires", [["nested"]], "requires"),
        ("requires", ["ok", {"a": 1}], "requires"),
        ("variants", {"0.5.23": {"diffs": {"a": 1}}}, "variants.0.5.23.diffs"),
        ("variants", {"0.5.23": {"diffs": ["0.5.23/demo.diff"], "verify": 3}},
         "variants.0.5.23.verify"),
    ],
)  # fmt: skip
def test_lists_of_strings_are_checked(
    tmp_path: Path, field: str, value: object, where: str
) -> None:
    folder = write_set(tmp_path, **{field: value})
    assert str(refusal(folder)) == f"{folder / 'patch.yml'}: {where} must be a list of strings"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--x"], "flags must be a mapping of flag → rules"),
        ({"x": {}}, "flag 'x' must start with -- and map to requires/forbids"),
        ({"-x": {}}, "flag '-x' must start with -- and map to requires/forbids"),
        ({"--x": ["--y"]}, "flag '--x' must start with -- and map to requires/forbids"),
        ({"--x": {"requires": ["--y"]}}, "--x.requires must map flags to allowed values"),
        ({"--x": {"requires": {"--y": {"a": 1}}}}, "--x.requires.--y must be a list of strings"),
        ({"--x": {"forbids": {"--y": 1}}}, "--x.forbids must be a list of strings"),
    ],
)
def test_bad_flag_rules_are_refused(tmp_path: Path, flags: object, message: str) -> None:
    folder = write_set(tmp_path, flags=flags)
    assert str(refusal(folder)) == f"{folder / 'patch.yml'}: {message}"


def test_a_flag_with_no_rules_is_allowed(tmp_path: Path) -> None:
    folder = write_set(tmp_path, flags={"--x": None, "--w": {"requires": None}})
    assert load_patch_set(folder).flags == (FlagRule("--x"), FlagRule("--w"))


@pytest.mark.parametrize("flags", [{}, []])
def test_empty_flags_mean_no_rules(tmp_path: Path, flags: object) -> None:
    assert load_patch_set(write_set(tmp_path, flags=flags)).flags == ()


@pytest.mark.parametrize(
    ("relative", "message"),
    [
        ("../outside.diff", "'../outside.diff' is outside the patch set folder"),
        ("/etc/hostname", "'/etc/hostname' is outside the patch set folder"),
        ("0.5.23/none.diff", "0.5.23/none.diff does not exist"),
        ("0.5.23", "0.5.23 does not exist"),
    ],
)
def test_diffs_must_be_files_inside_the_set(tmp_path: Path, relative: str, message: str) -> None:
    (tmp_path / "outside.diff").write_text(DIFF)
    folder = write_set(tmp_path, variants={"0.5.23": {"diffs": [relative]}})
    assert str(refusal(folder)) == f"{folder / 'patch.yml'}: variants.0.5.23: {message}"


def test_verify_scripts_must_be_files_inside_the_set(tmp_path: Path) -> None:
    folder = write_set(
        tmp_path, variants={"0.5.23": {"diffs": ["0.5.23/demo.diff"], "verify": ["nope.py"]}}
    )
    assert (
        str(refusal(folder)) == f"{folder / 'patch.yml'}: variants.0.5.23: nope.py does not exist"
    )


def test_a_symlink_out_of_the_set_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside.diff").write_text(DIFF)
    folder = write_set(tmp_path, variants={"0.5.23": {"diffs": ["link.diff"]}})
    (folder / "link.diff").symlink_to(tmp_path / "outside.diff")
    assert "'link.diff' is outside the patch set folder" in str(refusal(folder))


def test_a_diff_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    folder = write_set(tmp_path)
    (folder / "0.5.23/demo.diff").write_bytes(DIFF.encode() + b"+caf\xe9\n")
    error = refusal(folder)
    assert str(error) == f"{folder / '0.5.23/demo.diff'} is not UTF-8 text (byte {len(DIFF) + 4})"
    assert error.hint == "SGLang's sources are UTF-8: write the diff as UTF-8"


def test_a_diff_that_escapes_is_refused_when_loading(tmp_path: Path) -> None:
    folder = write_set(tmp_path, files={"0.5.23/demo.diff": diff_of("../evil.py")})
    assert str(refusal(folder)) == (
        f"{folder / '0.5.23/demo.diff'}: path '../evil.py' escapes the site-packages folder"
    )


def test_a_file_that_is_not_a_diff_is_named_when_loading(tmp_path: Path) -> None:
    folder = write_set(tmp_path, files={"0.5.23/demo.diff": "not a diff\n"})
    assert str(refusal(folder)) == (
        f"{folder / '0.5.23/demo.diff'} is not a unified diff (no ---/+++ file headers)"
    )


def test_patch_sets_load_the_same_under_an_ascii_locale(tmp_path: Path) -> None:
    # A cron job or a bare container runs with LANG=C: the files are still read as UTF-8.
    import os
    import subprocess
    import sys

    folder = write_set(
        tmp_path,
        files={"0.5.23/demo.diff": DIFF + "+# café → 模型\n"},
        description="Adds a flag → faster",
    )
    script = (
        "import sys; from pathlib import Path; from deployctl.patchset import load_patch_set; "
        "s = load_patch_set(Path(sys.argv[1])); print(s.description, s.variant_for('0.5.23').files)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(folder)],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(sys.path),  # the deployctl this test imported
            "LC_ALL": "C",
            "PYTHONCOERCECLOCALE": "0",
            "PYTHONUTF8": "0",
            "PYTHONIOENCODING": "utf-8",
        },
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    here = load_patch_set(folder)  # (in this process too, so mutmut knows what this test runs)
    assert result.stdout == f"{here.description} {here.variant_for('0.5.23').files}\n"
    assert result.stdout == "Adds a flag → faster ('sglang/version.py',)\n"


def test_variant_for_an_unsupported_sglang_lists_the_supported_ones(tmp_path: Path) -> None:
    folder = write_set(
        tmp_path,
        files={"d.diff": DIFF},
        variants={"0.6.0": {"diffs": ["d.diff"]}, "0.5.23": {"diffs": ["d.diff"]}},
    )
    with pytest.raises(PatchError) as info:
        load_patch_set(folder).variant_for("0.4.0")
    assert str(info.value) == (
        "patch set demo 1.0.0 has no variant for SGLang 0.4.0 (supported: 0.5.23, 0.6.0)"
    )
    assert info.value.hint == "install a supported SGLang version, or add a variant for this one"
    with pytest.raises(PatchError, match=r"\(supported: none\)"):
        stub_set("empty").variant_for("0.5.23")


# --- content hash ----------------------------------------------------------------------------


def test_the_content_hash_is_stable_across_releases(tmp_path: Path) -> None:
    # Hosts record this hash when a set is applied; a new formula would call every host outdated.
    folder = write_set(tmp_path)
    (folder / "patch.yml").write_text(
        "name: demo\nversion: 1.0.0\ndescription: d\nvariants:\n  0.5.23:\n"
        "    diffs: [0.5.23/demo.diff]\n    verify: [v.py]\n"
    )
    (folder / "v.py").write_text("print(1)\n")
    digest = hashlib.sha256()
    for relative in ("0.5.23/demo.diff", "patch.yml", "v.py"):
        digest.update(relative.encode() + b"\0" + (folder / relative).read_bytes() + b"\0")
    assert load_patch_set(folder).content_hash == digest.hexdigest()


def test_the_content_hash_follows_content_not_location(tmp_path: Path) -> None:
    first = load_patch_set(write_set(tmp_path / "one"))
    moved = load_patch_set(write_set(tmp_path / "two" / "deeper"))
    assert moved.content_hash == first.content_hash
    assert len(first.content_hash) == 64 and len(first.short_hash) == 12

    folder = tmp_path / "two" / "deeper" / "demo"
    (folder / "0.5.23/demo.diff").write_text(DIFF + " \n")
    assert load_patch_set(folder).content_hash != first.content_hash


def test_the_content_hash_covers_file_names_and_verify_scripts(tmp_path: Path) -> None:
    base = load_patch_set(write_set(tmp_path / "a")).content_hash
    renamed = write_set(
        tmp_path / "b",
        files={"0.5.23/other.diff": DIFF},
        variants={"0.5.23": {"diffs": ["0.5.23/other.diff"]}},
    )
    (renamed / "patch.yml").write_text(
        (renamed / "patch.yml").read_text().replace("other.diff", "de.diff")
    )
    (renamed / "0.5.23/other.diff").rename(renamed / "0.5.23/de.diff")
    # Same patch.yml length and diff bytes, one file name differs.
    assert load_patch_set(renamed).content_hash != base

    verified = write_set(
        tmp_path / "c",
        files={"0.5.23/demo.diff": DIFF, "v.py": "a\n"},
        variants={"0.5.23": {"diffs": ["0.5.23/demo.diff"], "verify": ["v.py"]}},
    )
    before = load_patch_set(verified).content_hash
    (verified / "v.py").write_text("b\n")
    assert load_patch_set(verified).content_hash != before


def test_the_content_hash_counts_a_shared_diff_once(tmp_path: Path) -> None:
    one = write_set(
        tmp_path / "a",
        files={"d.diff": DIFF},
        variants={"0.5.23": {"diffs": ["d.diff"]}, "0.5.24": {"diffs": ["d.diff"]}},
    )
    two = write_set(tmp_path / "b", files={"d.diff": DIFF},
                    variants={"0.5.24": {"diffs": ["d.diff"]}, "0.5.23": {"diffs": ["d.diff"]}})  # fmt: skip
    (two / "patch.yml").write_text((one / "patch.yml").read_text())
    assert load_patch_set(one).content_hash == load_patch_set(two).content_hash
    digest = hashlib.sha256()
    for relative in ("d.diff", "patch.yml"):
        digest.update(relative.encode() + b"\0" + (one / relative).read_bytes() + b"\0")
    assert load_patch_set(one).content_hash == digest.hexdigest()


# --- finding and choosing sets ---------------------------------------------------------------


def test_a_project_set_shadows_a_shipped_one_of_the_same_name(tmp_path: Path) -> None:
    write_set(tmp_path / "project", "demo", version="2.0.0")
    write_set(tmp_path / "project", "mine")
    write_set(tmp_path / "shipped", "demo", version="1.0.0")
    write_set(tmp_path / "shipped", "base")
    (tmp_path / "shipped" / "not-a-set").mkdir()
    (tmp_path / "shipped" / "README").write_text("x")
    sets = load_patch_sets([tmp_path / "project", tmp_path / "shipped"])
    assert list(sets) == ["demo", "mine", "base"]
    assert sets["demo"].version == "2.0.0"
    assert sets["demo"].folder == tmp_path / "project" / "demo"


def test_a_broken_set_is_reported_when_loading_all(tmp_path: Path) -> None:
    write_set(tmp_path, "demo", version="x")
    with pytest.raises(PatchError, match="is not dotted numbers"):
        load_patch_sets([tmp_path])


def test_selected_sets_come_after_what_they_require() -> None:
    available = {
        "top": stub_set("top", ("mid", "base")),
        "mid": stub_set("mid", ("base",)),
        "base": stub_set("base"),
        "other": stub_set("other"),
    }
    assert [s.name for s in select_sets(available, ["top"])] == ["base", "mid", "top"]
    assert [s.name for s in select_sets(available, ["other", "top", "base"])] == [
        "other", "base", "mid", "top",
    ]  # fmt: skip
    assert select_sets(available, []) == []


def test_unknown_set_lists_the_available_ones() -> None:
    with pytest.raises(PatchError) as info:
        select_sets({"b": stub_set("b"), "a": stub_set("a")}, ["nope"])
    assert str(info.value) == "unknown patch set 'nope'"
    assert info.value.hint == "available: a, b"
    with pytest.raises(PatchError) as info:
        select_sets({"top": stub_set("top", ("gone",))}, ["top"])
    assert str(info.value) == "unknown patch set 'gone'"
    with pytest.raises(PatchError) as info:
        select_sets({}, ["x"])
    assert info.value.hint == "available: none"


def test_sets_that_require_each_other_are_refused_naming_the_cycle() -> None:
    available = {"a": stub_set("a", ("b",)), "b": stub_set("b", ("c",)), "c": stub_set("c", ("a",))}
    with pytest.raises(PatchError) as info:
        select_sets(available, ["a"])
    assert str(info.value) == "patch sets require each other in a cycle: a → b → c → a"
    with pytest.raises(PatchError, match="cycle: self → self"):
        select_sets({"self": stub_set("self", ("self",))}, ["self"])


# --- flags in a command ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["serve", "--tp=8", "--host", "0.0.0.0"], {"--tp": "8", "--host": "0.0.0.0"}),
        (["serve", "--trust-remote-code", "--tp", "8"], {"--trust-remote-code": None, "--tp": "8"}),
        (["serve", "--tp"], {"--tp": None}),
        (["serve", "--x=a=b", "--y="], {"--x": "a=b", "--y": ""}),
        (["serve", "--x", "-1"], {"--x": "-1"}),
        (["--x", "--y", "v"], {"--x": None, "--y": "v"}),
        (["serve", "-x", "v", "value"], {}),
        (["--tp", "1", "--tp", "2"], {"--tp": "2"}),
        ([], {}),
    ],
)
def test_command_flags_reads_each_flag_and_its_value(
    argv: list[str], flags: dict[str, str | None]
) -> None:
    assert command_flags(argv) == flags


RULE = FlagRule(
    "--speculative-disable-batch-threshold",
    {"--speculative-algorithm": ("EAGLE", "EAGLE3"), "--speculative-eagle-topk": ("1",)},
    ("--speculative-adaptive", "--enable-lora"),
)
SPEC_SET = stub_set("spec-disable", flags=(RULE,))
GOOD = [
    "serve",
    "--speculative-algorithm=EAGLE3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-disable-batch-threshold=5",
]


def test_a_command_using_a_sets_flag_needs_that_set() -> None:
    other = stub_set("other", flags=(FlagRule("--other"),))
    plain = stub_set("plain")
    available = {"other": other, "spec-disable": SPEC_SET, "plain": plain}
    assert sets_for_flags(GOOD, available) == [SPEC_SET]
    assert sets_for_flags([*GOOD, "--other"], available) == [other, SPEC_SET]
    assert sets_for_flags(["serve", "--tp=1", "other"], available) == []


def test_a_command_that_keeps_the_rules_has_no_violations() -> None:
    assert flag_violations(GOOD, [SPEC_SET]) == []
    # The rules apply only when the set's flag is used.
    assert flag_violations(["serve", "--speculative-adaptive"], [SPEC_SET]) == []


def test_each_broken_rule_names_set_flag_and_value() -> None:
    argv = ["serve", "--speculative-algorithm", "NGRAM", "--speculative-disable-batch-threshold",
            "5", "--enable-lora", "--speculative-adaptive"]  # fmt: skip
    assert flag_violations(argv, [SPEC_SET]) == [
        "--speculative-disable-batch-threshold (patch set spec-disable) needs "
        "--speculative-algorithm EAGLE or EAGLE3, but the command has --speculative-algorithm NGRAM",
        "--speculative-disable-batch-threshold (patch set spec-disable) needs "
        "--speculative-eagle-topk 1, but the command has --speculative-eagle-topk <absent>",
        "--speculative-disable-batch-threshold (patch set spec-disable) cannot be used with "
        "--speculative-adaptive",
        "--speculative-disable-batch-threshold (patch set spec-disable) cannot be used with "
        "--enable-lora",
    ]


def test_a_required_flag_given_bare_has_no_allowed_value() -> None:
    argv = ["--speculative-disable-batch-threshold=5", "--speculative-algorithm=EAGLE",
            "--speculative-eagle-topk"]  # fmt: skip
    assert flag_violations(argv, [SPEC_SET]) == [
        "--speculative-disable-batch-threshold (patch set spec-disable) needs "
        "--speculative-eagle-topk 1, but the command has --speculative-eagle-topk None",
    ]


def test_violations_are_checked_for_every_needed_set() -> None:
    # --d, not used, comes first: the rules after it still count.
    second = stub_set("second", flags=(FlagRule("--d"), FlagRule("--b", forbids=("--c",))))
    argv = ["--speculative-disable-batch-threshold=5", "--b", "--c"]
    problems = flag_violations(argv, [SPEC_SET, second])
    assert len(problems) == 3
    assert problems[-1] == "--b (patch set second) cannot be used with --c"


def test_the_shipped_spec_disable_rules_hold_on_the_eagle3_command() -> None:
    shipped = load_patch_sets([SHIPPED_DATA / "patches"])
    argv = [*GOOD, "--speculative-num-steps=3", "--tp-size=8"]
    needed = sets_for_flags(argv, shipped)
    assert [s.name for s in needed] == ["spec-disable"]
    assert flag_violations(argv, needed) == []
    assert flag_violations([*argv, "--enable-dp-attention"], needed) == [
        "--speculative-disable-batch-threshold (patch set spec-disable) cannot be used with "
        "--enable-dp-attention"
    ]


def test_a_copied_shipped_set_keeps_its_hash(tmp_path: Path) -> None:
    shipped = SHIPPED_DATA / "patches" / "spec-disable"
    shutil.copytree(shipped, tmp_path / "spec-disable")
    assert (
        load_patch_set(tmp_path / "spec-disable").content_hash
        == load_patch_set(shipped).content_hash
    )


def test_hunk_lines_that_look_like_file_headers_are_not_files() -> None:
    # A hunk that replaces `-- old` by `++ new` has the lines `--- old` and `+++ new`.
    text = (
        "--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,2 +1,2 @@\n a\n--- old comment\n"
        "+++ new comment\n--- a/sglang/y.py\n+++ b/sglang/y.py\n@@ -0,0 +1 @@\n+z\n"
    )
    assert diff_targets(text, "s.diff") == ["sglang/x.py", "sglang/y.py"]


def test_hunks_are_counted_per_file_past_header_like_lines() -> None:
    from deployctl.patchset import diff_hunks

    text = (
        "--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,2 +1,2 @@\n a\n--- old\n+++ new\n"
        "@@ -9 +9 @@\n-p\n+q\n--- a/sglang/y.py\n+++ b/sglang/y.py\n@@ -0,0 +1 @@\n+z\n"
    )
    assert diff_hunks(text, "s.diff") == {"sglang/x.py": 2, "sglang/y.py": 1}
