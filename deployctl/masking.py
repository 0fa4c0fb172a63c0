"""Secrets and their masking: which names hold one, and the one masker of the text people
see (log lines, crash messages, rendered commands and their environments)."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

MASK = "********"
_SECRET_WORDS = {
    "token",
    "pass",
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "apikey",
    "credential",
    "credentials",
}
# `api_key`, `api-key`, `wandb_key`, `HF_KEY`: a name whose last word is "key" holds one;
# `ssh_key_file`, `key_path` name where one is.
_KEY_NAME = re.compile(r"(?:^|[_\-.])key\Z", re.IGNORECASE)
# Headers whose value is a credential. Only in text: a variable `authorization_mode` is none.
_AUTH_HEADERS = {"authorization", "proxy-authorization"}
# The shortest value masked: shorter ones would mask innocent parts of a command.
_MIN_SECRET = 4


def is_secret_name(name: str) -> bool:
    """Tell whether a variable name looks like it holds a secret."""
    words = set(re.split(r"[_\-.]", name.lower()))
    # "tokens" alone is a list of them; `max_tokens` and `num_draft_tokens` are counts.
    whole = name.lower() == "tokens"
    return whole or bool(words & _SECRET_WORDS) or bool(_KEY_NAME.search(name))


@functools.lru_cache(maxsize=4096)
def _holds_secret(name: str) -> bool:
    """A name in text whose value is masked: a secret name or a credential header."""
    return is_secret_name(name) or name.lower() in _AUTH_HEADERS


def flag_secrets(words: Sequence[Any]) -> list[str]:
    """The values that follow secret-looking flags in argv-like words.

    `["--api-key", "sk-1"]` and `["--hf-token=hf_2"]` give "sk-1" and "hf_2".
    """
    found = []
    for i, word in enumerate(words):
        text = str(word)
        if not text.startswith("-"):
            continue
        name, eq, value = text.lstrip("-").partition("=")
        if not is_secret_name(name):
            continue
        if eq:
            found.append(value)
        elif i + 1 < len(words) and not str(words[i + 1]).startswith("-"):
            found.append(str(words[i + 1]))
    return long_enough(found)


def long_enough(values: Sequence[str]) -> list[str]:
    """The values long enough to be masked wherever they appear (see _MIN_SECRET)."""
    return [v for v in values if len(v) >= _MIN_SECRET]


def mask_values(text: str, secrets: Sequence[str]) -> str:
    """Replace every secret value inside `text` with the mask (longest secrets first)."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


