"""Preflight asks the host's own SGLang whether it accepts the command.

The option names come from the real SGLang 0.5.23 wheel's declarations, read statically by the
agent (deployctl.remote.sglang_options.declared_options); tests/data/sglang/sglang-0.5.23-options.json is
SGLang's own parser for the same wheel, captured on the device machine with
scripts/capture-sglang-options, and the two must agree.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from deployctl.errors import DeployctlError, PreflightError
from deployctl.inventory import DEFAULT_VARS, Host, load_inventory
from deployctl.ops.flags import adaptive_graph_warning, check_reading, server_argv
from deployctl.project import SHIPPED_DATA
from deployctl.remote import protocol
from deployctl.remote import sglang_options as remote_options
from deployctl.remote.protocol import OptionSpec
from deployctl.remote.server_argv import DEPLOYCTL_OPTIONS, CommandValues
from deployctl.remote.sglang_options import (
    check_server_argv,
    declared_options,
    sglang_options,
)
from deployctl.render import ADAPTIVE_CONFIG_FLAG, ADAPTIVE_FLAG, TemplateSet
from tests.conftest import CLI
from tests.sglang_wheel import SGLANG_VERSION, extract_site, install_on
from tests.sshd_hosts import STANDIN, SSHLab
from tests.test_lifecycle import prepare
from tests.test_sharing import plans

DATA = Path(__file__).parent / "data" / "sglang"
PATCHES = SHIPPED_DATA / "patches"
AMBIGUOUS = "--cuda-graph-max-bs"
THRESHOLD = "--speculative-disable-batch-threshold"


# Its fixtures read SGLang's declarations from two unpacked wheels (~1 s of CPU): on one
# xdist worker, they are read once.
pytestmark = pytest.mark.xdist_group("argv_check")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_site(SGLANG_VERSION, tmp_path_factory.mktemp("pristine"))


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with the shipped spec-disable set's diff applied (fuzz 0)."""
    site = extract_site(SGLANG_VERSION, tmp_path_factory.mktemp("patched"))
    diff = PATCHES / "spec-disable" / SGLANG_VERSION / "spec-disable.diff"
    subprocess.run(["patch", "-p1", "-F0", "-s", "-d", str(site), "-i", str(diff)], check=True)
    return site


@pytest.fixture(scope="module")
def options(pristine: Path) -> dict[str, OptionSpec]:
    found = declared_options(str(pristine))
    assert found is not None
    return found


def errors(argv: list[str], options: dict[str, OptionSpec]) -> list[str]:
    return [f["message"] for f in check_server_argv(argv, options) if f["level"] == "error"]


@pytest.mark.heavy
def test_declarations_agree_with_sglangs_own_parser(options: dict[str, OptionSpec]) -> None:
    captured = json.loads((DATA / f"sglang-{SGLANG_VERSION}-options.json").read_text())
    parser = {name: o for o in captured["options"] for name in o["names"]}
    assert set(options) == set(parser)
    assert len(options) > 500
    for name, spec in options.items():
        real = parser[name]
        assert spec["dest"] == real["dest"], name
        if real["nargs"] == "0":
            assert spec["kind"] in ("flag", "any"), name
        elif spec["kind"] != "any":
            assert spec["kind"] != "flag", name
            assert (spec["kind"] == "list") == (real["nargs"] in ("+", "*")), name
        if spec["type"] is not None:
            assert spec["type"] == real["type"], name
        if spec["choices"] is not None:
            assert sorted(map(str, spec["choices"])) == real["choices"], name


@pytest.mark.heavy
def test_reading_the_declarations_takes_milliseconds(pristine: Path) -> None:
    install: protocol.SglangInstall = {"site": str(pristine), "version": SGLANG_VERSION}
    cpu_started = time.process_time()
    check = remote_options.argv_check(["--model-path=/m"], install)
    cpu = time.process_time() - cpu_started
    assert check["method"] == "declarations" and check["options"] > 500
    assert check["findings"] == []
    assert check["seconds"] >= 0
    # About 30 ms; CPU time, as a loaded machine stretches the wall time many times over.
    # The bound only catches a runaway (an import of SGLang, a re-read).
    assert cpu < 1.0, f"took {cpu:.3f} CPU-s, bound 1.0 s"


