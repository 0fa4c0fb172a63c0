"""One machine's address however an inventory writes it: every spelling of an IPv4 address
(127.0.5.3, 127.1283, 2130707715, 0x7f000503), an IPv6 address in any form, and a name as
this machine resolves it. What reaches one address is one machine."""

from __future__ import annotations

import functools
import ipaddress
import re
import socket

# What the C library's inet_aton reads as an IPv4 address (ssh and ping read it so): one to
# four dotted parts, each decimal, octal (leading 0) or hex (0x). Anything else is a name.
# (Python's inet_aton alone also takes `1.2.3.4 junk`: glibc stops at the first space.)
_IPV4_FORMS = re.compile(r"(?:0[xX][0-9a-fA-F]*|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]*|[0-9]+)){0,3}")


def literal_address(text: str) -> str | None:
    """The address `text` spells, written the standard way (`127.1283` → `127.0.5.3`,
    `[0:0::1]` → `::1`); None when it is a name."""
    bare = text.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    if _IPV4_FORMS.fullmatch(bare):
        try:
            return socket.inet_ntoa(socket.inet_aton(bare))
        except OSError:
            return None  # a part out of range (127.0.0.256): no address, nor a usable name
    return None


@functools.cache
def _resolved(name: str) -> str | None:
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    # The first is the one a connection tries first (RFC 6724 order).
    return literal_address(str(found[0][4][0])) if found else None


def machine_address(text: str) -> str:
    """Where `text` reaches, for telling whether two spellings are one machine: its address
    in standard form, a name's address as resolved here, or the name itself (lowercase, no
    trailing dot) where it does not resolve here (an ssh_config alias, a name only a jump
    host knows)."""
    literal = literal_address(text)
    if literal is not None:
        return literal
    name = text.strip().rstrip(".").lower()
    return _resolved(name) or name


def same_address(first: str, second: str) -> bool:
    """Whether two spellings are one address, looking nothing up (a name matches only
    itself, case and a trailing dot aside)."""

    def key(text: str) -> str:
        return literal_address(text) or text.strip().rstrip(".").lower()

    return key(first) == key(second)
