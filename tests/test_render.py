"""Launch templates: the real deployment's flags, shell quoting that holds, and clear errors."""

from __future__ import annotations

import grp
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from deployctl import project
from deployctl.errors import TemplateError, UnsafeProjectError, UsageError
from deployctl.inventory import MASK, Host, Inventory, load_inventory
from deployctl.ops.serving import masked_env_values, masked_values
from deployctl.remote.protocol import RunRecord
from deployctl.render import (
    THRESHOLD_FLAG,
    RenderedCommand,
    TemplateSet,
    default_template,
    parse_overrides,
    template_names,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_INVENTORY = REPO / "inventories" / "example.yml"

# The flags of the real Kimi K2.5 EAGLE-3 deployment on the H200 hosts.
EAGLE3_H200_FLAGS = [
    "--model-path=/shared/kimi-k2.5-int4",
    "--tp-size=8",
    "--trust-remote-code",
    "--enable-metrics",
    "--cuda-graph-max-bs-decode=128",
    "--disable-custom-all-reduce",
    "--attention-backend=flashinfer",
    "--enable-flashinfer-allreduce-fusion",
    "--speculative-algorithm=EAGLE3",
    "--speculative-draft-model-path=/data/eagle3/output_100k_sglang/4",
    "--speculative-num-steps=2",
    "--speculative-eagle-topk=4",
    "--speculative-num-draft-tokens=16",
    "--mem-fraction-static=0.88",
    "--port=30000",
    "--host=0.0.0.0",
]
LAUNCHER = ["/opt/sglang/env/bin/python3", "-m", "sglang.launch_server"]


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(project.Project(None), id="shipped"),
        pytest.param(project.Project(REPO), id="repo-project"),
    ],
)
def templates(request: pytest.FixtureRequest) -> TemplateSet:
    # One set per module: Jinja compiles each template once and caches it.
    return TemplateSet(request.param.search_dirs("templates"))


@pytest.fixture(scope="module")
def example() -> Inventory:
    return load_inventory(EXAMPLE_INVENTORY)