def test_every_shipped_template_passes_for_every_example_host(
    pristine: Path, patched: Path
) -> None:
    inventory = load_inventory(SHIPPED_DATA / "inventories" / "example.yml")
    templates = TemplateSet([SHIPPED_DATA / "templates"])
    pristine_options = declared_options(str(pristine))
    patched_options = declared_options(str(patched))
    assert pristine_options is not None and patched_options is not None
    checked = 0
    for host in inventory.hosts.values():
        for name in ("baseline", "eagle3"):
            for threshold, options in ((None, pristine_options), (5, patched_options)):
                rendered = templates.render(host, name, threshold if name == "eagle3" else None)
                argv = server_argv(rendered.argv)
                assert argv is not None
                findings = check_server_argv(argv, options)
                assert findings == [], (host.name, name, findings)
                checked += 1
    assert checked == 4 * len(inventory.hosts)


def test_bare_cuda_graph_max_bs_is_ambiguous_naming_both(options: dict[str, OptionSpec]) -> None:
    [message] = errors([f"{AMBIGUOUS}=8"], options)
    assert message == (
        f"{AMBIGUOUS} is ambiguous: it could be {AMBIGUOUS}-decode, {AMBIGUOUS}-prefill"
    )


def test_threshold_flag_needs_the_patch(options: dict[str, OptionSpec], patched: Path) -> None:
    assert errors([f"{THRESHOLD}=5"], options) == [f"{THRESHOLD} is not an option of this SGLang"]
    applied = declared_options(str(patched))
    assert applied is not None
    assert errors([f"{THRESHOLD}=5"], applied) == []
    assert errors([f"{THRESHOLD}=five"], applied) == [
        f"{THRESHOLD}: expected an integer, got 'five'"
    ]


@pytest.mark.parametrize(
    ("argv", "level", "message"),
    [
        (["--tp", "8"], "warning", "--tp is an abbreviation of --tp-size; write --tp-size"),
        (["--tp=8"], "warning", "--tp is an abbreviation of --tp-size"),
        (["--tp-size=eight"], "error", "--tp-size: expected an integer, got 'eight'"),
        (["--tensor-parallel-size", "x"], "error", "expected an integer, got 'x'"),
        (["--mem-fraction-static=most"], "error", "expected a number, got 'most'"),
        (["--dtype=fp7"], "error", "'fp7' is not one of the choices (auto, half,"),
        (["--enable-metrics=yes"], "error", "--enable-metrics takes no value"),
        (["--port"], "error", "--port needs a value"),
        (["--attention-backed=fa3"], "error", "(did you mean --attention-backend, "),
        (["--no-such-flag"], "error", "--no-such-flag is not an option of this SGLang"),
        (["stray"], "error", "unexpected argument 'stray'"),
    ],
)
def test_flag_findings(
    options: dict[str, OptionSpec], argv: list[str], level: str, message: str
) -> None:
    findings = check_server_argv(argv, options)
    assert [f["level"] for f in findings] == [level], findings
    assert message in findings[0]["message"]


def test_an_option_given_twice_takes_the_last_as_deployctl_reads_it(
    options: dict[str, OptionSpec],
) -> None:
    # argparse keeps the last; so does deployctl's reading, so the check has nothing to say.
    assert check_server_argv(["--tp-size=8", "--tp", "1"], options) == [
        {
            "level": "warning",
            "flag": "--tp",
            "message": "--tp is an abbreviation of --tp-size; write --tp-size",
            "candidates": ["--tp-size"],
        }
    ]
    assert CommandValues(["--tp-size=8", "--tp", "1"]).get("tp_size") == "1"
    assert check_server_argv(["--port=1", "--port", "2"], options) == []


def reading(argv: list[str], **variables: Any) -> None:
    """check_reading of a baseline server's command with extra_args `argv`, as render runs it."""
    host = Host("h1", {**DEFAULT_VARS, "model_path": "/m", "tp": 8, **variables})
    rendered = TemplateSet([SHIPPED_DATA / "templates"]).render(host, "baseline", None)
    check_reading(host, CommandValues([*rendered.argv, *argv]))


