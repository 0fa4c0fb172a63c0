"""Masking shown text, exhaustively: every secret form in every context, no pair hiding the next."""

from __future__ import annotations

import itertools
import time

import pytest

from deployctl.masking import MASK, is_secret_name, mask_text

# Names of every kind is_secret_name knows: a secret word, a last word "key", "tokens".
NAMES = [
    "api_key", "api-key", "admin_api_key", "apikey", "hf_token", "HF_TOKEN", "token",
    "access_token", "password", "db_password", "passwd", "passphrase", "secret",
    "client_secret", "credentials", "WANDB_API_KEY", "tokens", "model.api_key",
]  # fmt: skip
BARE = "S3k=r:1t/x.y-z~9"  # a bare word: `=`, `:`, `/` are part of it
QUOTED = "s3 cr,3t=x;9"  # inside quotes: spaces, commas and semicolons too
# Each form: its text (with {name}, {NAME}: the name as an environment variable, {value}) and
# the value it holds.
NAMED_FORMS = {
    "flag with space": ("--{name} {value}", BARE),
    "flag with =": ("--{name}={value}", BARE),
    "env pair": ("{NAME}={value}", BARE),
    "yaml pair": ("{name}: {value}", BARE),
    "json pair": ('"{name}": "{value}"', QUOTED),
    "python dict pair": ("'{name}': '{value}'", QUOTED),
    "python repr pair": ("{name}='{value}'", QUOTED),
    "python list of words": ("'--{name}', '{value}'", QUOTED),
}
HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
SK = "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0"
GH = "ghp_" + "0123456789abcdefghijABCDEFGHIJklmnop"
# Forms without a name of their own.
PLAIN_FORMS = {
    "postgres URL": ("postgres://u:{value}@db/x", "PASS.w0rd-x~9"),
    "https URL with port": ("https://deploy:{value}@host:8443/p?q=1", "p4ss:w0rd"),
    "URL without user": ("redis://:{value}@cache:6379/0", "r3dis-PASS"),
    "basic auth header": ("Authorization: Basic {value}", "dXNlcjpwYXNzd29yZA=="),
    "bearer auth header": ("Authorization: Bearer {value}", "eyJhbGciOi.J9eyJzdWIi.Oi-_x"),
    "auth header without scheme": ("Proxy-Authorization: {value}", "c2VjcmV0LXRva2Vu"),
    "quoted auth header": ('"Authorization": "Basic {value}"', "dXNlcjpwYXNzd29yZA=="),
    "curl auth header": ("-H 'authorization: Bearer {value}'", "abc.def-ghi_9"),
    "bearer token": ("Bearer {value}", "abc.def-ghi_9"),
    "hf token": ("{value}", HF),
    "openai key": ("{value}", SK),
    "github token": ("{value}", GH),
}
OTHER = ["OTHER-S3KRIT-1", "OTHER-S3KRIT-2", "OTHER-S3KRIT-3"]
PREFIXES = [
    "", "args: ", "argv=", "env: ", "cmd: ", "x=1 ", "port: 30000, ", "'", '"', "argv=[",
    "server_args={", "ServerArgs(model_path='/m', ", "launched: python -m sglang.launch_server ",
    f"--api-key {OTHER[0]} ", f"HF_TOKEN={OTHER[1]} ", "[2026-11-29 10:12:33 TP3] ",
    "[2026-11-29 10:12:33 TP3] args: ",
]  # fmt: skip
SUFFIXES = [
    "", " ", ",", ", x=1", " --port 30000", '"', "'", ")", "}", "]", "; y=2",
    " token usage: 0.01", f" --hf-token={OTHER[2]}", "\n[2026-11-29 10:12:34 TP0] next line",
]  # fmt: skip
# What no secret is, in the same contexts: left exactly as it is.
NOT_SECRETS = [
    "--port 30000", "--model-path=/models/x", "max_tokens=5", "#token: 1234",
    "#running-req: 1, #new-token: 5, token usage: 0.01", "'tokenizer_path': '/m'",
    "'admin_api_key': None", "api_key=None", '"hf_token": null', "use_token=true",
    "bucket_time_to_first_token=0.5", "--api-key --port 1", "https://host:8443/x?y=1",
    "ssh://git@host/repo.git", "Basic setup done", "sk-learn", "hf_transfer enabled",
    "task-1234567890abcdefghijk", "disk-0123456789abcdefghij0123", "Bearer",
    "missing bearer token in the request", "Bearer authentication failed",
    "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=78.41 GB",
]  # fmt: skip


