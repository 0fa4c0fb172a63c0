"""Patch sets applied, audited and reverted over real sshd hosts on SGLang 0.5.23's real files."""

from __future__ import annotations

import hashlib
import json
import pwd
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.sglang_wheel import SITE, install_on, site_file, write_patch_set
from tests.sshd_hosts import SSHLab, sh

SPEC = "sglang/srt/arg_groups/fields/spec.py"
VERSION_PY = "sglang/version.py"
ANCHOR = '    _NS_PATH = "spec"\n'


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def host_site(lab: SSHLab, name: str) -> Path:
    return lab.hosts[name].home / "venv" / SITE


def setup_hosts(lab: SSHLab, template: Path, tmp_path: Path, names: list[str]) -> Path:
    host_vars = {n: {"python": install_on(lab.hosts[n], template)} for n in names}
    return lab.inventory(tmp_path / "inv.yml", names, host_vars)


def comment_set(project: Path, template: Path, version: str = "1.0.0", text: str = "v1") -> Path:
    return write_patch_set(
        project,
        "marker",
        version,
        template,
        {
            SPEC: [(ANCHOR, ANCHOR + f"    # deployctl test marker {text}\n")],
            VERSION_PY: [("try:\n", f"# marker {text}\ntry:\n")],
        },
        verify={"check.py": "import os, sys\nsys.exit(0 if os.environ['DEPLOYCTL_SITE'] else 1)\n"},
    )


def audit(cli: CLI, inventory: Path, *names: str) -> tuple[int, dict]:
    args = ["patch", "audit", "-i", str(inventory), "--json"]
    for name in names:
        args += ["--expect", name]
    result = cli(*args)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def test_apply_audit_drift_and_revert_restore_the_wheel_bytes(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha", "bravo"])
    comment_set(cli.cwd, sglang_template)
    site = host_site(hosts, "alpha")
    wheel_sums = {p: sha(site_file(sglang_template, p)) for p in (SPEC, VERSION_PY)}

    code, doc = audit(cli, inventory, "marker")
    assert code == 1
    assert doc["hosts"]["alpha"]["patches"]["marker"]["state"] == "missing"
    assert doc["hosts"]["alpha"]["sglang_version"] == "0.5.23"

    applied = cli("patch", "apply", "marker", "-i", str(inventory), "-H", "alpha", "--json")
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["hosts"]["alpha"]["patches"][0]["action"] == "applied"
    assert "deployctl test marker v1" in (site / SPEC).read_text()
    # The wheel's files (hard-linked into every host) are untouched.
    assert {p: sha(site_file(sglang_template, p)) for p in (SPEC, VERSION_PY)} == wheel_sums
    assert (site / "sglang/srt/arg_groups/fields/__pycache__").is_dir()

    code, doc = audit(cli, inventory, "marker")
    assert code == 1  # bravo still lacks it
    assert doc["hosts"]["alpha"]["patches"]["marker"] == {
        "state": "applied", "version": "1.0.0", "expected_version": "1.0.0", "detail": "",
        "recorded": True, "files": {SPEC: "applied", VERSION_PY: "applied"},
    }  # fmt: skip
    assert doc["hosts"]["bravo"]["patches"]["marker"]["state"] == "missing"

    # A hand edit of the set's own line: neither its lines nor the release's are there.
    text = (site / SPEC).read_text()
    (site / SPEC).unlink()  # as an editor saves: a new file
    (site / SPEC).write_text(text.replace("test marker v1", "test marker v1, edited"))
    code, doc = audit(cli, inventory, "marker")
    assert code == 1
    assert doc["hosts"]["alpha"]["patches"]["marker"]["state"] == "drifted"
    assert SPEC in doc["hosts"]["alpha"]["patches"]["marker"]["detail"]
    assert doc["hosts"]["alpha"]["patches"]["marker"]["files"][SPEC] == "differs"

    refused = cli("patch", "revert", "marker", "-i", str(inventory), "-H", "alpha")
    assert refused.returncode == 1 and "drifted" in refused.stderr
    reverted = cli("patch", "revert", "marker", "--force", "-i", str(inventory), "-H", "alpha")
    assert reverted.returncode == 0, reverted.stderr
    assert {p: sha(site / p) for p in (SPEC, VERSION_PY)} == wheel_sums
    code, doc = audit(cli, inventory, "marker")
    assert doc["hosts"]["alpha"]["patches"]["marker"]["state"] == "missing"


def test_apply_twice_is_a_no_op_and_keeps_backups(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    comment_set(cli.cwd, sglang_template)
    assert cli("patch", "apply", "marker", "-i", str(inventory)).returncode == 0
    state = hosts.hosts["alpha"].home / ".deployctl" / "patches"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in state.rglob("*") if p.is_file()}
    second = cli("patch", "apply", "marker", "-i", str(inventory), "--json")
    assert second.returncode == 0
    assert json.loads(second.stdout)["hosts"]["alpha"]["patches"][0]["action"] == "unchanged"
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in state.rglob("*") if p.is_file()}
    assert after == before