def test_an_option_deployctl_also_takes_from_the_inventory_must_agree_with_it() -> None:
    # The server would run with --tp 2; status, watch and a pair's checks read `tp`.
    with pytest.raises(PreflightError) as refused:
        reading(["--tp", "2"])
    assert refused.value.message == (
        "the command gives --tp-size 2 (--tp 2) but `tp` is 8: the server would run with 2, "
        "deployctl's other commands would use 8"
    )
    assert refused.value.hint == (
        "set `tp: 2` in the inventory (or --set tp=2) instead of giving the flag in extra_args"
    )
    with pytest.raises(PreflightError, match=r"--port 1 \(--port=1\) but `port` is 30000"):
        reading(["--port=1"])
    with pytest.raises(PreflightError, match=r"--host :: \(--host ::\) but `bind_host` is"):
        reading(["--host", "::"])
    # Given only in extra_args: watch and the router would not know it for a prefill.
    with pytest.raises(PreflightError, match=r"--disaggregation-mode prefill .* `role` is null"):
        reading(["--disaggregation-m=prefill"])
    with pytest.raises(PreflightError, match="`bootstrap_port` is 8998"):
        reading(["--disaggregation-bootstrap-port", "9000"], role="prefill")
    with pytest.raises(PreflightError, match="`model_path` is /m"):
        reading(["--model", "/other"])
    # The inventory's own value, in any spelling, or an option read only from the command.
    reading(["--tensor-parallel-size", "8", "--port=30000", "--disaggregation-mode", "null"])
    reading(["--mem-frac=0.8", "--disaggregation-bootstrap-port=9000"])  # not a prefill
    with pytest.raises(PreflightError, match=r"^--node-rank is given twice \(--node-rank=0, "):
        reading(["--node-rank=0", "--node-rank", "1"])


def test_a_launch_plans_what_the_server_will_take_or_is_refused() -> None:
    # SGLang takes the last --tp: a plan of the template's --tp-size=1 would give it 1 GPU.
    with pytest.raises(DeployctlError, match=r"h1/p: the command gives --tp-size 2 \(--tp 2\)"):
        plans({"p": {"extra_args": ["--tp", "2"]}})
    [p] = plans({"p": {"tp": 2, "extra_args": ["--tensor-parallel-size=2", "--mem-frac", "0.5"]}})
    assert (p.tp, p.mem_fraction) == (2, 0.5)


def test_the_server_arguments_are_found_after_its_own_launcher() -> None:
    assert server_argv(["numactl", "-m", "0", "python3", "-m", "sglang.launch_server", "--x"]) == [
        "--x"
    ]
    assert server_argv(["/opt/env/bin/sglang", "serve", "--model-path=/m"]) == ["--model-path=/m"]
    assert server_argv(["my-wrapper", "--model-path=/m"]) is None  # not checked


def test_values_are_not_taken_for_flags(options: dict[str, OptionSpec]) -> None:
    argv = ["--model-path", "/m", "--port", "30000", "--mem-fraction-static", "0.88",
            "--trust-remote-code", "--json-model-override-args", '{"a": 1}',
            "--random-seed", "-1", "--served-model-name=-dash-name",
            "--served-model-name", "-x y", "--mem-fraction-static", "-.5"]  # fmt: skip
    assert check_server_argv(argv, options) == []
    # argparse (3.11) reads `-1e-3` as an option, not a negative number: the value is missing.
    assert errors(["--mem-fraction-static", "-1e-3"], options)[0] == (
        "--mem-fraction-static needs a value"
    )


# ---- deployctl reads the command as SGLang's parser will -------------------------------------


def sglang_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's own parser rebuilt from its captured option list, every value kept as
    the text given (a switch as "") and no defaults: what the command itself sets."""
    captured = json.loads((DATA / f"sglang-{SGLANG_VERSION}-options.json").read_text())
    parser = argparse.ArgumentParser(add_help=False)
    for option in captured["options"]:
        if option["nargs"] == "0":
            parser.add_argument(
                *option["names"], dest=option["dest"], action="store_const", const=""
            )
        else:
            parser.add_argument(*option["names"], dest=option["dest"], nargs=option["nargs"])
    return parser


READ = sorted({spec["dest"] for spec in DEPLOYCTL_OPTIONS.values()})


def parsed(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any] | None:
    """What SGLang's parser takes of the options deployctl reads; None: it refuses argv."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            namespace = parser.parse_args(argv)
    except SystemExit:
        return None
    return {d: getattr(namespace, d) for d in READ if getattr(namespace, d) is not None}


