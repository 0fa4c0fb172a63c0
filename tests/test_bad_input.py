"""Bad input battery: every mistake gives one `error:` line, a non-zero exit, no traceback,
and leaves every test host exactly as it was.

The table below is the battery. Each case runs the real CLI from an empty working folder
(optionally with project files the case writes) against two prepared sshd test hosts.
`form` says which error form the case must give:

    error    stderr starts with `error: …` (a `hint: …` line may follow): refused locally
    host     stderr starts with `<host>: error: …`: the host was asked and said no
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployctl.remote.wire import AGENT_DIR
from deployctl.text import one_line
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab
from tests.test_lifecycle import prepare

BATTERY_HOSTS = ["alpha", "bravo"]


# ---- what "nothing changed on any host" means -------------------------------------------


def home_snapshot(lab: SSHLab) -> dict[str, tuple[Any, ...]]:
    """Every path under every test host's home: files with size, mtime and inode."""
    snap: dict[str, tuple[Any, ...]] = {}
    for host in lab.hosts.values():
        for root, dirs, files in os.walk(host.home):
            for name in dirs:
                snap[os.path.join(root, name)] = ("dir",)
            for name in files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                snap[path] = ("file", st.st_size, st.st_mtime_ns, st.st_ino)
    return snap


def is_agent_copy(path: str) -> bool:
    """A file of the agent's bundle, unpacked under ~/.deployctl/agent/<sha256>/."""
    parts = Path(path).parts
    return any(pair == (".deployctl", AGENT_DIR) for pair in pairwise(parts))


def assert_homes_unchanged(before: dict[str, tuple[Any, ...]], lab: SSHLab) -> None:
    """No file added, removed or touched; no folder removed.

    A refused launch may leave deployctl's own empty folders (~/.deployctl, the log folder)
    behind: preflight creates them to take the host lock and to test the log folder. A command
    that reached a host may leave deployctl's host agent there (~/.deployctl/agent/<sha256>/):
    a copy of deployctl's own code, kept so that it is not sent again.
    """
    after = home_snapshot(lab)
    removed = sorted(before.keys() - after.keys())
    added_files = sorted(
        p for p in after.keys() - before.keys() if after[p][0] != "dir" and not is_agent_copy(p)
    )
    changed = sorted(p for p in before.keys() & after.keys() if before[p] != after[p])
    assert (removed, added_files, changed) == ([], [], []), "a host was changed"