def custom_templates(folder: Path, **templates: str) -> TemplateSet:
    """A TemplateSet over a folder holding the given {name: text} templates."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in templates.items():
        (folder / f"{name}.j2").write_text(text, encoding="utf-8")
    return TemplateSet([folder])


# --- the real deployment ---------------------------------------------------------------------


def run_with_home(command: str, home: Path) -> bytes:
    """What a rendered command prints when /bin/sh runs it with this HOME."""
    result = subprocess.run(
        ["/bin/sh", "-c", command],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=10,
    )
    return result.stdout


def test_shipped_templates_are_found() -> None:
    assert template_names(project.Project(None).search_dirs("templates")) == [
        "baseline",
        "eagle3",
        "router",
    ]


def test_eagle3_on_h200_renders_exactly_the_real_deployment_flags(
    templates: TemplateSet, example: Inventory
) -> None:
    rendered = templates.render(example.hosts["h200-a01"], "eagle3")
    assert rendered.argv[:3] == LAUNCHER
    assert sorted(rendered.argv[3:]) == sorted(EAGLE3_H200_FLAGS)
    assert len(rendered.argv) == len(LAUNCHER) + len(EAGLE3_H200_FLAGS)
    assert shlex.split(rendered.command) == rendered.argv
    assert rendered.command == shlex.join(rendered.argv)
    assert THRESHOLD_FLAG not in rendered.command
    assert rendered.log_stem == "eagle3"


def test_threshold_appends_the_disable_batch_flag_once(
    templates: TemplateSet, example: Inventory
) -> None:
    rendered = templates.render(example.hosts["h200-a01"], "eagle3", threshold=5)
    assert rendered.argv[-1] == f"{THRESHOLD_FLAG}=5"
    assert sorted(rendered.argv[3:-1]) == sorted(EAGLE3_H200_FLAGS)
    assert rendered.log_stem == "eagle3_t5"


def test_a_template_that_sets_the_threshold_flag_itself_gets_no_second_one(
    tmp_path: Path,
) -> None:
    ts = custom_templates(
        tmp_path / "t", own=f"serve {THRESHOLD_FLAG}={{{{ threshold }}}} --tp={{{{ tp }}}}\n"
    )
    rendered = ts.render(Host("h", {"tp": 2}), "own", threshold=7)
    assert rendered.argv == ["serve", f"{THRESHOLD_FLAG}=7", "--tp=2"]


def test_rtx6000_group_overrides_the_speculative_settings(
    templates: TemplateSet, example: Inventory
) -> None:
    argv = templates.render(example.hosts["rtx-b03"], "eagle3").argv
    assert "--speculative-eagle-topk=1" in argv
    assert "--speculative-num-steps=3" in argv
    assert "--speculative-num-draft-tokens=4" in argv


def test_baseline_has_no_speculative_flags(templates: TemplateSet, example: Inventory) -> None:
    argv = templates.render(example.hosts["h200-a01"], "baseline").argv
    assert argv[:3] == LAUNCHER
    assert not [a for a in argv if a.startswith("--speculative")]
    assert "--model-path=/shared/kimi-k2.5-int4" in argv


def test_overrides_beat_inventory_variables(templates: TemplateSet, example: Inventory) -> None:
    rendered = templates.render(
        example.hosts["h200-a01"], "eagle3", overrides={"tp": 4, "model_path": "/m/other"}
    )
    assert "--tp-size=4" in rendered.argv
    assert "--model-path=/m/other" in rendered.argv
    assert "--tp-size=8" not in rendered.argv


def test_extra_args_become_one_word_each(templates: TemplateSet, example: Inventory) -> None:
    rendered = templates.render(
        example.hosts["h200-a01"],
        "baseline",
        overrides={"extra_args": ["--log-level=debug", "--served-model-name=kimi k2"]},
    )
    assert rendered.argv[-2:] == ["--log-level=debug", "--served-model-name=kimi k2"]


# --- quoting ---------------------------------------------------------------------------------

HOSTILE_VALUES = [
    "/models/with space",
    "it's",
    'say "hi"',
    "both 'single' and \"double\"",
    "a; touch PWNED",
    "a && touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "line1\nline2",
    "-rf",
    "--help",
    "/модели/ünïcødé/模型",
    "$HOME",
    "*",
    "#not-a-comment",
    "x #still-not-a-comment",
    "back\\slash",
    "tab\there",
    "~root",
    "",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_hostile_model_path_stays_one_argument_in_the_launch_command(
    templates: TemplateSet, example: Inventory, value: str
) -> None:
    rendered = templates.render(
        example.hosts["h200-a01"], "eagle3", overrides={"model_path": value}
    )
    assert f"--model-path={value}" in rendered.argv
    assert shlex.split(rendered.command) == rendered.argv
    assert len(rendered.argv) == len(LAUNCHER) + len(EAGLE3_H200_FLAGS)


@pytest.fixture
def printf_template(tmp_path: Path) -> TemplateSet:
    # printf prints each argument it gets followed by NUL: one NUL means one argument.
    return custom_templates(tmp_path / "templates", show="printf %s\\\\0 {{ model_path }}\n")


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_hostile_value_reaches_the_shell_as_exactly_itself(
    printf_template: TemplateSet, tmp_path: Path, value: str
) -> None:
    rendered = printf_template.render(Host("h", {"model_path": value}), "show")
    assert rendered.argv == ["printf", "%s\\0", value]
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(
        ["/bin/sh", "-c", rendered.command], cwd=work, capture_output=True, timeout=10
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == value.encode() + b"\0"
    assert list(work.iterdir()) == []


def test_tilde_python_keeps_home_expansion(
    templates: TemplateSet, example: Inventory, printf_template: TemplateSet, tmp_path: Path
) -> None:
    rendered = templates.render(
        example.hosts["h200-a01"], "eagle3", overrides={"python": "~/env/bin/python3"}
    )
    assert rendered.command.startswith("~/env/bin/python3 -m sglang.launch_server ")
    assert rendered.argv[0] == "~/env/bin/python3"

    home = tmp_path / "home dir"
    shown = printf_template.render(Host("h", {"model_path": "~/env/b$(x)/python3"}), "show")
    assert run_with_home(shown.command, home) == f"{home}/env/b$(x)/python3".encode() + b"\0"


def test_secrets_are_masked_in_display_but_not_in_command(tmp_path: Path) -> None:
    ts = custom_templates(
        tmp_path / "t",
        serve="{{ python }} serve --model-path={{ model_path }} --api-key={{ api_key }}"
        " --hf={{ hf_token }}\n",
    )
    host = Host(
        "h",
        {
            "python": "python3",
            "model_path": "/m",
            "api_key": "sk-live-123456",
            "hf_token": "hf_abcdefgh",
            "max_tokens": "4096",
        },
    )
    rendered = ts.render(host, "serve")
    assert "--api-key=sk-live-123456" in rendered.argv
    assert "sk-live-123456" in rendered.command
    assert "hf_abcdefgh" in rendered.command
    assert "sk-live-123456" not in rendered.display
    assert "hf_abcdefgh" not in rendered.display
    assert f"--api-key={MASK}" in rendered.display
    assert f"--hf={MASK}" in rendered.display
    assert "--model-path=/m" in rendered.display


# --- errors ----------------------------------------------------------------------------------


def test_missing_variable_names_the_variable_and_the_template(templates: TemplateSet) -> None:
    host = Host("bare", {"python": "python3", "launch_module": "m", "tp": 1, "port": 1})
    with pytest.raises(TemplateError) as info:
        templates.render(host, "eagle3")
    message = str(info.value)
    assert "'eagle3'" in message
    assert "'model_path'" in message
    assert "bare" in message
    assert "--set model_path=" in (info.value.hint or "")


def test_missing_draft_model_is_named_for_eagle3(
    templates: TemplateSet, example: Inventory
) -> None:
    variables = {k: v for k, v in example.hosts["h200-a01"].vars.items() if k != "draft_model_path"}
    templates.render(Host("h", variables), "baseline")
    with pytest.raises(TemplateError, match=r"'draft_model_path'"):
        templates.render(Host("h", variables), "eagle3")


def test_unknown_template_lists_the_available_ones(
    templates: TemplateSet, example: Inventory
) -> None:
    with pytest.raises(TemplateError, match=r"unknown template 'eagle4'") as info:
        templates.render(example.hosts["h200-a01"], "eagle4")
    assert info.value.hint == "available: baseline, eagle3, router"


def test_project_template_overrides_the_shipped_one(tmp_path: Path, example: Inventory) -> None:
    root = tmp_path / "proj"
    (root / "templates").mkdir(parents=True)
    (root / "templates" / "baseline.j2").write_text("echo project-baseline {{ tp }}\n")
    (root / "templates" / "mine.j2").write_text("echo mine\n")
    found = project.find_project(root)
    ts = TemplateSet(found.search_dirs("templates"))
    assert template_names(ts.search_dirs) == ["baseline", "mine", "eagle3", "router"]
    assert ts.render(example.hosts["h200-a01"], "baseline").argv == [
        "echo",
        "project-baseline",
        "8",
    ]
    # eagle3 still comes from the package, but extends the project's baseline.
    assert ts.render(example.hosts["h200-a01"], "eagle3").argv[:3] == [
        "echo",
        "project-baseline",
        "8",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("serve {% if tp %} --tp={{ tp }}\n", r"template 'bad'"),
        ("serve {{ tp \n", r"template 'bad' line 1"),
        ("serve {% endfor %}\n", r"template 'bad'"),
    ],
)
def test_jinja_syntax_error_is_a_template_error(tmp_path: Path, text: str, message: str) -> None:
    ts = custom_templates(tmp_path / "t", bad=text)
    with pytest.raises(TemplateError, match=message):
        ts.render(Host("h", {"tp": 1}), "bad")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("serve 'unbalanced\n", r"unbalanced"),
        ("{# only a comment #}\n", r"empty command"),
    ],
)
def test_template_that_renders_no_usable_command_is_an_error(
    tmp_path: Path, text: str, message: str
) -> None:
    ts = custom_templates(tmp_path / "t", bad=text)
    with pytest.raises(TemplateError, match=message):
        ts.render(Host("h", {}), "bad")


# --- --set overrides -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pair", "key", "value"),
    [
        ("tp=8", "tp", 8),
        ("x=true", "x", True),
        ("x=false", "x", False),
        ("mem=0.88", "mem", 0.88),
        ("path=/a b", "path", "/a b"),
        ("x=", "x", ""),
        ("x=a=b", "x", "a=b"),
        ("x=[1, 2]", "x", "[1, 2]"),
        ("x=null", "x", "null"),
        ("x={a: 1}", "x", "{a: 1}"),
        ("model_path=~/m", "model_path", "~/m"),
        (" tp =8", "tp", 8),
    ],
)
def test_parse_overrides_types_values_as_yaml_scalars(pair: str, key: str, value: object) -> None:
    parsed = parse_overrides([pair])
    assert parsed == {key: value}
    assert type(parsed[key]) is type(value)


def test_parse_overrides_later_pair_wins() -> None:
    assert parse_overrides(["tp=8", "port=1", "tp=4"]) == {"tp": 4, "port": 1}


@pytest.mark.parametrize("pair", ["x", "=v", "1x=2", "a-b=1", "a.b=1", ""])
def test_parse_overrides_rejects_what_is_not_key_value(pair: str) -> None:
    with pytest.raises(UsageError, match=r"is not KEY=VALUE") as info:
        parse_overrides([pair])
    assert repr(pair) in str(info.value)
    assert info.value.hint == "e.g. --set model_path=/shared/models/x --set tp=8"


# --- template choice and log names -----------------------------------------------------------


@pytest.mark.parametrize(
    ("host_template", "option", "threshold", "expected"),
    [
        (None, None, None, "baseline"),
        (None, None, 5, "eagle3"),
        (None, "custom", None, "custom"),
        (None, "custom", 5, "custom"),
        ("eagle3", None, None, "eagle3"),
        ("baseline", None, 5, "baseline"),
        ("eagle3", "baseline", None, "baseline"),
        ("", None, None, "baseline"),
    ],
)
def test_default_template_choice(
    host_template: str | None, option: str | None, threshold: int | None, expected: str
) -> None:
    variables = {} if host_template is None else {"template": host_template}
    assert default_template(Host("h", variables), option, threshold) == expected


@pytest.mark.parametrize(
    ("template", "threshold", "stem"),
    [
        ("eagle3", 5, "eagle3_t5"),
        ("baseline", None, "baseline"),
        ("eagle3", 0, "eagle3_t0"),
        ("my tmpl/x", 12, "my_tmpl_x_t12"),
    ],
)
def test_log_stem_names_template_and_threshold(
    template: str, threshold: int | None, stem: str
) -> None:
    assert RenderedCommand(template, threshold, ["x"]).log_stem == stem


def test_rendered_log_stem_follows_the_threshold(
    templates: TemplateSet, example: Inventory
) -> None:
    host = example.hosts["h200-a01"]
    assert templates.render(host, "baseline").log_stem == "baseline"
    assert templates.render(host, "eagle3", threshold=5).log_stem == "eagle3_t5"


# ---- what a template may do, and whose project is trusted ----------------------------------


def test_a_template_cannot_reach_python_internals(tmp_path: Path) -> None:
    (tmp_path / "evil.j2").write_text(
        "python3 -m sglang.launch_server "
        "{{ cycler.__init__.__globals__.os.popen('touch " + str(tmp_path / "pwned") + "').read() }}"
    )
    with pytest.raises(TemplateError, match="unsafe"):
        TemplateSet([tmp_path]).render(Host("h", {}), "evil")
    assert not (tmp_path / "pwned").exists()


def test_a_missing_attribute_names_the_expression_not_a_variable(tmp_path: Path) -> None:
    (tmp_path / "attr.j2").write_text("python3 -m x --flag={{ cfg.nope }}\n")
    with pytest.raises(TemplateError, match="has no attribute 'nope'") as info:
        TemplateSet([tmp_path]).render(Host("h", {"cfg": {"yes": 1}}), "attr")
    assert info.value.hint == "check the template's expression against the variable's value"


def make_project(root: Path) -> Path:
    (root / "templates").mkdir(parents=True)
    (root / "templates" / "baseline.j2").write_text("python3 -m sglang.launch_server\n")
    (root / "patches" / "mine").mkdir(parents=True)
    (root / "patches" / "mine" / "patch.yml").write_text("name: mine\n")
    return root


@pytest.mark.parametrize(
    ("target", "change", "message"),
    [
        ("", lambda p: p.chmod(0o777), "writable by every user"),
        ("templates", lambda p: p.chmod(0o757), "writable by every user"),
        ("templates/baseline.j2", lambda p: p.chmod(0o666), "writable by every user"),
        # Giving a file to another user, or making a group with members, needs root.
        pytest.param(
            "patches/mine/patch.yml",
            lambda p: os.chown(p, 65534, -1),
            "is owned by",
            marks=pytest.mark.lab,
        ),
        pytest.param(
            "patches/mine",
            lambda p: (os.chown(p, -1, shared_gid()), p.chmod(0o775)),
            "by group",
            marks=pytest.mark.lab,
        ),
    ],
    ids=["root-0777", "templates-o+w", "template-0666", "patch-owned-by-nobody", "group-shared"],
)
def test_a_project_others_can_change_is_refused(
    tmp_path: Path, target: str, change: Any, message: str
) -> None:
    root = make_project(tmp_path / "proj")
    work = root / "sub"
    work.mkdir()
    assert project.find_project(work).root == root  # trusted as it is
    change(root / target)
    for found in (lambda: project.find_project(work), lambda: project.find_project(work, root)):
        with pytest.raises(UnsafeProjectError, match=message) as info:
            found()
        assert "chmod go-w" in (info.value.hint or "")


def shared_gid() -> int:
    """A group that has members besides root (so group-writable means others can write)."""
    for group in grp.getgrall():
        if group.gr_mem and set(group.gr_mem) != {"root"}:
            return group.gr_gid
    group_name = "deployctl-shared-test"
    subprocess.run(["groupadd", "-f", group_name], check=True)
    subprocess.run(["usermod", "-aG", group_name, "nobody"], check=True)
    return grp.getgrnam(group_name).gr_gid


def test_a_private_group_may_write_like_on_umask_002_systems(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    (root / "templates").chmod(0o775)  # root's own group: no other member
    assert grp.getgrgid(os.stat(root / "templates").st_gid).gr_mem in ([], ["root"])
    assert project.find_project(root).root == root


def test_values_after_secret_looking_flags_are_masked_when_shown(tmp_path: Path) -> None:
    (tmp_path / "flags.j2").write_text(
        "python3 -m sglang.launch_server --api-key {{ given }} --hf-token={{ other }} --tp 8\n"
    )
    host = Host("h", {"given": "sk-plain-named", "other": "hf_0123456789"})
    rendered = TemplateSet([tmp_path]).render(host, "flags")
    assert "sk-plain-named" in rendered.command and "hf_0123456789" in rendered.command
    assert rendered.display == (
        f"python3 -m sglang.launch_server --api-key '{MASK}' '--hf-token={MASK}' --tp 8"
    )


def test_the_word_splitter_agrees_with_shlex_on_every_tricky_string() -> None:
    import random

    from deployctl.shell import split

    rng = random.Random(20261130)
    alphabet = list("ab -'\"\\#\n\t\r=$x")
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        if "\\\n" in text:
            continue  # a line continuation: /bin/sh's rule, not shlex's (the test below)
        try:
            expected: list[str] | str = shlex.split(text, comments=True)
        except ValueError as exc:
            expected = str(exc)
        try:
            got: list[str] | str = split(text)
        except ValueError as exc:
            got = str(exc)
        assert got == expected, repr(text)


def test_backslash_newline_joins_lines_as_bin_sh_does() -> None:
    import random

    from deployctl.shell import split

    assert split("serve \\\n  --tp-size=1 \\\n  --port=1") == ["serve", "--tp-size=1", "--port=1"]
    assert split('"a\\\\\nb"') == ["a\\\nb"]  # an escaped backslash, then a real newline
    rng = random.Random(7)
    # No `#`: in the middle of a word it starts a comment for shlex (and so here), not for sh;
    # no bare newline: in this script it would end the `set` command.
    alphabet = ["a", "b", " ", "'", '"', "\\", "\\\n", "="]
    compared = 0
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        if re.search(r"(?<!\\)(?:\\\\)*\n", text):
            continue  # a newline after an even run of backslashes would end the `set` here
        try:
            ours = split(text)
        except ValueError:
            continue
        script = f"set -f\nset -- {text}\nfor w; do printf '%s\\0' \"$w\"; done"
        shell = subprocess.run(["/bin/sh", "-c", script], capture_output=True, check=False)
        if shell.returncode != 0:
            continue
        assert ours == shell.stdout.decode().split("\0")[:-1], repr(text)
        compared += 1
    assert compared > 100


@pytest.mark.heavy
def test_a_one_mebibyte_value_round_trips_through_render(tmp_path: Path) -> None:
    value = "/m/" + "a'b c" * (1 << 18)  # quotes and spaces all the way
    host = Host("h", {"python": "python3", "launch_module": "m", "model_path": value})
    (tmp_path / "big.j2").write_text(
        "{{ python }} -m {{ launch_module }} --model-path={{ model_path }}\n"
    )
    assert TemplateSet([tmp_path]).render(host, "big").argv[-1] == f"--model-path={value}"


def test_env_is_shown_before_the_command_quoted_and_masked(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text("python3 -m sglang.launch_server --tp=1\n")
    env = {"NCCL_P2P_DISABLE": "1", "HF_TOKEN": "hf_secret_value", "ODD": "a b'c$\nd"}
    rendered = TemplateSet([tmp_path]).render(Host("h", {"env": env}), "t")
    assert rendered.env == env  # the server gets the real values
    assert rendered.env_shown == {**env, "HF_TOKEN": MASK}
    assert rendered.display_lines.split("\n", 2)[:2] == ["NCCL_P2P_DISABLE=1", f"HF_TOKEN='{MASK}'"]
    assert rendered.display_lines.endswith("python3 -m sglang.launch_server --tp=1")
    assert shlex.split(rendered.display_lines.split("\n", 2)[2].rsplit("\n", 1)[0]) == [
        "ODD=a b'c$\nd"
    ]


def test_url_passwords_and_credentials_are_masked_where_they_stand(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text(
        "python3 -m sglang.launch_server --model-path={{ model }} --tp=1"
        " --header 'Authorization: Basic {{ basic }}'\n"
    )
    env = {"DATABASE_URL": "postgres://u:PASS-4321@db/x", "HF_ENDPOINT": "https://hub:8443/x"}
    model = "s3://reader:S3CRET-987@bucket/m"
    host = Host("h", {"env": env, "model": model, "basic": "dXNlcjpwYXNz"})
    rendered = TemplateSet([tmp_path]).render(host, "t")
    assert f"--model-path={model}" in rendered.argv and rendered.env == env  # the real ones run
    assert rendered.env_shown == {**env, "DATABASE_URL": f"postgres://u:{MASK}@db/x"}
    assert rendered.display == (
        f"python3 -m sglang.launch_server '--model-path=s3://reader:{MASK}@bucket/m' --tp=1"
        f" --header 'Authorization: Basic {MASK}'"
    )
    assert "PASS-4321" not in rendered.display_lines
    # restart finds the real values where the recorded (shown) copy masks them.
    recorded = cast(RunRecord, {"command": rendered.display, "env": rendered.env_shown})
    assert masked_values(recorded["command"], rendered.argv) == ["S3CRET-987", "dXNlcjpwYXNz"]
    assert masked_env_values(recorded, env) == ["PASS-4321"]


# --- quoting details: what the shell line looks like, and what each value becomes ------------


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("~", "~"),
        ("~/", "~/"),
        ("~/env/bin/python3", "~/env/bin/python3"),
        ("~/a b", "~/'a b'"),
        ("~root", "'~root'"),
        ("x~", "'x~'"),
        ("", "''"),
        ("/m/it's", "'/m/it'\"'\"'s'"),
    ],
)
def test_the_shell_line_quotes_only_what_needs_it(value: str, quoted: str) -> None:
    rendered = RenderedCommand("t", None, ["serve", value])
    assert rendered.command == f"serve {quoted}"
    assert rendered.display == f"serve {quoted}"


@pytest.mark.parametrize("value", ["~", "~/", "~/models/m"])
def test_a_leading_tilde_expands_to_home_in_the_shell(
    printf_template: TemplateSet, tmp_path: Path, value: str
) -> None:
    rendered = printf_template.render(Host("h", {"model_path": value}), "show")
    home = tmp_path / "home dir"
    assert run_with_home(rendered.command, home) == f"{home}{value[1:]}".encode() + b"\0"


def test_none_renders_as_nothing_and_booleans_as_lowercase_words(tmp_path: Path) -> None:
    ts = custom_templates(
        tmp_path / "t", t="serve {{ unset }} --a={{ yes }} --b={{ no }} --c={{ n }}\n"
    )
    rendered = ts.render(Host("h", {"unset": None, "yes": True, "no": False, "n": 0}), "t")
    assert rendered.argv == ["serve", "--a=true", "--b=false", "--c=0"]


def test_templates_see_the_host_deployment_template_and_threshold(tmp_path: Path) -> None:
    ts = custom_templates(
        tmp_path / "t",
        who="serve {{ inventory_hostname }} {{ deployment }} {{ template }} {{ threshold }}\n",
    )
    rendered = ts.render(Host("gpu-01", {}, deployment="r1"), "who", threshold=5)
    assert rendered.argv == ["serve", "gpu-01", "r1", "who", "5", f"{THRESHOLD_FLAG}=5"]
    assert rendered.deployment == "r1"
    assert rendered.log_stem == "r1_who_t5"
    assert ts.render(Host("gpu-01", {}), "who").argv == ["serve", "gpu-01", "who"]


def test_a_threshold_flag_set_by_the_template_is_found_by_its_name_alone(tmp_path: Path) -> None:
    ts = custom_templates(tmp_path / "t", own=f"serve {THRESHOLD_FLAG}={{{{ value }}}}\n")
    rendered = ts.render(Host("h", {"value": "5=x"}), "own", threshold=7)
    assert rendered.argv == ["serve", f"{THRESHOLD_FLAG}=5=x"]


def test_a_secret_inside_a_longer_secret_does_not_unmask_the_rest(tmp_path: Path) -> None:
    ts = custom_templates(tmp_path / "t", t="serve --a={{ api_key }} --b={{ hf_token }}\n")
    host = Host("h", {"api_key": "sk-abcdef", "hf_token": "sk-abcdef-tail-zz"})
    rendered = ts.render(host, "t")
    assert rendered.secrets == ("sk-abcdef-tail-zz", "sk-abcdef")
    assert rendered.display == f"serve '--a={MASK}' '--b={MASK}'"


def test_secrets_of_one_length_are_masked_in_a_stable_order(tmp_path: Path) -> None:
    ts = custom_templates(tmp_path / "t", t="serve {{ b_token }} {{ a_token }} {{ c_token }}\n")
    host = Host("h", {"b_token": "bbbb", "a_token": "aaaa", "c_token": "cccccc"})
    assert ts.render(host, "t").secrets == ("cccccc", "aaaa", "bbbb")


def test_no_templates_at_all_says_none_are_available(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TemplateError) as info:
        TemplateSet([tmp_path / "empty"]).render(Host("h", {}), "baseline")
    assert info.value.hint == "available: none"


def test_a_template_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    (tmp_path / "latin.j2").write_bytes(b"serve --name=caf\xe9\xe9\n")
    with pytest.raises(TemplateError) as info:
        TemplateSet([tmp_path]).render(Host("h", {}), "latin")
    assert str(info.value) == (
        "template 'latin' (or one it includes) is not UTF-8 text: byte 16 is b'\\xe9'"
    )


def test_an_error_without_a_line_number_names_only_the_template(tmp_path: Path) -> None:
    (tmp_path / "inc.j2").write_text('serve {% include "missing.j2" %}\n')
    with pytest.raises(TemplateError) as info:
        TemplateSet([tmp_path]).render(Host("h", {}), "inc")
    assert str(info.value) == (
        f"template 'inc': 'missing.j2' not found in search path: '{tmp_path}'"
    )


def test_an_included_templates_last_newline_still_ends_its_last_word(tmp_path: Path) -> None:
    ts = custom_templates(
        tmp_path / "t",
        flags="--a=1\n--b={{ tp }}\n",
        serve='serve {% include "flags.j2" %}--c\n',
    )
    assert ts.render(Host("h", {"tp": 2}), "serve").argv == ["serve", "--a=1", "--b=2", "--c"]