def read_by_deployctl(argv: list[str]) -> dict[str, Any]:
    """What deployctl reads: each option's value, every value of a list option."""
    values = CommandValues(argv)
    read: dict[str, Any] = {}
    for dest in READ:
        given = values.last(dest)
        if given is not None:
            listed = DEPLOYCTL_OPTIONS[given.option]["kind"] == "list"
            read[dest] = given.values if listed else values.get(dest)
    return read


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", "/m", "--mem-frac=0.8"],
        ["--mem-fraction-static=0.4", "--mem-frac", "0.8"],
        ["--mem-fraction-static", "0.8", "--mem-fraction-static=0.3"],
        ["--tp", "2"],
        ["--tp-size=8", "--tensor-parallel-size", "4"],
        ["--tensor-parallel-size=4", "--tp-size", "2", "--tp=3"],
        ["--model", "/a", "--model-path=/b", "--speculative-draft-model", "/d"],
        ["--disaggregation-mode=prefill", "--disaggregation-bootstrap-port", "9000",
         "--disaggregation-transfer-backend", "nixl", "--disaggregation-ib-device", "mlx5_0"],
        ["--disaggregation-m", "decode", "--disaggregation-b=9001", "--disaggregation-t=nixl"],
        ["--host=0.0.0.0", "--port", "30001", "--port=30002", "--host", "::1"],
        ["--random-seed", "-1", "--port", "7", "--mem-fraction-static", "-.5"],
        ["--served-model-name", "a b", "--json-model-override-args", '{"x": 1}', "--port=7"],
        ["--served-model-name=--port=1", "--port", "2"],
        ["--gc-threshold", "1", "2", "3", "--tp-size", "2", "--numa-node", "0", "1"],
        ["--disable-cuda-graph", "--cuda-graph-max-bs-d", "16", "--disable-cuda-graph-padding"],
        ["--nnodes", "2", "--node-rank=1", "--nccl-init-addr", "10.0.0.1:5000",
         "--dist-init-addr=10.0.0.2:5000"],
        ["--pipeline-parallel-size", "2", "--speculative-algorithm", "EAGLE3",
         "--speculative-num-steps=3", "--speculative-eagle-topk", "1", "--pp-size=4"],
        ["--enable-metrics", "--trust-remote-code", "--host", "-x y"],
        ["--cuda-graph-bs-decode", "1", "4", "16", "--cuda-graph-max-bs-decode=16"],
        ["--cuda-graph-bs-decode=8", "--cuda-graph-bs-dec", "2", "4", "--port", "7"],
    ],
)  # fmt: skip
def test_deployctl_reads_what_sglangs_parser_takes(argv: list[str]) -> None:
    sglang = parsed(sglang_parser(), argv)
    assert sglang is not None, argv  # each is a command SGLang 0.5.23 accepts
    assert read_by_deployctl(argv) == sglang


@pytest.mark.heavy
def test_every_name_and_prefix_sglang_takes_for_an_option_deployctl_reads_is_read_alike() -> None:
    parser = sglang_parser()
    captured = json.loads((DATA / f"sglang-{SGLANG_VERSION}-options.json").read_text())
    names = [n for o in captured["options"] if o["dest"] in READ for n in o["names"]]
    assert set(names) == set(DEPLOYCTL_OPTIONS)  # every spelling 0.5.23 has, and no other
    checked = refused = 0
    for name in names:
        for end in range(3, len(name) + 1):
            word = name[:end]
            takes = DEPLOYCTL_OPTIONS[name]["kind"] in ("value", "list")
            argv = [f"{word}=1"] if takes else [word]
            sglang = parsed(parser, argv)
            if sglang is None:  # ambiguous there: SGLang refuses it, and so does its check
                refused += 1
                continue
            assert read_by_deployctl(argv) == sglang, word
            checked += 1
    assert (checked, refused) == (217, 302)  # 0.5.23's spellings and their prefixes


def test_a_flag_this_sglang_reads_as_another_option_than_deployctl_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_layout(
        tmp_path, monkeypatch, "'--model-path', type=str", "'--tp-size', '--tps', type=int",
        "'--tp', type=str", "'--mem-fraction-static', type=float",
    )  # fmt: skip
    options, _, _ = sglang_options({"site": str(tmp_path), "version": "9.9"})
    assert options is not None
    # Here --tp is an option of its own: the server would not get a tensor parallelism.
    assert errors(["--tp=2"], options) == [
        "--tp is an option of its own to this SGLang but --tp-size to deployctl; "
        "write --tp-size for that"
    ]
    # A spelling deployctl does not know would pass it by.
    assert errors(["--tps=2"], options) == [
        "--tps is --tp-size to this SGLang but none of the options it reads to deployctl; "
        "write --tp-size"
    ]
    assert check_server_argv(["--mem-frac=0.5"], options)[0]["level"] == "warning"


