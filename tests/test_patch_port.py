"""`patch port`: a candidate variant for another SGLang release, with a report of each hunk,
on the real 0.5.23 and 0.5.22 wheels (no host is touched)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deployctl.project import SHIPPED_DATA
from tests import cli_server
from tests.conftest import CLI, FullDisk
from tests.sglang_wheel import SITE, extract_site, install_on, sglang_wheel
from tests.sshd_hosts import SSHLab


def project_without(cli: CLI, name: str, *releases: str) -> Path:
    """A project folder whose copy of a shipped set lacks the variants for `releases`."""
    folder = cli.cwd / "patches" / name
    shutil.copytree(SHIPPED_DATA / "patches" / name, folder)
    spec = yaml.safe_load((folder / "patch.yml").read_text())
    for release in releases:
        shutil.rmtree(folder / release)
        del spec["variants"][release]
    (folder / "patch.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def port(cli: CLI, name: str, release: str, *extra: str) -> tuple[int, dict, str]:
    result = cli(
        "patch", "port", name, "--to", release, "--from", str(sglang_wheel(release)),
        "--project", str(cli.cwd), "--json", *extra,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout) if result.stdout else {}, result.stderr


def applies_exactly(diff: Path, release: str, tmp: Path) -> bool:
    site = extract_site(release, tmp / f"site-{release}")
    done = subprocess.run(
        ["patch", "-p1", "--dry-run", "--fuzz=0", "-d", str(site), "-i", str(diff)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.returncode == 0 and "offset" not in done.stdout and "fuzz" not in done.stdout


@pytest.mark.heavy
def test_port_to_a_release_without_a_variant_reports_every_hunk(cli: CLI, tmp_path: Path) -> None:
    folder = project_without(cli, "spec-disable", "0.5.22", "0.5.17")  # port from 0.5.23
    before = (folder / "patch.yml").read_text()
    code, report, _ = port(cli, "spec-disable", "0.5.22")
    assert report["from_version"] == "0.5.23" and report["to_version"] == "0.5.22"
    outcomes = {(h["file"].rsplit("/", 1)[-1], h["hunk"]): h["outcome"] for h in report["hunks"]}
    assert outcomes == {
        ("field_order.py", 1): "fuzz",  # 0.5.22's field list ends elsewhere
        ("spec.py", 1): "offset",
        ("speculative_hook.py", 1): "offset",
        ("runtime_context.py", 1): "offset",
        **{("eagle_worker_v2.py", hunk): "offset" for hunk in range(1, 11)},
        ("spec_disable_policy.py", 1): "exact",
    }
    # Fuzz put the new field in the wrong place; the set's own verify scripts say so
    # (the runtime check imports the config machinery that reads field_order.py).
    assert report["verify"]["flag_parses.py"].startswith("failed:")
    assert "field_order.py" in report["verify"]["threshold_decision.py"]
    assert code == 1 and report["ok"] is False
    candidate = cli.cwd / "spec-disable-0.5.22-candidate"
    assert json.loads((candidate / "report.json").read_text()) == report
    assert applies_exactly(candidate / "spec-disable.diff", "0.5.22", tmp_path)
    assert (folder / "patch.yml").read_text() == before  # never declared by itself


@pytest.mark.heavy
def test_port_with_offsets_only_verifies_and_succeeds(cli: CLI, tmp_path: Path) -> None:
    project_without(cli, "sm120-support", "0.5.22")
    code, report, _ = port(cli, "sm120-support", "0.5.22", "-o", str(tmp_path / "out"))
    assert {h["outcome"] for h in report["hunks"]} == {"exact", "offset", "fuzz"}
    assert report["verify"] == {"sm120_gates.py": "passed"} and code == 0
    assert applies_exactly(tmp_path / "out" / "sm120-support.diff", "0.5.22", tmp_path)


@pytest.mark.heavy
def test_port_to_the_same_release_is_all_exact(cli: CLI) -> None:
    code, report, _ = port(cli, "spec-disable", "0.5.23")
    assert code == 0 and {h["outcome"] for h in report["hunks"]} == {"exact"}
    assert set(report["verify"].values()) == {"passed"}
    # The candidate carries its files' hashes, as the audit judges them: the shipped
    # variant's, made for the candidate's own diff.
    from deployctl.patchset import diffs_digest, load_patch_sets

    candidate = cli.cwd / "spec-disable-0.5.23-candidate"
    entry = json.loads((candidate / "hashes.json").read_text())["variants"]["0.5.23"]
    shipped = load_patch_sets([SHIPPED_DATA / "patches"])["spec-disable"].variants["0.5.23"]
    assert entry["diffs_sha256"] == diffs_digest([candidate / "spec-disable.diff"])
    assert entry["files"] == {
        path: {"original": sums.original, "patched": sums.patched}
        for path, sums in (shipped.hashes or {}).items()
    }


def test_port_refuses_the_wrong_release_and_an_existing_candidate(cli: CLI) -> None:
    before = cli_server.spent_cpu_seconds()
    result = cli("patch", "port", "spec-disable", "--to", "0.5.21",
                 "--from", str(sglang_wheel("0.5.22")))  # fmt: skip
    assert result.returncode == 1
    assert "holds SGLang 0.5.22, not 0.5.21" in result.stderr
    # Told by the wheel's METADATA before its ~6,000 files are unpacked (~3 s of CPU here).
    cpu = cli_server.spent_cpu_seconds() - before
    assert 0 < cpu < 1.5, f"took {cpu:.2f} CPU-s, bound 1.5 s"
    (cli.cwd / "spec-disable-0.5.23-candidate").mkdir()
    (cli.cwd / "spec-disable-0.5.23-candidate" / "mine.diff").write_text("keep me\n")
    code, _, stderr = port(cli, "spec-disable", "0.5.23")
    assert code == 1 and "already exists and is not empty" in stderr
    assert (cli.cwd / "spec-disable-0.5.23-candidate" / "mine.diff").read_text() == "keep me\n"


def test_port_reads_the_pristine_files_from_a_host_and_changes_nothing_there(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    python = install_on(alpha, sglang_template)
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": {"python": python}})
    site = alpha.home / "venv" / SITE
    before = {p: p.read_bytes() for p in (site / "sglang" / "srt").rglob("*.py")}
    result = cli("patch", "port", "spec-disable", "--to", "0.5.23", "-i", str(inventory),
                 "-H", "alpha", "-o", str(tmp_path / "cand"), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["source"] == f"alpha:{site}"
    assert {h["outcome"] for h in report["hunks"]} == {"exact"}
    assert set(report["verify"].values()) == {
        "not run: only the files the diffs touch were read from the host"
    }
    assert {p: p.read_bytes() for p in (site / "sglang" / "srt").rglob("*.py")} == before
    wrong = cli(
        "patch", "port", "spec-disable", "--to", "0.5.22", "-i", str(inventory), "-H", "alpha"
    )
    assert wrong.returncode == 1 and "alpha has SGLang 0.5.23, not 0.5.22" in wrong.stderr
    none = cli("patch", "port", "spec-disable", "--to", "0.5.23", "-i", str(inventory))
    assert none.returncode == 1 and "--from WHEEL|SITE, or -H naming one host" in none.stderr


@pytest.mark.heavy
def test_port_from_a_copy_that_already_has_the_change_is_not_ok(cli: CLI, tmp_path: Path) -> None:
    site = extract_site("0.5.23", tmp_path / "patched-site")
    diff = SHIPPED_DATA / "patches" / "spec-disable" / "0.5.23" / "spec-disable.diff"
    subprocess.run(["patch", "-p1", "-s", "-d", str(site), "-i", str(diff)], check=True)
    result = cli("patch", "port", "spec-disable", "--to", "0.5.23", "--from", str(site), "--json",
                 "-o", str(tmp_path / "cand"))  # fmt: skip
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["ok"] is False
    skipped = [h for h in report["hunks"] if "already has this change" in h["detail"]]
    assert skipped and all(h["outcome"] == "failed" for h in skipped)


@pytest.mark.heavy
def test_port_to_a_release_that_lacks_a_file_reports_its_hunks_failed(
    cli: CLI, tmp_path: Path
) -> None:
    # 0.5.17 has no arg_groups/fields/ (real SGLang 0.5.17: one ServerArgs in server_args.py):
    # GNU patch skips a file it cannot find, and the port said only "could not read it".
    project_without(cli, "spec-disable", "0.5.22", "0.5.17")  # port from 0.5.23
    site = extract_site("0.5.22", tmp_path / "site")
    (site / "sglang/srt/arg_groups/fields/spec.py").unlink()
    result = cli("patch", "port", "spec-disable", "--to", "0.5.22", "--from", str(site),
                 "--project", str(cli.cwd), "--json", "-o", str(tmp_path / "cand"))  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    failed = {
        (h["file"], h["hunk"]): h["detail"] for h in report["hunks"] if h["outcome"] == "failed"
    }
    gone = "sglang/srt/arg_groups/fields/spec.py"
    assert failed == {(gone, 1): f"{gone} does not exist in this release (moved or renamed?)"}
    # The file before it in the diff is not taken for one that has the change already.
    ported = {h["file"].rsplit("/", 1)[-1]: h["outcome"] for h in report["hunks"]}
    assert ported["field_order.py"] == "fuzz" and ported["speculative_hook.py"] == "offset"


def test_port_into_a_missing_folder_onto_a_file_or_a_full_disk_is_one_line_and_no_litter(
    cli: CLI, tmp_path: Path, full_disk: FullDisk
) -> None:
    def refused(out: Path) -> str:
        code, report, stderr = port(cli, "sm120-support", "0.5.23", "-o", str(out))
        assert code == 1 and report["ok"] is False and "bug" not in stderr, stderr
        return report["error"]

    assert "does not exist" in refused(tmp_path / "nowhere" / "cand")
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "a-file").write_text("mine\n")
    assert "is a file, not a folder" in refused(tmp_path / "a-file")
    assert (tmp_path / "a-file").read_text() == "mine\n"
    full_disk.fill()
    out = full_disk.path / "cand"
    assert refused(out) == f"cannot write {out}: No space left on device"
    assert full_disk.names() == set()  # no half-written candidate, no scratch folder


def test_port_from_a_truncated_or_non_zip_wheel_is_one_line_naming_it(
    cli: CLI, tmp_path: Path
) -> None:
    real = sglang_wheel("0.5.23").read_bytes()
    for name, data in (("cut", real[: len(real) // 2]), ("text", b"not a zip\n")):
        wheel = tmp_path / name / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
        wheel.parent.mkdir()
        wheel.write_bytes(data)
        result = cli("patch", "port", "spec-disable", "--to", "0.5.23", "--from", str(wheel),
                     "--project", str(cli.cwd), "-o", str(tmp_path / name / "cand"))  # fmt: skip
        lines = result.stderr.splitlines()
        assert result.returncode == 1, result.stderr
        assert lines[0].startswith(f"error: {wheel} is not a readable wheel: "), lines
        assert len(lines) == 2 and "bug" not in result.stderr
        assert not (tmp_path / name / "cand").exists()