def user_processes(lab: SSHLab) -> list[str]:
    """Processes of the test hosts' users other than sshd's own session processes."""
    uids = {pwd.getpwnam(h.user).pw_uid: h.name for h in lab.hosts.values()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
        name = re.search(r"^Name:\s+(\S+)", status, re.M).group(1)  # type: ignore[union-attr]
        if uid in uids and name != "sshd":
            found.append(f"{uids[uid]}: {entry} {cmdline.decode(errors='replace')[:120]}")
    return found


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr


def check_error_form(result: subprocess.CompletedProcess[str], form: str, names: list[str]) -> str:
    """Assert the error form; return the first error line."""
    lines = result.stderr.splitlines()
    assert lines, f"no error on stderr; stdout: {result.stdout}"
    if form == "error":
        assert lines[0].startswith("error: "), result.stderr
        assert [ln for ln in lines if not ln.startswith("hint: ")] == [lines[0]], result.stderr
        return lines[0]
    prefixes = tuple(f"{n}: {kind}: " for n in names for kind in ("error", "hint"))
    assert lines[0].startswith(tuple(f"{n}: error: " for n in names)), result.stderr
    extra = [ln for ln in lines if not ln.startswith(prefixes)]
    assert extra in ([], ["nothing was started on any host"]), result.stderr
    # One error line per failing host, never more.
    for name in names:
        assert sum(ln.startswith(f"{name}: error: ") for ln in lines) <= 1, result.stderr
    return lines[0]


# ---- the battery ---------------------------------------------------------------------------

Files = dict[str, "str | bytes | Callable[[dict[str, Any]], str | bytes]"]


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    expect: str  # a piece of the first error line
    files: Files = field(default_factory=dict)
    form: str = "error"
    code: int = 1


def inventory_with(**changes: Any) -> Callable[[dict[str, Any]], str]:
    """A copy of the battery inventory with host variables changed (None removes one)."""

    def make(base: dict[str, Any]) -> str:
        doc = yaml.safe_load(yaml.safe_dump(base))
        for variables in doc["all"]["hosts"].values():
            for key, value in changes.items():
                if value is None:
                    variables.pop(key, None)
                else:
                    variables[key] = value
        return yaml.safe_dump(doc)

    return make


DIFF = "--- a/sglang/version.py\n+++ b/sglang/version.py\n@@ -1 +1 @@\n-a\n+b\n"


def patch_set(
    name: str = "marker", yml: str | None = None, diff: str | bytes = DIFF, folder: str = ""
) -> Files:
    folder = folder or name
    spec = yml if yml is not None else (
        f"name: {name}\nversion: 1.0.0\ndescription: test\n"
        f"variants:\n  '0.5.23':\n    diffs: [0.5.23/{name}.diff]\n"
    )  # fmt: skip
    return {f"patches/{folder}/patch.yml": spec, f"patches/{folder}/0.5.23/{name}.diff": diff}


INV = "{inv}"  # the battery inventory (two prepared sshd hosts)
BAD = "bad.yml"  # an inventory the case writes into its working folder

CASES = [
    # -- inventories: malformed YAML and wrong shapes --
    Case("yaml-unclosed", ("hosts", "-i", BAD), "malformed YAML", {BAD: "all: {hosts: [a\n"}),
    Case("yaml-tab", ("status", "-i", BAD), "malformed YAML", {BAD: "all:\n\thosts: {}\n"}),
    Case("yaml-not-utf8", ("launch", "-i", BAD), "not UTF-8", {BAD: b"all:\n  hosts: {\xff: }\n"}),
    Case("inv-top-list", ("launch", "-i", BAD), "must be a mapping", {BAD: "- alpha\n- bravo\n"}),
    Case("inv-group-int", ("status", "-i", BAD), "must be a mapping", {BAD: "all: 5\n"}),
    Case("inv-hosts-list", ("stop", "-i", BAD), "all.hosts must be a mapping",
         {BAD: "all:\n  hosts: [alpha, bravo]\n"}),
    Case("inv-unknown-key", ("launch", "-i", BAD), "unknown key(s) host",
         {BAD: "all:\n  host:\n    alpha:\n"}),
    Case("inv-empty", ("hosts", "-i", BAD), "is empty", {BAD: ""}),
    Case("inv-no-hosts", ("status", "-i", BAD), "defines no hosts", {BAD: "all:\n  vars: {a: 1}\n"}),
    Case("inv-connection", ("launch", "-i", BAD), "ansible_connection 'telnet'",
         {BAD: inventory_with(ansible_connection="telnet")}),
    Case("inv-port-range", ("status", "-i", BAD), "ansible_port 70000 is not a port number",
         {BAD: inventory_with(ansible_port=70000)}),
    Case("inv-port-word", ("patch", "audit", "-i", BAD), "ansible_port 'ssh'",
         {BAD: inventory_with(ansible_port="ssh")}),
    Case("inv-range-empty", ("hosts", "-i", BAD), "host range 'gpu[05:01]' is reversed",
         {BAD: "all:\n  hosts:\n    gpu[05:01]:\n"}),
    Case("inv-group-cycle", ("launch", "-i", BAD), "recursive dependency loop",
         {BAD: "all:\n  children:\n    a:\n      children:\n        b:\n          children:\n"
               "            a:\n              hosts: {h: }\n"}),
    Case("inv-missing", ("launch", "-i", "no-such.yml"), "does not exist"),
    Case("inv-folder", ("status", "-i", "."), "holds no inventory file"),
    Case("host-vars-yaml", ("status", "-i", "inv.yml"), "malformed YAML",
         {"inv.yml": inventory_with(), "host_vars/alpha.yml": "python: [\n"}),
    Case("inv-timeout-word", ("status", "-i", BAD), "deployctl_connect_timeout 'soon'",
         {BAD: inventory_with(deployctl_connect_timeout="soon")}),
    Case("inv-duplicate-key", ("stop", "-i", BAD), "duplicate key 'gpus'",
         {BAD: "all:\n  children:\n    gpus: {hosts: {alpha: {}}}\n    gpus: {hosts: {bravo: {}}}\n"}),
    Case("inv-range-no-end", ("hosts", "-i", BAD), "has no end",
         {BAD: "all:\n  hosts:\n    gpu[01:]: {}\n"}),
    Case("inv-timeout-inf", ("status", "-i", BAD), "command_timeout inf is not a number",
         {BAD: inventory_with(command_timeout=float("inf"))}),
    Case("inv-port-superscript", ("status", "-i", BAD), "ansible_port '²' is not a port number",
         {BAD: inventory_with(ansible_port="²")}),
    Case("inv-yaml-deep", ("hosts", "-i", BAD), "nested too deeply",
         {BAD: "all:\n  hosts: {h: {}}\n  vars: {x: " + "[" * 5000 + "]" * 5000 + "}\n"}),
    Case("inv-groups-deep", ("hosts", "-i", BAD), "nested too deeply",
         {BAD: "all: " + "".join(f"{{children: {{g{i}: " for i in range(600))
          + "{hosts: {h: {}}}" + "}}" * 600 + "\n"}),
    # -- host patterns --
    Case("unknown-host", ("launch", "-i", INV, "-H", "zulu"), "no host or group named 'zulu'"),
    Case("unknown-group", ("status", "-i", INV, "-H", "alpha,h100"), "no host or group named 'h100'"),
    Case("glob-selects-nothing", ("stop", "-i", INV, "-H", "gpu*"), "no host or group named 'gpu*'"),
    Case("intersection-empty", ("launch", "-i", INV, "-H", "alpha:&bravo"), "matches no host"),
    Case("exclusion-empty", ("stop", "-i", INV, "-H", "all:!alpha:!bravo"), "matches no host"),
    Case("pattern-json", ("status", "--json", "-i", INV, "-H", "nope"), "no host or group"),
    Case("pattern-empty", ("stop", "-i", INV, "-H", ""), "empty host pattern"),
    Case("pattern-blank", ("launch", "-i", INV, "-H", " , "), "empty host pattern"),
    Case("pattern-separators", ("restart", "-i", INV, "-H", ":,:"), "empty host pattern"),
    # -- templates and variables --
    Case("unknown-template", ("launch", "-i", INV, "--template", "eagle4"),
         "unknown template 'eagle4'"),
    Case("unknown-template-render", ("render", "-i", INV, "--template", "eagle4"),
         "unknown template 'eagle4'", form="host"),
    Case("missing-variable", ("launch", "-i", BAD), "needs variable 'model_path'",
         {BAD: inventory_with(model_path=None)}),
    Case("missing-variable-render", ("render", "-i", BAD), "needs variable 'draft_model_path'",
         {BAD: inventory_with(draft_model_path=None)}, form="host"),
    Case("template-syntax", ("launch", "-i", INV, "--template", "broken"), "template 'broken'",
         {"templates/broken.j2": "{{ python -m x\n"}),
    Case("template-unbalanced", ("launch", "-i", INV, "--template", "odd"), "unbalanced command",
         {"templates/odd.j2": "{{ python }} -m x 'oops\n"}),
    Case("template-not-utf8", ("launch", "-i", INV, "--template", "latin"), "not UTF-8",
         {"templates/latin.j2": b"{{ python }} -m x # caf\xe9\n"}),
    Case("template-sandbox", ("launch", "-i", INV, "--template", "evil"), "is unsafe",
         {"templates/evil.j2": "{{ python }} -m x {{ cycler.__init__.__globals__.os.popen('id') }}\n"}),
    Case("template-attribute", ("launch", "-i", INV, "--template", "attr"),
         "has no attribute 'nope'", {"templates/attr.j2": "{{ python }} -m x {{ model_path.nope }}\n"}),
    # -- --set --
    Case("set-no-equals", ("launch", "-i", INV, "--set", "tp"), "--set 'tp' is not KEY=VALUE"),
    Case("set-empty-key", ("render", "-i", INV, "--set", "=8"), "is not KEY=VALUE"),
    Case("set-bad-key", ("launch", "-i", INV, "--set", "1tp=8"), "is not KEY=VALUE"),
    Case("set-space-key", ("launch", "-i", INV, "--set", "model path=/m"), "is not KEY=VALUE"),
    Case("set-connection", ("render", "-i", INV, "--set", "ansible_host=10.1.1.1"),
         "--set cannot change how hosts are reached"),
    Case("tp-superscript", ("launch", "-i", INV, "--set", "tp=²"), "--tp-size '²' is not a number"),
    Case("port-superscript", ("launch", "-i", INV, "--set", "port=²"), "--port '²' is not a port"),
    # -- --threshold and other options --
    Case("threshold-0", ("launch", "-i", INV, "--threshold", "0"), "--threshold", code=2),
    Case("threshold-neg", ("launch", "-i", INV, "--threshold", "-1"), "--threshold", code=2),
    Case("threshold-word", ("render", "-i", INV, "--threshold", "abc"), "--threshold", code=2),
    Case("threshold-float", ("launch", "-i", INV, "--threshold", "1.5"), "--threshold", code=2),
    Case("forks-0", ("status", "-i", INV, "--forks", "0"), "--forks", code=2),
    Case("timeout-0", ("launch", "-i", INV, "--timeout", "0"), "--timeout", code=2),
    Case("unknown-option", ("launch", "-i", INV, "--gpus", "8"), "--gpus", code=2),
    Case("unknown-command", ("deploy", "-i", INV), "No such command", code=2),
    Case("project-missing", ("launch", "-i", INV, "--project", "nowhere"), "does not exist"),
    # -- the server port and tp --
    Case("port-too-big", ("launch", "-i", INV, "--set", "port=70000"), "--port '70000' is not a port number"),
    Case("port-zero", ("launch", "-i", INV, "--set", "port=0"), "--port '0'"),
    Case("port-word", ("launch", "-i", INV, "--set", "port=http"), "--port 'http'"),
    Case("port-render", ("render", "-i", INV, "--set", "port=65536"), "--port '65536'", form="host"),
    Case("tp-word", ("launch", "-i", INV, "--set", "tp=eight"), "--tp-size 'eight'"),
    # -- patch sets --
    Case("unknown-set-apply", ("patch", "apply", "spec-disable2", "-i", INV),
         "unknown patch set 'spec-disable2'"),
    Case("unknown-set-revert", ("patch", "revert", "nope", "-i", INV), "unknown patch set 'nope'"),
    Case("unknown-set-audit", ("patch", "audit", "--expect", "nope", "-i", INV),
         "unknown patch set 'nope'"),
    Case("no-set-named", ("patch", "apply", "-i", INV), "no patch sets named"),
    Case("patch-missing-fields", ("patch", "apply", "marker", "-i", INV), "lacks required field",
         patch_set(yml="name: marker\nversion: 1.0.0\n")),
    Case("patch-yaml", ("launch", "-i", INV), "malformed YAML", patch_set(yml="name: [marker\n")),
    Case("patch-version", ("patch", "apply", "marker", "-i", INV), "is not dotted numbers",
         patch_set(yml="name: marker\nversion: one\ndescription: x\nvariants: {'0.5.23': {}}\n")),
    Case("patch-name-folder", ("patch", "list"), "must match its folder name",
         patch_set(folder="other")),
    Case("patch-diff-missing", ("render", "-i", INV), "does not exist",
         {"patches/marker/patch.yml": patch_set()["patches/marker/patch.yml"]}),
    Case("patch-escapes", ("patch", "apply", "marker", "-i", INV), "escapes the site-packages",
         patch_set(diff=DIFF.replace("a/sglang", "a/../../etc").replace("b/sglang", "b/../../etc"))),
    Case("patch-absolute", ("patch", "apply", "marker", "-i", INV), "escapes the site-packages",
         patch_set(diff=DIFF.replace("a/sglang/version.py", "/etc/passwd")
                   .replace("b/sglang/version.py", "/etc/passwd"))),
    Case("patch-diff-not-utf8", ("patch", "apply", "marker", "-i", INV), "not UTF-8",
         patch_set(diff=DIFF.encode().replace(b"-a\n", b"-caf\xe9\n"))),
    Case("patch-not-a-diff", ("patch", "apply", "marker", "-i", INV), "not a unified diff",
         patch_set(diff="just text\n")),
    Case("patch-cycle", ("patch", "apply", "marker", "-i", INV), "in a cycle",
         patch_set(yml="name: marker\nversion: 1.0.0\ndescription: x\nrequires: [marker]\n"
                       "variants:\n  '0.5.23':\n    diffs: [0.5.23/marker.diff]\n")),
    # -- logs and crash signatures --
    Case("log-file-missing", ("crash", "--file", "nope.log"), "does not exist"),
    Case("log-file-folder", ("crash", "--file", "."), "is a directory"),
    Case("crash-two-sources", ("crash", "--run", "a_v1", "--path", "/x.log", "-i", INV),
         "only one of", code=2),
    Case("signatures-not-utf8", ("crash", "--file", "x.log"), "signatures.yml",
         {"x.log": "", "signatures.yml": b"- id: caf\xe9\n", "templates/.keep": ""}),
    # -- asked on the hosts, refused there --
    Case("no-such-run", ("crash", "--run", "eagle3_v9", "-i", INV), "no run eagle3_v9 recorded",
         form="host"),
    Case("remote-log-missing", ("logs", "--path", "~/nope.log", "-i", INV), "does not exist",
         form="host"),
    Case("model-path-missing", ("launch", "-i", INV, "--set", "model_path=/no/such/model"),
         "/no/such/model does not exist", form="host"),
    Case("tp-more-than-gpus", ("launch", "-i", INV, "--set", "tp=4"),
         "tensor parallelism 4 needs 4 GPUs", form="host"),
    Case("python-missing", ("launch", "-i", BAD), "/no/python3 on",
         {BAD: inventory_with(python="/no/python3")}, form="host"),
    Case("no-sglang", ("patch", "apply", "spec-disable", "-i", INV), "SGLang is not installed",
         form="host"),
    Case("unknown-host-key", ("status", "-i", BAD), "is not known",
         {BAD: inventory_with(known_hosts_file="empty_known_hosts"), "empty_known_hosts": ""},
         form="host"),
    # Deployments.
    Case("deployment-bad-option", ("status", "-i", INV, "-d", "Qwen_A"), "is not a deployment name"),
    Case("deployment-unknown", ("launch", "-i", INV, "-d", "qwen-a"), "no deployment 'qwen-a'"),
    Case("deployment-bad-name", ("launch", "-i", BAD), "deployment name 'Qwen' is not allowed",
         {BAD: inventory_with(deployments={"Qwen": {"port": 30001}})}),
    Case("deployment-reach", ("stop", "-i", BAD), "cannot set ansible_port",
         {BAD: inventory_with(deployments={"q": {"ansible_port": 2222}})}),
    Case("gpus-repeated", ("launch", "-i", BAD), "gpus lists GPU 1 twice",
         {BAD: inventory_with(gpus=[1, 1])}),
    Case("gpus-word", ("render", "-i", BAD), "deployctl_gpus 'all' is not a list of GPU indices",
         {BAD: inventory_with(deployctl_gpus="all")}),
    # Every number deployctl reads is checked where the inventory is read.
    Case("dist-port-word", ("launch", "-i", BAD),
         "host alpha, deployment d: dist_port 'abc' is not a port number (1-65535)",
         {BAD: inventory_with(deployments={"d": {"dist_port": "abc"}})}),
    Case("dist-port-range", ("launch", "-i", BAD), "dist_port 99999 is not a port number",
         {BAD: inventory_with(dist_port=99999)}),
    Case("dist-port-set", ("launch", "-i", INV, "--set", "dist_port=abc"),
         "--set: dist_port 'abc' is not a port number"),
    Case("tp-zero", ("launch", "-i", BAD), "tp 0 is not a number of GPUs",
         {BAD: inventory_with(tp=0)}),
    Case("node-rank-negative", ("launch", "-i", BAD), "node_rank -1 is not a rank (0 or more)",
         {BAD: inventory_with(node_rank=-1)}),
    Case("nnodes-zero", ("render", "-i", BAD), "deployctl_nnodes 0 is not a number of nodes",
         {BAD: inventory_with(deployctl_nnodes=0)}),
    Case("timeout-zero", ("stop", "-i", BAD), "command_timeout 0 is not a number of seconds",
         {BAD: inventory_with(command_timeout=0)}),
    Case("patches-mapping", ("patch", "apply", "-i", BAD),
         "deployctl_patches {'a': 1} is not a list of patch set names",
         {BAD: inventory_with(deployctl_patches={"a": 1})}),
    Case("check-flags-word", ("launch", "-i", BAD),
         "deployctl_check_flags 'no' is not a boolean (true or false)",
         {BAD: inventory_with(deployctl_check_flags="no")}),
    Case("deployments-share-gpus", ("launch", "-i", BAD), "would share GPUs",
         {BAD: inventory_with(deployments={"a": {"gpus": [0]}, "b": {"gpus": [0, 1]}})}),
    Case("deployments-share-port", ("launch", "-i", BAD), "would share port 30001",
         {BAD: inventory_with(deployments={"a": {"gpus": [0], "port": 30001},
                                           "b": {"gpus": [1], "port": 30001}})}),
    Case("workers-share-url", ("stop", "-i", BAD), "have one worker URL, http://10.0.0.5:30000",
         {BAD: inventory_with(deployments={
             "a": {"gpus": [0], "router": "edge", "worker_url": "http://10.0.0.5:30000"},
             "b": {"gpus": [1], "router": "edge", "worker_url": "http://10.0.0.5:30000/"}})}),
    Case("gpu-not-on-host", ("launch", "-i", INV, "--set", "gpus=5"), "GPU 5 not on",
         form="host"),
    # -- tune --
    Case("tune-two-bounds", ("tune", "-i", INV, "--max-itl-ms", "20", "--max-ttft-ms", "500"),
         "give one of --max-itl-ms and --max-ttft-ms"),
    Case("tune-objective", ("tune", "-i", INV, "--objective", "latency"), "--objective", code=2),
    Case("tune-objective-and-bound", ("tune", "-i", INV, "--objective", "throughput",
                                      "--max-ttft-ms", "500"), "are two objectives"),
    Case("tune-number-alone", ("tune", "-i", INV, "3"), "a tune number is given only with --report"),
    Case("canary-number-alone", ("canary", "-i", INV, "3"), "a canary number is given only with --report"),
    Case("canary-report-no-router", ("canary", "-i", INV, "--report"), "no selected deployment is a router or behind one"),
    Case("tune-levels", ("tune", "-i", INV, "--concurrency", "1,0"), "not a list of positive numbers"),
    Case("tune-min-ratio", ("tune", "-i", INV, "--min-ratio", "1.5"), "--min-ratio", code=2),
    Case("tune-keep", ("tune", "-i", INV, "--keep", "all"), "--keep", code=2),
    Case("tune-plot-format", ("tune", "-i", INV, "--plot", "curves.pdf"), "must end in .png or .svg"),
    Case("tune-html-folder", ("tune", "-i", INV, "--html", "nowhere/report.html"),
         "folder nowhere does not exist"),
    Case("tune-plot-two-hosts", ("tune", "-i", INV, "--plot", "curves.png"),
         "--plot and --html draw one tune"),
    Case("tune-not-speculative", ("tune", "-i", INV, "--template", "baseline"),
         "template 'baseline' does not speculate"),
    Case("tune-threshold-word", ("launch", "-i", BAD),
         "deployctl_threshold 'five' is not a batch size (1 or more)",
         {BAD: inventory_with(deployctl_threshold="five")}),
    # -- router and rollout --
    Case("rollout-unavailable", ("rollout", "-i", INV, "--max-unavailable", "0"),
         "--max-unavailable", code=2),
    Case("rollout-drain-timeout", ("rollout", "-i", INV, "--drain-timeout", "-1"),
         "--drain-timeout", code=2),
    Case("rolling-crashed", ("restart", "-i", INV, "--rolling", "--crashed"),
         "--rolling takes neither --crashed nor --no-wait"),
    Case("rolling-patch-no-set", ("patch", "apply", "-i", INV, "--rolling"),
         "--rolling needs the patch sets to change"),
    Case("router-sync-no-router", ("router", "sync", "-i", INV),
         "no router among the selected deployments"),
    Case("router-unknown", ("launch", "-i", BAD, "--dry-run"), "router 'nowhere/r' names no host",
         {BAD: inventory_with(router="nowhere/r")}, form="host"),
    Case("router-metrics-port", ("launch", "-i", BAD),
         "router_metrics_port 'x' is not a port number (1-65535)",
         {BAD: inventory_with(deployctl_router_metrics_port="x")}),
    # -- Slurm --
    Case("slurm-launcher", ("launch", "-i", BAD), "deployctl_launcher 'kubernetes' is not ssh or slurm",
         {BAD: inventory_with(deployctl_launcher="kubernetes")}),
    Case("slurm-time", ("launch", "-i", BAD),
         "deployctl_slurm_time 'soon' is not a Slurm time limit, e.g. 4:00:00, 90 or 1-12:00:00",
         {BAD: inventory_with(deployctl_slurm_time="soon")}),
    Case("slurm-extra-line", ("launch", "-i", BAD), "is not a list of sbatch options, each starting with -",
         {BAD: inventory_with(deployctl_slurm_extra=["--x=1\n#SBATCH --uid=0"])}),
    Case("slurm-loopback", ("launch", "-i", BAD), "is loopback: the server on its Slurm node could not",
         {BAD: inventory_with(launcher="slurm")}, form="host"),
    Case("watch-renew-before", ("watch", "-i", INV, "--renew-before", "soon"),
         "--renew-before 'soon' is not a time"),
    Case("canary-max-duration", ("canary", "-i", INV, "--max-duration", "soon"),
         "--max-duration 'soon' is not a time"),
]  # fmt: skip


@pytest.fixture(scope="module")
def battery(lab: SSHLab) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Two launchable hosts (stand-in, model, 2 clean GPUs) and their inventory."""
    for host in lab.hosts.values():
        host.reset()
    folder = Path(tempfile.mkdtemp(prefix="battery-", dir=lab.base))
    host_vars = {name: prepare(lab.hosts[name]) for name in BATTERY_HOSTS}
    inventory = lab.inventory(folder / "inv.yml", BATTERY_HOSTS, host_vars)
    yield inventory, yaml.safe_load(inventory.read_text())
    for host in lab.hosts.values():
        host.kill_processes()


def run_case(case: Case, cli: CLI, inventory: Path, base: dict[str, Any]) -> list[str]:
    """Run one case from a working folder of its own; return what it got wrong."""
    for relpath, content in case.files.items():
        path = cli.cwd / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content(base) if callable(content) else content
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    args = [a.replace(INV, str(inventory)) for a in case.args]
    result = cli(*args, timeout=60)
    try:
        no_traceback(result)
        assert result.returncode == case.code, f"exit {result.returncode}: {result.stderr}"
        first = check_error_form(result, case.form, BATTERY_HOSTS)
        assert case.expect in first, first
        if "--json" in args and case.form == "error":
            # No half document before the error: exactly one, saying the command failed.
            document = json.loads(result.stdout)
            assert document["ok"] is False and document["code"], result.stdout
            assert one_line(document["error"]) in first, (document, first)
    except AssertionError as exc:
        return [f"{case.id}: {' '.join(str(exc).split())[:600]}"]
    return []


def test_bad_input_battery(
    battery: tuple[Path, dict[str, Any]], lab: SSHLab, client_home: Path, tmp_path: Path
) -> None:
    """Each case: one error line, non-zero exit, no traceback, every host left as it was.

    Cases refused locally run three at a time (the CLI's start-up dominates); cases that
    reach the hosts run one by one, each between two snapshots of every host.
    """
    inventory, base = battery

    def cli_for(case: Case) -> CLI:
        work = tmp_path / case.id
        work.mkdir()
        return CLI(work, client_home)

    local = [c for c in CASES if c.form == "error"]
    remote = [c for c in CASES if c.form != "error"]
    assert len(CASES) >= 30
    problems: list[str] = []
    before = home_snapshot(lab)
    with ThreadPoolExecutor(max_workers=3) as pool:
        for found in pool.map(lambda c: run_case(c, cli_for(c), inventory, base), local):
            problems += found
    try:
        assert_homes_unchanged(before, lab)
        assert user_processes(lab) == []
    except AssertionError as exc:
        problems.append(f"one of the local cases touched a host: {exc}")
    for case in remote:
        before = home_snapshot(lab)
        problems += run_case(case, cli_for(case), inventory, base)
        try:
            assert_homes_unchanged(before, lab)
            assert user_processes(lab) == []
        except AssertionError as exc:
            problems.append(f"{case.id}: {exc}")
    assert problems == [], "\n".join(problems)
    print(f"bad inputs tried: {len(CASES)}, all clear")


# ---- logs that are odd but not wrong --------------------------------------------------------

LATIN1_CRASH = (
    "[2026-11-29 10:12:20] Chargement du modèle\n".encode("latin-1")
    + b"\x00\x01binary\xff\xfe junk\n"
    + (
        b"[2026-11-29 10:12:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        b'  File "/env/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 3012,'
        b" in run_scheduler_process\n"
        b"    scheduler.event_loop_overlap()\n"
        b"RuntimeError: The size of tensor a (160) must match the size of tensor b (2)\n"
        b"\n"
        b"[2026-11-29 10:12:20] Received sigquit from a child process. It usually means the child "
        b"failed.\n"
    )
)
ODD_LOGS = {"empty.log": b"", "binary.log": bytes(range(256)) * 64, "latin1.log": LATIN1_CRASH}


def test_odd_logs_are_scanned_not_refused(
    battery: tuple[Path, dict[str, Any]], lab: SSHLab, cli: CLI
) -> None:
    """An empty or non-UTF-8 log is still a log: scanned with no traceback, crashes found.

    Not refused with an error: "no crash found (scanned 0 B of 0 B)" is the true answer for an
    empty log, and a crash must be found even among bytes that are not UTF-8.
    """
    inventory, _ = battery
    alpha = lab.hosts["alpha"]
    for name, content in ODD_LOGS.items():
        (cli.cwd / name).write_bytes(content)
        (alpha.home / name).write_bytes(content)
        subprocess.run(["chown", f"{alpha.user}:{alpha.user}", str(alpha.home / name)], check=True)
    before = home_snapshot(lab)
    remote = ("-i", str(inventory), "-H", "alpha")
    runs: list[tuple[tuple[str, ...], str | None]] = [
        *[(("crash", "--file", name), name) for name in ODD_LOGS],
        (("crash", "--path", "~/empty.log", *remote), "empty.log"),
        (("crash", "--all", "--path", "~/latin1.log", *remote), "latin1.log"),
        (("logs", "--path", "~/binary.log", *remote), None),
    ]
    for args, scanned in runs:
        result = cli(*args)
        assert result.stderr == "", result.stderr
        if scanned is None:
            assert result.returncode == 0
        elif scanned == "latin1.log":
            assert result.returncode == 1, result.stdout
            assert "RuntimeError: The size of tensor a (160)" in result.stdout
        else:
            assert result.returncode == 0, result.stdout
            assert "no crash found" in result.stdout
    assert_homes_unchanged(before, lab)


def test_the_open_files_limit_is_lifted_to_the_hard_limit() -> None:
    """A fleet command holds about one descriptor per host plus a few per fork: a soft
    limit of 1,024 would fail a thousand hosts, so the CLI lifts it to the hard limit first."""
    import resource
    import sys

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    probe = (
        "import resource; from deployctl.cli import raise_open_files_limit; "
        "raise_open_files_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], preexec_fn=low_soft_limit, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4096", "4096"]