def other_layout(
    site: Path, monkeypatch: pytest.MonkeyPatch, *calls: str, banner: str = ""
) -> Path:
    """A future SGLang without arg_groups/fields/ (only its parser can say what it takes),
    importable by the agent's parser fallback; returns its server_args.py."""
    package = site / "sglang" / "srt"
    package.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text(f"print({banner!r})\n" if banner else "")
    (package / "__init__.py").write_text("")
    body = "".join(f"        parser.add_argument({call})\n" for call in calls)
    server_args = package / "server_args.py"
    server_args.write_text(
        "class ServerArgs:\n    @staticmethod\n    def add_cli_args(parser):\n" + body
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    return server_args


def test_another_layout_falls_back_to_sglangs_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_layout(
        tmp_path, monkeypatch, "'--model-path', type=str", "'--tp-size', type=int",
        "'--enable-metrics', action='store_true'",
    )  # fmt: skip
    options, method, note = sglang_options({"site": str(tmp_path), "version": "9.9"})
    assert method == "parser" and options is not None and "SGLang's parser" in note
    assert sorted(options) == ["--enable-metrics", "--model-path", "--tp-size"]
    assert errors(["--tp-size=x"], options) == ["--tp-size: expected an integer, got 'x'"]


def test_no_installation_is_not_checked_and_not_refused() -> None:
    options, method, note = sglang_options({"error": "SGLang is not installed for python3"})
    assert (options, method) == (None, "none") and "not installed" in note


# ---- over sshd: preflight, launch --dry-run and render --check ----------------------------


def host_with_sglang(hosts: SSHLab, sglang_template: Path, tmp_path: Path, **extra: object) -> str:
    """alpha with the real wheel in its python (the stand-in as launcher, no GPU needed)."""
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    host_vars["python"] = install_on(alpha, sglang_template, standin=STANDIN)
    host_vars.update(extra)
    return str(hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars}))