def env_name(name: str) -> str:
    return name.upper().replace("-", "_").replace(".", "_")


def cases() -> list[tuple[str, str, str]]:
    """(form, text, its secret value): every named form with every name, the others once."""
    found = []
    for (form, (text, value)), name in itertools.product(NAMED_FORMS.items(), NAMES):
        filled = text.format(name=name, NAME=env_name(name), value=value)
        found.append((f"{form} ({name})", filled, value))
    for form, (text, value) in PLAIN_FORMS.items():
        found.append((form, text.format(value=value), value))
    return found


def expected(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def test_the_names_are_all_secret_names() -> None:
    assert [n for n in NAMES if not is_secret_name(n)] == []
    assert not is_secret_name(env_name("max_tokens"))


@pytest.mark.parametrize("form", [*NAMED_FORMS, *PLAIN_FORMS])
def test_each_secret_form_is_masked_in_every_context_and_nothing_else_changes(
    form: str,
) -> None:
    failures, tried = [], 0
    for label, text, value in (c for c in cases() if c[0].split(" (")[0] == form):
        for prefix, suffix in itertools.product(PREFIXES, SUFFIXES):
            line = prefix + text + suffix
            want = expected(line, [value, *OTHER])
            shown = mask_text(line)
            tried += 1
            if shown != want or value in shown:
                failures.append(f"{label}: {line!r}\n  got  {shown!r}\n  want {want!r}")
    assert tried >= len(PREFIXES) * len(SUFFIXES)
    assert not failures, f"{len(failures)} of {tried}:\n" + "\n".join(failures[:10])


def test_what_is_no_secret_is_left_as_it_is_in_every_context() -> None:
    failures = []
    for text, prefix, suffix in itertools.product(NOT_SECRETS, PREFIXES, SUFFIXES):
        line = prefix + text + suffix
        want = expected(line, OTHER)
        if (shown := mask_text(line)) != want:
            failures.append(f"{line!r}\n  got  {shown!r}\n  want {want!r}")
    assert not failures, f"{len(failures)}:\n" + "\n".join(failures[:10])


def test_every_pair_of_a_line_is_masked_each_on_its_own() -> None:
    # One line holding every named form one after the other, each after a non-secret pair.
    parts, values = [], []
    for i, (text, _) in enumerate(NAMED_FORMS.values()):
        value = f"V{i}-S3KRIT"
        parts.append(f"k{i}={i} " + text.format(name="api_key", NAME="API_KEY", value=value))
        values.append(value)
    line = "[2026-11-29 10:12:33 TP3] " + ", ".join(parts)
    assert mask_text(line) == expected(line, values)


def test_known_values_are_masked_wherever_they_appear_after_the_forms() -> None:
    line = "say inventory-secret-value; token: t0ken-value"
    assert mask_text(line, ("inventory-secret-value",)) == f"say {MASK}; token: {MASK}"


def test_a_value_cut_off_by_the_line_end_is_masked_to_it() -> None:
    assert mask_text("password: 'hunter2 and the rest") == f"password: '{MASK}"
    assert mask_text("'api_key': 'a\\'b', x=1") == f"'api_key': '{MASK}', x=1"


# Lines a hostile host may write, each of which a careless pattern rescans from every place.
HOSTILE = {
    "quotes": "'" * 100_000,
    "flags": "--a " * 25_000,
    "pairs": "a:" * 50_000,
    "secret pairs": "password: " * 10_000,
    "scheme": "a+" * 50_000 + "://u:",
    "url": "https://" + "a:" * 50_000,
    "unclosed quote": 'token: "' + "a" * 100_000,
    "bearer": "Bearer " * 15_000,
    "token shape": "sk-" + "a-" * 50_000,
    "list of flags": "'--api-key', " * 8_000,
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_no_line_makes_masking_slow(kind: str) -> None:
    # Each takes well under 0.1 s; a pattern that rescans takes minutes.
    started = time.process_time()
    mask_text(HOSTILE[kind])
    took = time.process_time() - started
    assert took < 2.0, f"{kind}: {took:.2f} s of CPU for 100,000 characters (bound 2 s)"