# Text is read as a sequence of tokens, each found on its own, so that no pair hides the
# next (`args: --api-key X` is the pair `args: …` and the flag `--api-key X`): a token
# is a key with its separator, never its value, and where a value starts is the next
# token's start too. One alternation, tried in this order where a word starts (the first
# lookahead only makes the scan fast):
_TOKEN = re.compile(
    r"""
    (?=[A-Za-z_'"-])(?<![\w.\#-])
    (?:
        # a URL's password: `postgres://user:PASS@db` (its scheme starts after no `+`:
        # each `+` of `a+a+…` would start a scan to the end)
        (?<!\+)[A-Za-z][A-Za-z0-9+.-]*://[^\s/?\#@:'"<>]*:(?P<password>[^\s/?\#@'"<>]+)@
        # a flag in a Python list of words: `'--api-key', 'sk-1'`
      | (?P<fq>['"])--?(?P<qflag>[A-Za-z_][\w.-]*)(?P=fq),[ \t]*
        # a key and its separator: `--api-key `, `--hf-token=`, `HF_TOKEN=`, `token: `,
        # `api_key=` (a Python repr), `'api_key': ` and `"api_key": ` (a dict, JSON);
        # `#token:` and `new-token:` are counters' labels
      | (?P<dash>--?)?(?P<q>['"]?)(?P<name>[A-Za-z_][\w.-]*)(?P=q)
        (?:[ \t]*[:=][ \t]*|(?(dash)[ \t]+|(?!)))
        # a bearer token anywhere: `Bearer eyJ…`; one with neither digit nor sign is a
        # word (`missing bearer token`)
      | (?i:bearer)[ \t]+(?P<bearer>(?!-)(?=[\w~+/]*[\d.~+/=-])[\w.~+/-]+=*)
        # well-known token shapes, long enough that no word or identifier has them
      | (?P<shape>
            hf_[A-Za-z0-9]{30,}
          | sk-(?=[\w-]*\d)[A-Za-z0-9][\w-]{19,}
          | gh[pousr]_[A-Za-z0-9]{30,}
          | github_pat_\w{30,}
        )(?![\w-])
    )
    """,
    re.VERBOSE,
)
# A value after a key: quoted (its inside masked, to the line's end if the quote is never
# closed: a cut line) or a bare word.
_VALUE = re.compile(
    r"""'(?P<sq>(?:[^'\\\n]|\\.)*)(?:'|$)"""
    r"""|"(?P<dq>(?:[^"\\\n]|\\.)*)(?:"|$)"""
    r"""|(?P<bare>[^\s,;'"()\[\]{}<>]+)""",
    re.MULTILINE,
)
# A credential header's scheme (`Authorization: Basic dXNlcjpw`): the credential is masked.
_SCHEME = re.compile(r"(?i)(?:basic|bearer|digest|negotiate|token)\Z")
# A credential's letters (RFC 7235's token68).
_CREDENTIAL = re.compile(r"[ \t]+(?P<cred>[\w.~+/-]+=*)")
# Values that are no secret; numbers under such names are counts
# (`bucket_time_to_first_token=0.5`).
_NOT_SECRET = re.compile(r"None|null|True|False|true|false|-?\d+(?:\.\d+)?\Z")


def mask_text(text: str, secrets: Sequence[str] = ()) -> str:
    """Mask the secrets in shown text (log lines, a command's words, an environment value):
    the values of secret-named flags, keys and variables in every form they are written
    (`--api-key X`, `--api-key=X`, `HF_TOKEN=X`, `token: X`, `"api_key": "X"`,
    `api_key='X'`, `'--api-key', 'X'`), URL passwords, authorization credentials, bearer
    tokens and well-known token shapes (`hf_…`, `sk-…`), and `secrets` (known values, longest
    first) wherever they appear. Everything else is left as it is."""
    spans: list[tuple[int, int]] = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or ""  # every alternative ends in a group
        if kind in {"name", "qflag"}:
            name = match[kind]
            if _holds_secret(name):
                flag = kind == "qflag" or bool(match["dash"])
                span = _value_span(text, match.end(), flag, name.lower() in _AUTH_HEADERS)
                if span is not None:
                    spans.append(span)
        else:
            spans.append(match.span(kind))
    if spans:
        text = _masked_spans(text, spans)
    return mask_values(text, secrets)


def _value_span(text: str, start: int, flag: bool, header: bool) -> tuple[int, int] | None:
    """Where the secret value that starts at `start` is, past a credential header's scheme;
    None: there is none (`--api-key --port 1`, `api_key=None`, `'api_key': ''`)."""
    value = _VALUE.match(text, start)
    if value is None:
        return None
    kind = value.lastgroup
    assert kind is not None
    inside, (begin, end) = value[kind], value.span(kind)
    if kind == "bare":
        if _NOT_SECRET.fullmatch(inside) or (flag and inside.startswith("-")):
            return None
        if header and _SCHEME.match(inside) and (cred := _CREDENTIAL.match(text, end)):
            return cred.span("cred")
        return begin, end
    scheme, _, rest = inside.partition(" ")
    if header and rest.strip() and _SCHEME.match(scheme):
        return end - len(rest.lstrip()), end
    if not inside or (flag and inside.startswith("-")):
        return None
    return begin, end


def _masked_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with each span (overlapping ones as one) replaced by the mask."""
    parts, done = [], 0
    for start, end in sorted(spans):
        if end <= done:
            continue
        if start >= done:
            parts += [text[done:start], MASK]
        done = end
    return "".join([*parts, text[done:]])