def test_launch_is_refused_before_anything_starts(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inv = host_with_sglang(
        hosts, sglang_template, tmp_path, extra_args=[f"{AMBIGUOUS}=8", "--tp", "1"],
        template="baseline",
    )  # fmt: skip
    for args in (("launch", "--dry-run"), ("launch",)):
        result = cli(*args, "-i", inv, "--json")
        assert result.returncode == 1, result.stderr
        entry = json.loads(result.stdout)["hosts"]["alpha"]
        # The template's --tp-size=1, then extra_args' --tp 1: one value, read alike.
        assert entry["preflight"]["problems"] == [
            f"{AMBIGUOUS} is ambiguous: it could be {AMBIGUOUS}-decode, {AMBIGUOUS}-prefill "
            f"(SGLang {SGLANG_VERSION} on alpha)",
        ]
        assert entry["preflight"]["warnings"] == [
            f"--tp is an abbreviation of --tp-size; write --tp-size (SGLang {SGLANG_VERSION} on alpha)"
        ]
        assert entry["preflight"]["flags"]["method"] == "declarations"
    assert not (hosts.hosts["alpha"].home / "logs").exists() or not list(
        (hosts.hosts["alpha"].home / "logs").iterdir()
    )  # nothing started, no log written
    shown = cli("render", "--check", "-i", inv)
    assert shown.returncode == 1
    assert f"alpha: error: {AMBIGUOUS} is ambiguous" in shown.stderr
    assert "alpha: warning: --tp is an abbreviation of --tp-size" in shown.stderr


def test_threshold_is_refused_unpatched_and_accepted_once_applied(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inv = host_with_sglang(hosts, sglang_template, tmp_path, speculative_eagle_topk=1)
    refused = cli("render", "--check", "--threshold", "5", "-i", inv, "--json")
    assert refused.returncode == 1
    flags = json.loads(refused.stdout)["hosts"]["alpha"]["flags"]
    assert flags["problems"] == [
        f"{THRESHOLD} is not an option of this SGLang (SGLang {SGLANG_VERSION} on alpha); "
        "patch set spec-disable adds it"
    ]
    assert (
        "deployctl patch apply spec-disable -H alpha"
        in cli("render", "--check", "--threshold", "5", "-i", inv).stderr
    )
    assert cli("patch", "apply", "spec-disable", "-i", inv).returncode == 0
    accepted = cli("render", "--check", "--threshold", "5", "-i", inv, "--json")
    assert accepted.returncode == 0, accepted.stderr
    flags = json.loads(accepted.stdout)["hosts"]["alpha"]["flags"]
    assert flags["problems"] == [] and flags["method"] == "declarations"
    assert flags["options"] > 500
    dry = cli("launch", "--dry-run", "--threshold", "5", "-i", inv, "--json")
    assert dry.returncode == 0, dry.stderr


def test_stock_adaptive_with_graphs_is_warned_at_launch_and_deployctls_own_is_not(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inv = host_with_sglang(
        hosts, sglang_template, tmp_path, template="eagle3", extra_args=[ADAPTIVE_FLAG]
    )
    dry = cli("launch", "--dry-run", "-i", inv, "--json")
    assert dry.returncode == 0, dry.stderr
    (warning,) = json.loads(dry.stdout)["hosts"]["alpha"]["preflight"]["warnings"]
    assert warning.startswith(f"{ADAPTIVE_FLAG} without {ADAPTIVE_CONFIG_FLAG} drafts up to 7")
    shown = cli("render", "--check", "-i", inv)  # the flag check says it too
    assert f"alpha: warning: {warning}" in shown.stderr, shown.stderr
    own = host_with_sglang(
        hosts, sglang_template, tmp_path, template="eagle3", threshold_mode="adaptive"
    )
    dry = cli("launch", "--dry-run", "--threshold", "5", "-i", own, "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["hosts"]["alpha"]["preflight"]["warnings"] == []


def test_extra_args_changing_a_value_deployctl_takes_from_the_inventory_are_refused(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # No SGLang on the host: deployctl's own reading refuses it, before anything starts.
    alpha = hosts.hosts["alpha"]
    variables = {**prepare(alpha, tp=1), "template": "baseline", "extra_args": ["--tp", "2"]}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})
    for args in (("launch", "--dry-run"), ("launch", "--timeout", "60")):
        result = cli(*args, "-i", str(inv))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "the command gives --tp-size 2 (--tp 2) but `tp` is 1" in result.stderr
        assert "hint: set `tp: 2` in the inventory (or --set tp=2)" in result.stderr
    assert not (alpha.home / "model" / "standin-argv.jsonl").exists()


def test_check_flags_off_skips_the_check(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inv = host_with_sglang(
        hosts, sglang_template, tmp_path, extra_args=["--own-launcher-flag"], check_flags=False
    )
    result = cli("render", "--check", "-i", inv, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["hosts"]["alpha"]["flags"]["method"] == "off"


def test_a_checker_that_fails_does_not_stop_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(install: object) -> None:
        raise RuntimeError("unexpected layout")

    monkeypatch.setattr(remote_options, "sglang_options", broken)
    check = remote_options.argv_check(["--tp-size=2"], {"site": "/x", "version": "9"})
    assert check["method"] == "none" and check["findings"] == []
    assert "could not be checked: RuntimeError: unexpected layout" in check["note"]


def test_the_parser_fallback_reads_the_last_line_and_survives_garbage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_args = other_layout(
        tmp_path, monkeypatch, "'--tp-size', type=int", banner="banner from an import"
    )
    options, method, _ = sglang_options({"site": str(tmp_path), "version": "9.9"})
    assert method == "parser" and options is not None and list(options) == ["--tp-size"]
    server_args.write_text("raise SystemExit(0)\n")  # prints nothing at all
    options, method, note = sglang_options({"site": str(tmp_path), "version": "9.9"})
    assert (options, method) == (None, "none") and "SGLang's parser" in note


@pytest.mark.parametrize(
    ("extra", "warned"),
    [
        ([ADAPTIVE_FLAG], True),  # SGLang's default candidates (up to 7) over 3 steps, graphs on
        ([ADAPTIVE_FLAG, f"{ADAPTIVE_CONFIG_FLAG}=/tmp/a.json"], False),  # its own candidates
        ([ADAPTIVE_FLAG, "--disable-cuda-graph"], False),  # no graph to capture
        ([ADAPTIVE_FLAG, "--speculative-num-steps", "7"], False),  # the default fits
        ([], False),  # no adaptive speculation
    ],
)
def test_stock_adaptive_past_the_draft_steps_with_graphs_is_warned(
    extra: list[str], warned: bool
) -> None:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/m"]
    argv += ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", *extra]
    warning = adaptive_graph_warning(CommandValues(argv))
    assert (warning is not None) is warned, warning
    if warned:
        assert "--speculative-num-steps 3" in warning and "--speculative-adaptive-config" in warning
