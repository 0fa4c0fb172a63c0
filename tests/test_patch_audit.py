"""The audit tells what an installation's files are, whoever patched them: a set applied
under another state_dir, by hand with `patch -p1`, or partly taken out by hand — over real
sshd hosts on SGLang 0.5.23's real files, with the shipped sets."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from deployctl.patchset import load_patch_sets
from deployctl.project import SHIPPED_DATA
from tests.conftest import CLI
from tests.sglang_wheel import SITE, install_on, site_file, write_patch_set
from tests.sshd_hosts import SSHLab

SHIPPED = load_patch_sets([SHIPPED_DATA / "patches"])
SPEC_DISABLE = SHIPPED["spec-disable"].variants["0.5.23"]
SM120 = SHIPPED["sm120-support"].variants["0.5.23"]
ADD_NORM = "sglang/srt/layers/layer_boundary/residual/add_norm.py"


def sums(site: Path, files: tuple[str, ...]) -> dict[str, str | None]:
    return {
        f: hashlib.sha256((site / f).read_bytes()).hexdigest() if (site / f).exists() else None
        for f in files
    }


def two_inventories(lab: SSHLab, template: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two inventories of one host and one SGLang installation, each with its own state_dir
    (two teams, or a colleague's deployctl); and the installation's site-packages."""
    python = install_on(lab.hosts["alpha"], template)
    mine = lab.inventory(tmp_path / "mine.yml", ["alpha"], {"alpha": {"python": python}})
    theirs = lab.inventory(
        tmp_path / "theirs.yml",
        ["alpha"],
        {"alpha": {"python": python, "state_dir": "~/.deployctl-colleague"}},
    )
    return mine, theirs, lab.hosts["alpha"].home / "venv" / SITE


