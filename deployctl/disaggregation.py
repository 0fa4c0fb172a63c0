"""Prefill/decode disaggregation: what the servers behind one router must agree on (pure).

A prefill (`role: prefill`) computes a prompt's KV and hands it over at its bootstrap server
(`--host`:`bootstrap_port`); a decode (`role: decode`) fetches it there, at the prefill's
address as the router gives it, then generates. SGLang checks little of this itself, and
late: a mismatch shows as a failed or hanging request under load. So launch refuses, before
anything starts, what SGLang 0.5.23 refuses, and warns where users saw it break.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from deployctl.addresses import same_address
from deployctl.choices import PdRole
from deployctl.deployments import is_loopback
from deployctl.findings import Findings

# Where users of SGLang's disaggregation saw each failure (named in the warnings).
LOOPBACK_BOOTSTRAP_ISSUE = "sglang#10001"
TP_MISMATCH_ISSUE = "sglang#15674"
PREFILL_PP_ISSUE = "sglang#8424"


@dataclass(frozen=True)
class PdServer:
    """One server behind a router, as launch would start it."""

    label: str
    role: PdRole | None
    model: str
    tp: int
    pp: int
    backend: str
    address: str  # its machine's address
    bind: str  # its `--host`: where its bootstrap server listens
    url_host: str = ""  # the host of its `worker_url`, the address its router hands out
    waits: float = 0.0  # the longest it waits for its other side (deployments.pd_wait)


def unreachable_from(prefill: PdServer, address: str) -> bool:
    """Whether a server on the machine at `address` cannot reach the prefill's bootstrap
    server: another machine, and it listens on loopback (as the router's own reach is judged;
    a `worker_url` at that very address is the user's word that it is reached there)."""
    if same_address(address, prefill.address):
        return False
    return is_loopback(prefill.bind) and prefill.bind != prefill.url_host


@dataclass(frozen=True)
class PdRouter:
    """A worker's router, as the pair checks see it (shown by its label)."""

    label: str
    address: str
    pd: bool  # it routes prefill/decode pairs
    request_timeout: float  # seconds before it gives up on a request

    def __str__(self) -> str:
        return self.label


def check_server(
    me: PdServer, others: Sequence[PdServer], router: PdRouter, mla: bool | None = None
) -> Findings:
    """What is wrong with `me` beside the other servers of its router (`mla`: their model uses
    MLA; None: not known). Each problem is about `me`, so a launch of several says each once."""
    found = Findings()
    if router.pd and me.role is None:
        found.problems.append(
            f"{me.label} has no role, but its router {router} routes prefill/decode pairs"
        )
        found.hints.append("set role: prefill or role: decode, or name a router without pd: true")
        return found
    if not router.pd:
        if me.role is not None:
            found.problems.append(
                f"{me.label} is a {me.role}, but its router {router} does not route "
                "prefill/decode pairs"
            )
            found.hints.append(f"set pd: true on {router}")
        return found
    opposite = PdRole.DECODE if me.role is PdRole.PREFILL else PdRole.PREFILL
    peers = [o for o in others if o.label != me.label and o.role is opposite]
    if not peers:
        found.problems.append(
            f"{me.label} is a {me.role}, but no {opposite} names its router {router}: "
            "nothing would serve"
        )
        return found
    for other in (o for o in others if o.label != me.label and o.role is not None):
        if other.model != me.model:
            found.problems.append(
                f"{me.label} serves {me.model} but {other.label}, behind the same router, "
                f"serves {other.model}"
            )
        if other.backend != me.backend:
            found.problems.append(
                f"{me.label} moves KV with {me.backend} but {other.label} with {other.backend}"
            )
            found.hints.append("set one transfer_backend for every server behind a router")
    if me.role is PdRole.PREFILL and me.backend == "fake":
        # SGLang asserts it at startup (arg_groups/pd_disaggregation_hook.py).
        found.problems.append(f"{me.label}: a prefill cannot use the fake transfer backend")
    for peer in peers:
        prefill, decode = (me, peer) if me.role is PdRole.PREFILL else (peer, me)
        # SGLang's KV receiver asserts it on the first transfer (disaggregation/common/conn.py).
        if decode.pp not in (prefill.pp, 1):
            found.problems.append(
                f"{decode.label} has pipeline parallelism {decode.pp}, but its prefill "
                f"{prefill.label} has {prefill.pp}: a decode's must be the prefill's or 1"
            )
        if peer.tp != me.tp and mla:
            found.warnings.append(
                f"{me.label} has TP {me.tp} and {peer.label} TP {peer.tp}: an MLA model may "
                f"differ, but watch it under load ({TP_MISMATCH_ISSUE})"
            )
        elif peer.tp != me.tp:
            found.problems.append(
                f"{me.label} has TP {me.tp} and {peer.label} TP {peer.tp}: the model is "
                f"{'not MLA' if mla is False else 'not known to be MLA'}, and a non-MLA model "
                f"crashes under load with different TP ({TP_MISMATCH_ISSUE})"
            )
            found.hints.append(
                "give prefills and decodes one TP (an MLA model, kv_lora_rank in its "
                "config.json, may differ)"
            )
        if unreachable_from(prefill, decode.address):
            found.problems.append(
                f"{decode.label} cannot fetch KV from {prefill.label}: its bootstrap server "
                f"listens on loopback ({prefill.bind}) ({LOOPBACK_BOOTSTRAP_ISSUE})"
            )
            found.hints.append(
                f"bind {prefill.label} where its decodes reach it (bind_host: 0.0.0.0)"
            )
    if me.role is PdRole.PREFILL and me.pp > 1:
        found.warnings.append(
            f"{me.label}: pipeline parallelism on a prefill has crashed ({PREFILL_PP_ISSUE})"
        )
    if me.waits >= router.request_timeout:
        # The client would see the router's timeout, never the failed transfer (sglang#24159).
        found.problems.append(
            f"{me.label} may wait {me.waits:g}s for its other side, but its router {router} "
            f"gives a request only {router.request_timeout:g}s"
        )
        found.hints.append(f"lower pd_timeout, or raise request_timeout on {router}")
    if me.role is PdRole.PREFILL and unreachable_from(me, router.address):
        found.problems.append(
            f"{me.label}'s bootstrap server listens on loopback ({me.bind}), where decodes "
            f"sent by its router {router} (on {router.address}) cannot reach it "
            f"({LOOPBACK_BOOTSTRAP_ISSUE})"
        )
    found.hints = list(dict.fromkeys(found.hints))
    found.warnings = list(dict.fromkeys(found.warnings))
    return found


def check_router(label: str, workers: Sequence[PdServer]) -> Findings:
    """A router in PD mode serves only with a prefill and a decode behind it."""
    found = Findings()
    for role in PdRole:
        if not any(w.role is role for w in workers):
            found.problems.append(
                f"{label} routes prefill/decode pairs, but no {role} names it: nothing would serve"
            )
    if found.problems:
        found.hints.append(f"give servers role: prefill and role: decode with router: {label}")
    return found


# ---- supervision: what watch makes of a pair's failures ------------------------------------


@dataclass
class PrefillLoss:
    """When watch last saw a prefill of each router down. A decode's health check fails for a
    while after its prefill died (sglang#12779): within `window` of that, a decode failing
    its health is the prefill's failure, not its own, and is not restarted."""

    window: float
    seen_down: dict[str, tuple[str, float]] = field(
        default_factory=dict
    )  # router -> (prefill, when)

    def down(self, router: str, prefill: str, now: float) -> None:
        self.seen_down[router] = (prefill, now)

    def blames(self, router: str | None, now: float) -> tuple[str, float] | None:
        """The prefill to blame for a decode's failure now, and how long ago it was seen down;
        None when no prefill of the router was down within the window."""
        if router is None or router not in self.seen_down:
            return None
        prefill, when = self.seen_down[router]
        return (prefill, now - when) if now - when < self.window else None


@dataclass
class TransferWatch:
    """Decodes whose requests wait for KV while no token comes out (a transfer stuck: the
    prefill's side failed, or the transfer hangs): each episode reported once, once it lasted
    `after` seconds."""

    after: float
    since: dict[str, tuple[float, float | None]] = field(
        default_factory=dict
    )  # target -> (since, tokens)
    reported: set[str] = field(default_factory=set)

    def look(
        self, target: str, now: float, waiting: int, tokens: float | None, throughput: float | None
    ) -> float | None:
        """One status round of a decode: `waiting` requests (running or in its transfer queue),
        `tokens` generated so far (None: not exported; then its throughput gauge says whether
        tokens come out). How long it has been stuck, the first round that reaches `after`."""
        previous = self.since.get(target)
        if previous is not None and tokens is not None and previous[1] is not None:
            progressed = tokens > previous[1]
        else:
            progressed = bool(throughput)
        if waiting <= 0 or previous is None or progressed:
            self.reported.discard(target)
            if waiting > 0:
                self.since[target] = (now, tokens)
            else:
                self.since.pop(target, None)
            return None
        stuck = now - previous[0]
        if stuck < self.after or target in self.reported:
            return None
        self.reported.add(target)
        return stuck