def test_newer_version_replaces_the_older_in_one_step(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    comment_set(cli.cwd, sglang_template, "1.0.0", "v1")
    assert cli("patch", "apply", "marker", "-i", str(inventory)).returncode == 0
    comment_set(cli.cwd, sglang_template, "1.1.0", "v2")
    code, doc = audit(cli, inventory, "marker")
    assert code == 1
    assert doc["hosts"]["alpha"]["patches"]["marker"]["state"] == "outdated"
    assert doc["hosts"]["alpha"]["patches"]["marker"]["version"] == "1.0.0"
    upgraded = cli("patch", "apply", "marker", "-i", str(inventory), "--json")
    assert upgraded.returncode == 0, upgraded.stderr
    assert json.loads(upgraded.stdout)["hosts"]["alpha"]["patches"][0]["action"] == "replaced 1.0.0"
    text = (host_site(hosts, "alpha") / SPEC).read_text()
    assert "marker v2" in text and "marker v1" not in text
    code, doc = audit(cli, inventory, "marker")
    assert code == 0 and doc["hosts"]["alpha"]["patches"]["marker"]["version"] == "1.1.0"
    backups = hosts.hosts["alpha"].home / ".deployctl" / "patches" / "backups" / "marker"
    assert len(list(backups.iterdir())) == 2  # each apply kept its own backup
    assert cli("patch", "revert", "marker", "-i", str(inventory)).returncode == 0
    assert sha(host_site(hosts, "alpha") / SPEC) == sha(site_file(sglang_template, SPEC))


def test_edited_diff_without_version_bump_is_noticed(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    comment_set(cli.cwd, sglang_template, "1.0.0", "v1")
    assert cli("patch", "apply", "marker", "-i", str(inventory)).returncode == 0
    comment_set(cli.cwd, sglang_template, "1.0.0", "v1-edited")
    code, doc = audit(cli, inventory, "marker")
    assert code == 1
    state = doc["hosts"]["alpha"]["patches"]["marker"]
    assert state["state"] == "outdated" and "without a version bump" in state["detail"]


def test_diff_that_does_not_apply_changes_nothing(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    folder = comment_set(cli.cwd, sglang_template)
    diff = folder / "0.5.23" / "marker.diff"
    diff.write_text(diff.read_text().replace('_NS_PATH = "spec"', '_NS_PATH = "not-in-0.5.23"'))
    before = sha(host_site(hosts, "alpha") / SPEC)
    result = cli("patch", "apply", "marker", "-i", str(inventory))
    assert result.returncode == 1
    assert "does not apply" in result.stderr and "FAILED" in result.stderr
    assert sha(host_site(hosts, "alpha") / SPEC) == before
    assert not (hosts.hosts["alpha"].home / ".deployctl" / "patches" / "marker.json").exists()


@pytest.mark.parametrize("breakage", ["syntax", "verify"])
def test_broken_patch_is_rolled_back_and_reported(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path, breakage: str
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    if breakage == "syntax":
        # The classic: an argument inserted where a comma was needed.
        edits = {
            VERSION_PY: [("try:\n", "# broken set\ntry:\n")],
            SPEC: [(ANCHOR, ANCHOR + "    speculative_extra: A[int, 'x'] = 1 2\n")],
        }
        verify = None
    else:
        edits = {VERSION_PY: [("try:\n", "# broken set\ntry:\n")]}
        verify = {
            "fails.py": "import sys\nsys.exit('threshold decision wrong: batch 6 speculated')\n"
        }
    write_patch_set(cli.cwd, "broken", "1.0.0", sglang_template, edits, verify=verify)
    site = host_site(hosts, "alpha")
    before = {p: sha(site / p) for p in (SPEC, VERSION_PY)}
    result = cli("patch", "apply", "broken", "-i", str(inventory))
    assert result.returncode == 1
    assert "rolled back (all files restored)" in result.stderr
    expected = "invalid syntax" if breakage == "syntax" else "threshold decision wrong"
    assert expected in result.stderr
    assert {p: sha(site / p) for p in (SPEC, VERSION_PY)} == before
    _, doc = audit(cli, inventory, "broken")
    assert doc["hosts"]["alpha"]["patches"]["broken"]["state"] == "missing"


def test_other_sglang_version_is_unsupported(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha", "bravo"])
    # bravo gets SGLang "0.5.22": its installed metadata says so, as after a pip install.
    dist = next(host_site(hosts, "bravo").glob("sglang-0.5.23.dist-info"))
    metadata = dist / "METADATA"
    text = metadata.read_text().replace("Version: 0.5.23", "Version: 0.5.22", 1)
    metadata.unlink()  # break the hard link to the template before editing
    metadata.write_text(text)
    comment_set(cli.cwd, sglang_template)
    result = cli("patch", "apply", "marker", "-i", str(inventory), "--json")
    doc = json.loads(result.stdout)
    assert result.returncode == 1
    assert doc["hosts"]["alpha"]["ok"] is True
    assert doc["hosts"]["bravo"]["ok"] is False
    assert "no variant for SGLang 0.5.22" in doc["hosts"]["bravo"]["error"]
    assert sha(host_site(hosts, "bravo") / SPEC) == sha(site_file(sglang_template, SPEC))
    code, doc = audit(cli, inventory, "marker")
    assert code == 1
    assert doc["hosts"]["alpha"]["patches"]["marker"]["state"] == "applied"
    assert doc["hosts"]["bravo"]["patches"]["marker"]["state"] == "unsupported"


def test_dry_run_checks_hunks_and_changes_nothing(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    comment_set(cli.cwd, sglang_template)
    before = sha(host_site(hosts, "alpha") / SPEC)
    result = cli("patch", "apply", "marker", "--dry-run", "-i", str(inventory), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["hosts"]["alpha"]["patches"][0]["action"] == "would apply"
    assert sha(host_site(hosts, "alpha") / SPEC) == before
    # No record, backup or lock: deployctl's state holds only its agent's copy.
    state = hosts.hosts["alpha"].home / ".deployctl"
    assert [p.name for p in state.iterdir()] == ["agent"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda f: (f / "patch.yml").write_text("name: marker\nversion: 1.0.0\n"),
            "lacks required field",
        ),
        (
            lambda f: (f / "0.5.23" / "marker.diff").write_text(
                (f / "0.5.23" / "marker.diff")
                .read_text()
                .replace("a/sglang/", "a/../../etc/", 1)
                .replace("b/sglang/", "b/../../etc/", 1)
            ),
            "escapes the site-packages folder",
        ),
    ],
)
def test_bad_patch_sets_are_refused_before_any_host(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path, mutate, message: str
) -> None:
    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    mutate(comment_set(cli.cwd, sglang_template))
    result = cli("patch", "apply", "marker", "-i", str(inventory))
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (hosts.hosts["alpha"].home / ".deployctl").exists()


def test_unknown_set_name_is_a_clear_error(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    result = cli("patch", "apply", "no-such-set", "-i", str(inventory))
    assert result.returncode == 1
    assert "unknown patch set 'no-such-set'" in result.stderr
    assert not (hosts.hosts["alpha"].home / ".deployctl").exists()


SHIPPED = ["spec-disable", "sm120-support"]


def verify_folders_of(user: str) -> set[Path]:
    """The patch verify folders in /tmp that `user` (one test host's login) owns."""
    uid = pwd.getpwnam(user).pw_uid
    found = set()
    for folder in Path("/tmp").glob("deployctl-verify-*"):
        try:
            if folder.stat().st_uid == uid:
                found.add(folder)
        except FileNotFoundError:  # another host's, removed as we looked
            pass
    return found


def test_shipped_sets_apply_audit_and_revert_on_real_sglang(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    from deployctl.patchset import load_patch_sets
    from deployctl.project import SHIPPED_DATA

    inventory = setup_hosts(hosts, sglang_template, tmp_path, ["alpha"])
    site = host_site(hosts, "alpha")
    sets = load_patch_sets([SHIPPED_DATA / "patches"])
    files = sorted({f for name in SHIPPED for f in sets[name].variants["0.5.23"].files})
    pristine = {f: sha(site / f) if (site / f).exists() else None for f in files}
    assert None in pristine.values()  # spec-disable adds a new module

    user = hosts.hosts["alpha"].user  # other workers' hosts verify their patches meanwhile
    verify_folders = verify_folders_of(user)
    applied = cli("patch", "apply", *SHIPPED, "-i", str(inventory), "--json")
    assert applied.returncode == 0, applied.stderr
    # The shipped sets carry verify scripts (that a failing one refuses the apply is
    # test_broken_patch_is_rolled_back_and_reported[verify]), and none leaves a folder behind.
    assert all(sets[name].variants["0.5.23"].verify for name in SHIPPED)
    assert verify_folders_of(user) == verify_folders
    actions = json.loads(applied.stdout)["hosts"]["alpha"]["patches"]
    assert [(a["set"], a["action"]) for a in actions] == [(n, "applied") for n in SHIPPED]
    assert "speculative_disable_batch_threshold" in (site / SPEC).read_text()
    assert (site / "sglang/srt/speculative/spec_disable_policy.py").exists()

    code, doc = audit(cli, inventory, *SHIPPED)
    assert code == 0
    assert {n: s["state"] for n, s in doc["hosts"]["alpha"]["patches"].items()} == dict.fromkeys(
        SHIPPED, "applied"
    )
    [record_file] = (hosts.hosts["alpha"].home / ".deployctl/patches").rglob("spec-disable.json")
    assert record_file.parent.name == hashlib.sha256(str(site).encode()).hexdigest()[:16]
    record = json.loads(record_file.read_text())
    assert (
        record["version"] == sets["spec-disable"].version and record["sglang_version"] == "0.5.23"
    )
    assert record["site"] == str(site) and record["applied_by"]
    assert set(record["files"]) == set(sets["spec-disable"].variants["0.5.23"].files)

    reverted = cli("patch", "revert", *SHIPPED, "-i", str(inventory))
    assert reverted.returncode == 0, reverted.stderr
    assert {f: sha(site / f) if (site / f).exists() else None for f in files} == pristine
    code, doc = audit(cli, inventory, *SHIPPED)
    assert code == 1
    assert {s["state"] for s in doc["hosts"]["alpha"]["patches"].values()} == {"missing"}


@pytest.mark.parametrize(
    ("applied", "available", "state", "detail"),
    [
        ("1.9.0", "1.10.0", "outdated", "1.9.0 applied, 1.10.0 available"),
        ("1.10.0", "1.10.0", "applied", ""),
        ("2.0.0", "1.10.0", "outdated", "set content changed without a version bump"),
    ],
)
def test_patch_versions_are_ordered_as_numbers_not_text(
    applied: str, available: str, state: str, detail: str
) -> None:
    import dataclasses

    from deployctl.ops.patch import PatchFacts, set_state
    from deployctl.patchset import load_patch_sets, version_key
    from deployctl.project import SHIPPED_DATA

    shipped = load_patch_sets([SHIPPED_DATA / "patches"])["spec-disable"]
    patch_set = dataclasses.replace(shipped, version=available)
    same_content = shipped.content_hash if applied == available else "another hash"
    # The files as that apply left them: another version's lines, neither this one's nor
    # the release's.
    variant = shipped.variants["0.5.23"]
    files = {path: f"{applied} of {path}" for path in variant.files}
    hunks = {path: ["differs"] * len(variant.hunks(path)) for path in variant.files}
    sums = {p: {"original_sha256": None, "patched_sha256": sha} for p, sha in files.items()}
    record = {"version": applied, "hash": same_content, "files": sums, "site": "/s",
              "sglang_version": "0.5.23"}  # fmt: skip
    facts = PatchFacts(
        "0.5.23",
        "/s",
        None,
        {"spec-disable": record},
        files,
        {"spec-disable": hunks},  # type: ignore[dict-item]
    )
    if state == "applied":  # the same content: the files are this version's
        facts.files.update({p: s.patched for p, s in (variant.hashes or {}).items()})
        sums.update({p: {"original_sha256": None, "patched_sha256": facts.files[p]} for p in sums})
    judged = set_state(facts, patch_set)
    assert (judged.state, judged.detail) == (state, detail)
    assert version_key("1.10.0") > version_key("1.9.2")


def test_two_installations_on_one_host_keep_their_own_records(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    first = install_on(alpha, sglang_template)
    second_venv = alpha.home / "venv-0.5.23-b"
    sh("cp", "-al", sglang_template, second_venv)
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", second_venv)
    second = str(second_venv / "bin" / "python")
    host_vars = {"alpha": {"deployments": {"a": {"python": first}, "b": {"python": second}}}}
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha"], host_vars)
    comment_set(cli.cwd, sglang_template)

    applied = cli("patch", "apply", "marker", "-i", str(inventory), "-d", "a", "--json")
    assert applied.returncode == 0, applied.stderr
    code, doc = audit(cli, inventory, "marker")
    states = {
        d: s["patches"]["marker"]["state"] for d, s in doc["hosts"]["alpha"]["deployments"].items()
    }
    assert code == 1 and states == {"a": "applied", "b": "missing"}  # not "drifted"
    assert "deployctl test marker" not in (second_venv / SITE / SPEC).read_text()

    both = cli("patch", "apply", "marker", "-i", str(inventory), "--json")
    assert both.returncode == 0, both.stderr
    actions = {
        d: s["patches"][0]["action"]
        for d, s in json.loads(both.stdout)["hosts"]["alpha"]["deployments"].items()
    }
    assert actions == {"a": "unchanged", "b": "applied"}
    records = sorted((alpha.home / ".deployctl" / "patches" / "sites").rglob("marker.json"))
    assert len(records) == 2
    assert {json.loads(r.read_text())["site"] for r in records} == {
        str(alpha.home / "venv" / SITE),
        str(second_venv / SITE),
    }

    assert cli("patch", "revert", "marker", "-i", str(inventory), "-d", "b").returncode == 0
    code, doc = audit(cli, inventory, "marker")
    states = {
        d: s["patches"]["marker"]["state"] for d, s in doc["hosts"]["alpha"]["deployments"].items()
    }
    assert states == {"a": "applied", "b": "missing"}
    assert "deployctl test marker" in (alpha.home / "venv" / SITE / SPEC).read_text()


def test_deployments_sharing_an_installation_are_patched_once_with_every_set_they_want() -> None:
    from deployctl.inventory import Host
    from deployctl.ops.patch import one_per_installation, sets_per_host
    from deployctl.patchset import load_patch_sets
    from deployctl.project import SHIPPED_DATA

    sets = load_patch_sets([SHIPPED_DATA / "patches"])
    common = {"python": "/opt/env/bin/python", "state_dir": "~/.deployctl"}
    hosts = [
        Host("gpu1", {**common, "patches": ["spec-disable"]}, "a"),
        Host("gpu1", {**common, "patches": ["sm120-support"]}, "b"),
        Host("gpu1", {**common, "patches": ["sm120-support"], "state_dir": "/srv/d"}, "c"),
        Host("gpu2", {**common, "patches": ["spec-disable"]}, "a"),
    ]
    targets, chosen = one_per_installation(hosts, sets_per_host(hosts, sets, []))
    assert [t.label for t in targets] == ["gpu1/a", "gpu1/c", "gpu2/a"]
    assert [s.name for s in chosen["gpu1/a"]] == ["spec-disable", "sm120-support"]
    assert [s.name for s in chosen["gpu1/c"]] == ["sm120-support"]


def test_two_pythons_of_one_installation_are_patched_once_and_both_audited_applied(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    python = install_on(alpha, sglang_template)
    alias = str(alpha.home / "venv" / "bin" / "python3")  # another path, the same venv
    deployments = {"a": {"python": python}, "b": {"python": alias}}
    inventory = hosts.inventory(
        tmp_path / "inv.yml", ["alpha"], {"alpha": {"deployments": deployments}}
    )
    comment_set(cli.cwd, sglang_template)

    applied = cli("patch", "apply", "marker", "-i", str(inventory), "--json")
    assert applied.returncode == 0, applied.stderr
    done = json.loads(applied.stdout)["hosts"]["alpha"]["deployments"]
    assert [s["patches"][0]["action"] for s in done.values()] == ["applied"]  # once
    assert (host_site(hosts, "alpha") / SPEC).read_text().count("deployctl test marker") == 1
    code, doc = audit(cli, inventory, "marker")
    states = {
        d: s["patches"]["marker"]["state"] for d, s in doc["hosts"]["alpha"]["deployments"].items()
    }
    assert code == 0 and states == {"a": "applied", "b": "applied"}