def patch_json(cli: CLI, *args: str) -> tuple[int, dict, str]:
    result = cli("patch", *args, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def audited(cli: CLI, inventory: Path, name: str) -> tuple[int, dict]:
    code, doc, _ = patch_json(cli, "audit", "-i", str(inventory), "--expect", name)
    return code, doc["hosts"]["alpha"]["patches"][name]


def action(doc: dict) -> dict:
    [done] = doc["hosts"]["alpha"]["patches"]
    return done


def acted(cli: CLI, verb: str, name: str, inventory: Path) -> dict:
    """`patch apply|revert NAME`, which must succeed: what it did."""
    code, doc, err = patch_json(cli, verb, name, "-i", str(inventory))
    assert code == 0, err
    return action(doc)


def put_back_by_hand(site: Path, template: Path, path: str) -> None:
    """One file of the installation back to the wheel's own, as `pip` or an editor would."""
    (site / path).unlink()
    shutil.copy(site_file(template, path), site / path)


def test_a_set_applied_under_another_state_dir_is_applied_there_adopted_and_reverted(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    mine, theirs, site = two_inventories(hosts, sglang_template, tmp_path)
    wheel = sums(sglang_template / SITE, SPEC_DISABLE.files)
    assert acted(cli, "apply", "spec-disable", theirs)["action"] == "applied"
    patched = sums(site, SPEC_DISABLE.files)

    # Our state_dir has no record of it: the files have it all the same.
    code, state = audited(cli, mine, "spec-disable")
    assert (code, state["state"], state["version"]) == (0, "applied", "1.2.0")
    assert state["detail"] == "no record here" and state["recorded"] is False
    assert set(state["files"].values()) == {"applied"}

    # Applying it here adopts it: recorded, verified, no file changed.
    done = acted(cli, "apply", "spec-disable", mine)
    assert done["action"] == "adopted" and "backup: SGLang's own files" in done["detail"]
    assert sums(site, SPEC_DISABLE.files) == patched
    [record] = (hosts.hosts["alpha"].home / ".deployctl" / "patches").rglob("spec-disable.json")
    assert json.loads(record.read_text())["adopted"] is True
    code, state = audited(cli, mine, "spec-disable")
    assert (code, state["state"], state["detail"], state["recorded"]) == (0, "applied", "", True)
    assert acted(cli, "apply", "spec-disable", mine)["action"] == "unchanged"

    # Reverted from our record: the backup, rebuilt by the reverse diff, is the wheel's bytes.
    assert acted(cli, "revert", "spec-disable", mine)["action"] == "reverted"
    assert sums(site, SPEC_DISABLE.files) == wheel

    # The colleague's record no longer matches the files: they say what they are.
    code, state = audited(cli, theirs, "spec-disable")
    assert (code, state["state"], state["recorded"]) == (1, "missing", True)
    assert "but the files lack it" in state["detail"]
    assert acted(cli, "revert", "spec-disable", theirs)["action"] == "not applied"
    code, state = audited(cli, theirs, "spec-disable")
    assert (state["state"], state["recorded"], state["detail"]) == ("missing", False, "")


def test_a_set_applied_by_hand_with_patch_p1_is_audited_reverted_and_adopted(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    mine, _, site = two_inventories(hosts, sglang_template, tmp_path)
    wheel = sums(sglang_template / SITE, SPEC_DISABLE.files)
    [diff] = SPEC_DISABLE.diffs
    by_hand = f"patch -p1 -d {site} -i {diff}"  # as the set's own `verified` notes do it
    hosts.hosts["alpha"].as_user(by_hand)
    patched = sums(site, SPEC_DISABLE.files)
    assert patched != wheel

    code, state = audited(cli, mine, "spec-disable")
    assert (code, state["state"], state["detail"]) == (0, "applied", "no record here")

    # Reverted from the files: the set's reverse diff, with no record or backup of ours.
    done = acted(cli, "revert", "spec-disable", mine)
    assert done["action"] == "reverted"
    assert "taken out by its reverse diff (no record here" in done["detail"]
    assert sums(site, SPEC_DISABLE.files) == wheel
    code, state = audited(cli, mine, "spec-disable")
    assert (code, state["state"], state["recorded"]) == (1, "missing", False)

    # By hand again, then `patch apply`: adopted, exit 0, not "previously applied".
    hosts.hosts["alpha"].as_user(by_hand)
    assert acted(cli, "apply", "spec-disable", mine)["action"] == "adopted"
    assert sums(site, SPEC_DISABLE.files) == patched


def test_one_file_reverted_by_hand_is_partly_applied_and_apply_completes_it(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    mine, theirs, site = two_inventories(hosts, sglang_template, tmp_path)
    wheel = sums(sglang_template / SITE, SM120.files)
    assert acted(cli, "apply", "sm120-support", mine)["action"] == "applied"
    patched = sums(site, SM120.files)
    put_back_by_hand(site, sglang_template, ADD_NORM)

    for inventory in (mine, theirs):  # with our record, and without any
        code, state = audited(cli, inventory, "sm120-support")
        assert (code, state["state"]) == (1, "partly applied")
        assert state["detail"] == f"lacks it: {ADD_NORM}"
        assert state["files"][ADD_NORM] == "missing"

    done = acted(cli, "apply", "sm120-support", theirs)
    assert done["action"] == "applied" and done["detail"].startswith("completed")
    assert sums(site, SM120.files) == patched
    code, state = audited(cli, mine, "sm120-support")
    assert (code, state["state"]) == (0, "applied")

    # Partly again, and reverted: what is left of it is taken out, nothing else.
    put_back_by_hand(site, sglang_template, ADD_NORM)
    assert acted(cli, "revert", "sm120-support", mine)["action"] == "reverted"
    assert sums(site, SM120.files) == wheel


def test_two_sets_in_one_file_are_each_audited_and_one_is_taken_out_alone(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    mine, _, site = two_inventories(hosts, sglang_template, tmp_path)
    spec = "sglang/srt/arg_groups/fields/spec.py"
    first, second = '    _NS_PATH = "spec"\n', "from __future__ import annotations\n"
    write_patch_set(cli.cwd, "early", "1.0.0", sglang_template,
                    {spec: [(first, first + "    # early set\n")]})  # fmt: skip
    write_patch_set(cli.cwd, "top", "1.0.0", sglang_template,
                    {spec: [(second, second + "# top set\n")]})  # fmt: skip
    code, _, err = patch_json(cli, "apply", "early", "top", "-i", str(mine))
    assert code == 0, err
    for name in ("early", "top"):
        code, state = audited(cli, mine, name)
        assert (code, state["state"], state["detail"]) == (0, "applied", "")

    # `early` was applied first; `top` changed the file since. Taken out by its reverse
    # diff, `early` leaves `top`'s line, and `top` stays applied.
    assert acted(cli, "revert", "early", mine)["action"] == "reverted"
    text = (site / spec).read_text()
    assert "# top set" in text and "# early set" not in text
    assert audited(cli, mine, "early")[1]["state"] == "missing"
    assert audited(cli, mine, "top")[1]["state"] == "applied"
    assert acted(cli, "revert", "top", mine)["action"] == "reverted"
    assert sums(site, (spec,)) == sums(sglang_template / SITE, (spec,))
