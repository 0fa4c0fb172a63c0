"""SGLang's router as a deployment, and its workers' registration kept true.

A router is a deployment whose command runs `sglang_router.launch_router`; it holds no GPU.
A worker names its router with `router: HOST/DEPLOYMENT` (or `HOST`, when that host runs
one server). deployctl adds a worker to its router when the worker becomes ready (launch,
restart, watch) and removes it before stopping it; launching a router adds every ready
worker that names it. The router's list is read (`agent.WORKERS`) and changed
(`agent.ROUTER`) by the agent on the router's host, so a router bound to loopback works too.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from deployctl import agent
from deployctl import events as ev
from deployctl.addresses import machine_address
from deployctl.choices import PdRole
from deployctl.connection import Connection, Held
from deployctl.deployments import address_of, deployment_targets, is_loopback, node_rank
from deployctl.errors import BusyError, DeployctlError, InventoryError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet
from deployctl.inventory import Host
from deployctl.launchers import launcher_for, launcher_of
from deployctl.ops.flags import ROUTER_MODULE
from deployctl.remote.protocol import RunRecord, StatusArgs
from deployctl.remote.routing import HoldArgs, RouterArgs, RouterReply, WorkersArgs
from deployctl.remote.server_argv import CommandValues
from deployctl.remote.wire import listed_as, url_key
from deployctl.settings import SETTINGS
from deployctl.text import is_number

# Seconds a router may take to show an addition (healthy) or a removal in its list.
REGISTRATION_WAIT = 30.0
BOOTSTRAP_PORT: int = SETTINGS["bootstrap_port"].default  # SGLang's default too

Select = Callable[[str], list[Host]]


@dataclass(frozen=True)
class WorkerKind:
    """How a router lists a worker: its side of a prefill/decode pair (None: it serves whole
    requests) and, for a prefill, the bootstrap port the router hands to decodes."""

    role: PdRole | None = None
    bootstrap_port: int | None = None

    @classmethod
    def of_command(cls, argv: Sequence[str]) -> WorkerKind:
        """As the server's command says (SGLang's default bootstrap port when it sets none)."""
        return cls.of_values(CommandValues(argv))

    @classmethod
    def of_values(cls, values: CommandValues) -> WorkerKind:
        """As the values read from the server's command say."""
        mode = values.get("disaggregation_mode")
        if mode not in tuple(PdRole):
            return cls()
        role = PdRole(mode)
        port = values.get("disaggregation_bootstrap_port")
        if role is not PdRole.PREFILL:
            return cls(role)
        return cls(role, int(port) if port is not None and is_number(port) else BOOTSTRAP_PORT)

    @classmethod
    def of_run(cls, run: RunRecord, worker: Host) -> WorkerKind:
        """As the run was started (its recorded command), else as the inventory says."""
        try:
            return cls.of_command(shlex.split(str(run.get("command", ""))))
        except ValueError:
            return cls.of_settings(worker)

    @classmethod
    def of_settings(cls, worker: Host) -> WorkerKind:
        role = worker.settings.pd_role
        port = worker.settings.bootstrap_port if role is PdRole.PREFILL else None
        return cls(role, port)

    @classmethod
    def listed(cls, worker_type: str | None, bootstrap_port: int | None) -> WorkerKind | None:
        """As a router lists it; None when the router does not say."""
        if worker_type is None:
            return None
        role = PdRole(worker_type) if worker_type in tuple(PdRole) else None
        return cls(role, bootstrap_port if role is PdRole.PREFILL else None)

    def __str__(self) -> str:
        if self.role is None:
            return "a whole-request worker"
        port = f" (bootstrap port {self.bootstrap_port})" if self.bootstrap_port else ""
        return f"a {self.role}{port}"


def is_router_run(run: RunRecord | None) -> bool:
    """Was the run a router? Its record keeps the command as shown (masked, quoted)."""
    return run is not None and f"-m {ROUTER_MODULE}" in str(run.get("command", ""))


def router_of(worker: Host, select: Select) -> Host | None:
    """The router deployment a worker names (None: it names none); an error saying why when
    the name finds no router, or more than one."""
    ref = worker.settings.router
    if ref is None:
        return None
    where = f"router {ref!r}"  # the caller says whose
    name, _, deployment = ref.partition("/")
    try:
        hosts = [h for h in select(name) if h.name == name]
    except (InventoryError, DeployctlError):
        hosts = []
    if not hosts:
        raise InventoryError(
            f"{where} names no host of the inventory", hint="router: HOST/DEPLOYMENT"
        )
    try:
        targets = deployment_targets(hosts, deployment or None, select)
    except DeployctlError:
        targets = []
    if not targets:
        raise InventoryError(f"{where}: {name} has no deployment {deployment!r}")
    if len(targets) > 1:
        names = ", ".join(f"{name}/{t.deployment}" for t in targets)
        raise InventoryError(f"{where}: {name} runs several servers", hint=f"name one: {names}")
    return targets[0]


def worker_url(worker: Host, port: int | None = None, head: str = "") -> str:
    """Where the router reaches the worker: `worker_url`, else http://<ansible_host>:<port>;
    a Slurm job at its head node's address (`head`), which changes from job to job."""
    given = worker.settings.worker_url
    if given:
        return given.rstrip("/")
    address = f"[{head}]" if ":" in head else head
    return f"http://{address or address_of(worker)}:{port or worker.settings.server_port}"


def launch_url(worker: Host, port: int, address_known: bool) -> str:
    """The URL a run keeps in its record when it starts: where its router will list it. A
    Slurm job's (without `worker_url`) depends on its head node: "" (known once it runs)."""
    return "" if not address_known and not worker.settings.worker_url else worker_url(worker, port)


def registered_url(worker: Host, run: RunRecord, head: str = "") -> str:
    """Where the run's router lists it: the URL its record kept at launch, so that a
    `worker_url` edited since never names another deployment's server; older records and
    Slurm jobs: from its recorded port (and its job's head node)."""
    return run.get("worker_url") or worker_url(worker, run.get("port"), head)


def check_worker_urls(select: Select) -> None:
    """Refuse an inventory where two workers have one URL (a copy-paste slip of
    `worker_url`): a router cannot tell them apart, and the stop of one would take the
    other out of its router."""
    seen: dict[str, str] = {}
    for host in select("all"):
        try:  # a host's bad table is refused when the host is selected, not here
            targets = deployment_targets([host], None, select)
        except DeployctlError:
            continue
        for target in targets:
            if node_rank(target) != 0 or target.settings.router is None:
                continue
            known = launcher_for(target.settings).address_known_at_start
            if not known and not target.settings.worker_url:
                continue  # at its job's head node, which changes from job to job
            url = worker_url(target)
            other = seen.setdefault(url, target.label)
            if other != target.label:
                raise InventoryError(
                    f"{other} and {target.label} have one worker URL, {url}: their router "
                    "cannot tell them apart, and stopping one would take the other out of it",
                    hint="give each worker its own worker_url (or port); unset, it is "
                    "http://<ansible_host>:<port>",
                )


def reachability_problem(worker: Host, router: Host, bind_host: str) -> str | None:
    """Why the router could not reach the worker where it binds; None when it can (or when
    `worker_url` says how)."""
    if worker.settings.worker_url or not is_loopback(bind_host):
        return None
    if machine_address(router.address) == machine_address(worker.address):
        return None
    return (
        f"{worker.label} binds to {bind_host}, which its router {router.label} "
        f"(on {router.address}) cannot reach"
    )


@dataclass
class Registration:
    """One change to a router's list: a worker added or removed, or why it was not."""

    worker: str  # the worker's label
    router: str  # the router's label
    url: str
    added: bool  # True: an addition; False: a removal
    error: str = ""
    kind: WorkerKind = WorkerKind()  # an addition: as what the router lists it

    @property
    def ok(self) -> bool:
        return not self.error


def _workers_args(router: Host) -> WorkersArgs:
    """Where the router listens, reached from its own host."""
    return {"bind_host": router.settings.bind_host, "port": router.settings.server_port}


def _router_args(
    router: Host, action: str, url: str | None, wait: float, kind: WorkerKind
) -> RouterArgs:
    return {
        **_workers_args(router),
        "action": action,
        "url": url,
        "wait": wait,
        "worker_type": kind.role,
        "bootstrap_port": kind.bootstrap_port,
    }


def _router_call(
    fleet: Fleet,
    router: Host,
    action: str,
    url: str | None,
    wait: float = REGISTRATION_WAIT,
    kind: WorkerKind = WorkerKind(),
) -> RouterReply:
    args = _router_args(router, action, url, wait, kind)
    conn = fleet.connection(router)
    return agent.call(
        router, conn, agent.ROUTER, args, timeout=max(conn.command_timeout, wait + 30)
    )


def router_workers(router: Host, conn: Connection) -> RouterReply:
    """The router's worker list as it is now, read on its host: a read, so where the
    connection keeps an agent (a canary's rounds), no process is started for it."""
    # A legacy router's list may take two tries of its own timeout.
    timeout = max(conn.command_timeout, 30)
    return agent.call(router, conn, agent.WORKERS, _workers_args(router), timeout=timeout)


def router_silence(router: Host, conn: Connection) -> str:
    """Why the router does not answer for its worker list now ("" when it does)."""
    reply = router_workers(router, conn)
    return "" if reply["api"] is not None else reply["problem"] or "it does not answer"


def change_registration(
    fleet: Fleet,
    worker: Host,
    add: bool,
    port: int | None = None,
    events: EventSink = DISCARD,
    head: str = "",
    url: str = "",
    kind: WorkerKind | None = None,
) -> Registration | None:
    """Add the worker to its router (or remove it) and wait until the router's list shows
    it; None when the worker names no router. Never raises: the error is in the result.
    `head`: the head node of the Slurm job the worker's run is; `url`: the one its run
    recorded (`registered_url`), else the inventory's; `kind`: as what its run serves, else
    as the inventory says."""
    if node_rank(worker) != 0:  # a multi-node server registers rank 0's URL only
        return None
    try:
        router = router_of(worker, fleet.select)
    except DeployctlError as exc:
        failed = Registration(worker.label, str(worker.settings.router), "", add, exc.message)
        _said(failed, events)
        return failed
    if router is None:
        return None
    change = Registration(worker.label, router.label, url or worker_url(worker, port, head), add)
    change.kind = kind or WorkerKind.of_settings(worker)
    return _apply(fleet, router, change, events)


def _apply(
    fleet: Fleet, router: Host, change: Registration, events: EventSink = DISCARD
) -> Registration:
    """Make one change to the router's list; its error (if any) goes into it, and out as an event."""
    try:
        action = "add" if change.added else "remove"
        reply = _router_call(fleet, router, action, change.url, kind=change.kind)
        # A router that does not answer lists nobody: there is nothing to remove from it.
        change.error = "" if reply["api"] is None and not change.added else reply["problem"]
    except DeployctlError as exc:
        change.error = exc.message
    _said(change, events)
    return change


def _said(change: Registration, events: EventSink) -> None:
    events.emit(
        ev.RouterChanged(
            target=change.worker, router=change.router, url=change.url, added=change.added,
            error=change.error,
        )
    )  # fmt: skip


# ---- what a router lists, against what the inventory says it should --------------------


@dataclass
class ListedWorker:
    """One worker in a router's list, and which of ours it is (None: none of ours serves
    there)."""

    url: str
    healthy: bool | None
    load: int | None
    worker: str | None
    owner: str = ""  # the worker of ours whose URL it is, serving or not ("": none)
    kind: WorkerKind | None = None  # as the router lists it (None: it does not say)


@dataclass
class RouterState:
    """A router's list and its drift from the inventory: `unregistered` are our workers that
    run and answer but are not listed; `stray` are listed URLs where a worker of ours is
    known not to serve. Neither drift nor removable without --force: `unknown` URLs, whose
    worker's host cannot be read (URL -> that worker; `unread`: worker -> why), and
    `not_ours`, which the inventory names no worker at (another team's, or another
    inventory's)."""

    router: str
    api: str | None
    workers: list[ListedWorker] = field(default_factory=list)
    unregistered: dict[str, str] = field(default_factory=dict)  # worker label -> its URL
    stray: list[str] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)
    not_ours: list[str] = field(default_factory=list)
    error: str = ""
    # Our serving workers the router lists in another role (or with another bootstrap port)
    # than their run serves as: URL -> (the worker, as what it serves).
    miscast: dict[str, tuple[str, WorkerKind]] = field(default_factory=dict)
    pd: bool = False  # the router routes prefill/decode pairs
    kinds: dict[str, WorkerKind] = field(default_factory=dict)  # URL -> as what ours serves

    @property
    def drift(self) -> bool:
        return bool(self.unregistered or self.stray or self.miscast)

    @property
    def healthy(self) -> int:
        return sum(1 for w in self.workers if w.healthy is not False and w.worker is not None)

    @property
    def missing_roles(self) -> list[PdRole]:
        """A PD router serves only with a healthy prefill and a healthy decode listed: the
        roles it has none of (never any for a router of whole-request workers)."""
        if not self.pd or self.api is None:
            return []
        # The router's flag, unless our own status round saw ours not serving.
        serving = [
            w for w in self.workers if w.healthy is not False and not (w.worker is None and w.owner)
        ]
        return roles_missing(serving)


def roles_missing(workers: Iterable[ListedWorker]) -> list[PdRole]:
    """The sides of a prefill/decode pair none of these workers is listed as."""
    listed = {w.kind.role for w in workers if w.kind is not None}
    return [role for role in PdRole if role not in listed]


def workers_of(router: Host, select: Select) -> list[Host]:
    """Every deployment of the inventory that names this router (rank 0 of a multi-node one)."""
    found = []
    for target in deployment_targets(select("all"), None, select):
        if node_rank(target) != 0 or target.settings.router is None:
            continue
        try:
            named = router_of(target, select)
        except DeployctlError:
            continue
        if named is not None and named.label == router.label:
            found.append(target)
    return found


def _serving(worker: Host, conn: Connection) -> tuple[bool, str, WorkerKind]:
    """Is the worker's current run alive and answering /health, at which URL is it
    registered ("": no run), and as what does it serve? (The call runs.recorded_run makes:
    ops.runs builds on this module, not the other way.)"""
    args: StatusArgs = {
        "state_dir": worker.settings.state_dir,
        "deployment": worker.deployment,
        "run": None,
        "tail_bytes": 0,
        "metrics_bytes": 0,
    }
    reply = agent.call(worker, conn, agent.STATUS, args)
    run = reply["run"]
    if run is None:
        return False, "", WorkerKind.of_settings(worker)
    head = launcher_of(run).head(reply["placement"])
    url = registered_url(worker, run, head)
    return bool(reply["alive"]) and reply["health"] == 200, url, WorkerKind.of_run(run, worker)


def router_state(fleet: Fleet, router: Host) -> RouterState:
    """Read the router's list and every worker of ours that names it; say the drift."""
    reply = router_workers(router, fleet.connection(router))
    state = RouterState(
        router.label, reply["api"], error=reply["problem"], pd=router.settings.pd_router
    )
    read = fleet.run(_serving, workers_of(router, fleet.select))
    bug = next(
        (r.exception for r in read if r.failed and not isinstance(r.exception, DeployctlError)),
        None,
    )
    if bug is not None:
        raise bug
    # Keyed by `url_key`: the router may spell a URL of ours otherwise (a trailing slash).
    ours: dict[str, str] = {}  # URL -> the worker of ours that serves there now
    spelled: dict[str, str] = {}  # URL -> as ours spells it (its run's registered URL)
    kinds: dict[str, WorkerKind] = {}  # URL -> as what ours serves there
    idle: dict[str, str] = {}  # URL -> a worker of ours, read, that does not serve there
    unread: dict[str, str] = {}  # the inventory's URL of a worker whose host cannot be read
    for r in read:
        if r.value is None:
            unread[url_key(worker_url(r.host))] = r.name
            state.unread[r.name] = r.error or ""
        elif r.value[0]:
            key = url_key(r.value[1])
            ours[key], spelled[key], kinds[key] = r.name, r.value[1], r.value[2]
            state.kinds[r.value[1]] = r.value[2]
        else:
            for url in filter(None, (r.value[1], worker_url(r.host))):
                idle.setdefault(url_key(url), r.name)
    listed = [(url_key(w["url"]), w) for w in reply["workers"]]
    state.workers = [
        ListedWorker(
            w["url"], w["healthy"], w["load"], ours.get(key), ours.get(key) or idle.get(key, ""),
            WorkerKind.listed(w["worker_type"], w["bootstrap_port"]),
        )
        for key, w in listed
    ]  # fmt: skip
    if state.api is None:  # nothing answered: no list to judge, no drift
        return state
    keys = {key for key, _ in listed}
    state.unregistered = {label: spelled[key] for key, label in ours.items() if key not in keys}
    state.miscast = {
        spelled[key]: (str(w.worker), kinds[key])
        for (key, _), w in zip(listed, state.workers, strict=True)
        if w.worker is not None and w.kind is not None and w.kind != kinds[key]
    }
    for key, w in listed:
        if key in ours:
            continue
        if key in idle:
            state.stray.append(w["url"])
        elif key in unread:  # perhaps it serves there: only its host could say
            state.unknown[w["url"]] = unread[key]
        else:
            state.not_ours.append(w["url"])
    return state


def listed_load(fleet: Fleet, worker: Host, url: str) -> int | None:
    """The router's load for the worker at `url` while it still lists it (None: not listed,
    or the router gives none: the legacy one never does, 0.3's drops a removed worker at
    once)."""
    router = router_of(worker, fleet.select)
    if router is None:
        return None
    reply = router_workers(router, fleet.connection(router))
    return next((w["load"] for w in listed_as(reply["workers"], url)), None)


def serving_workers(fleet: Fleet, router: Host, state: RouterState) -> list[ListedWorker]:
    """The listed workers that serve its traffic now: the router does not call them unhealthy
    and either our status round saw them serving (ours) or they answer /health from the
    router's host now. A router's own flag is never enough: 0.3's keeps a dead worker
    healthy for a while, and the legacy one says nothing."""
    found = []
    for w in state.workers:
        if w.healthy is False or (w.worker is None and w.owner):  # ours, seen not serving
            continue
        if w.worker is not None or not _router_call(fleet, router, "health", w.url, 0)["problem"]:
            found.append(w)
    return found


# ---- one change through a router at a time ---------------------------------------------------


class _Holds:
    """The router locks this process holds: label -> (the held call, how many take it).
    A command's own threads (tune's deployments) share one."""

    lock = threading.Lock()
    held: dict[str, tuple[Held, int]] = {}


def _take(fleet: Fleet, router: Host, what: str) -> None:
    with _Holds.lock:
        if router.label in _Holds.held:
            held, count = _Holds.held[router.label]
            _Holds.held[router.label] = (held, count + 1)
            return
        args: HoldArgs = {
            "state_dir": router.settings.state_dir,
            "name": router.deployment or "_",
            "holder": {
                "what": what, "host": socket.gethostname(), "pid": os.getpid(),
                "user": getpass.getuser(),
            },
        }  # fmt: skip
        reply, held = agent.hold(router, fleet.connection(router), agent.HOLD, args)
        if not reply["acquired"]:
            held.close()
            raise BusyError(
                f"{router.label} is in use: {_holder_words(reply['holder'] or {})}",
                hint="wait for it to finish, then run this again (its lock ends with it)",
            )
        _Holds.held[router.label] = (held, 1)


def _holder_words(holder: dict[str, Any]) -> str:
    since = holder.get("since")
    when = (
        time.strftime(" since %H:%M:%S", time.localtime(since))
        if isinstance(since, int | float)
        else ""
    )
    return (
        f"deployctl {holder.get('what', 'operation')} (pid {holder.get('pid', '?')} "
        f"on {holder.get('host', '?')}, user {holder.get('user', '?')}){when}"
    )


def _release(router: Host) -> None:
    with _Holds.lock:
        held, count = _Holds.held.pop(router.label)
        if count > 1:
            _Holds.held[router.label] = (held, count - 1)
            return
    held.close()


@contextmanager
def router_locks(fleet: Fleet, routers: Iterable[Host], what: str) -> Iterator[None]:
    """Hold each router's lock (on its host) while `what` (rollout, restart --rolling, patch
    … --rolling, tune) takes its workers out and in: two at once could each leave the other
    no worker. Refuse (BusyError, naming the holder) when another deployctl holds one. A
    lock ends with its holder: a crash or a kill frees it with the connection."""
    taken: list[Host] = []
    try:
        for router in sorted({r.label: r for r in routers}.values(), key=lambda r: r.label):
            _take(fleet, router, what)
            taken.append(router)
        yield
    finally:
        for router in reversed(taken):
            _release(router)


def router_lock_of(fleet: Fleet, worker: Host, what: str) -> AbstractContextManager[None]:
    """`router_locks` for the router the worker names (nothing when it names none)."""
    router = router_of(worker, fleet.select)
    return router_locks(fleet, [router] if router is not None else [], what)


@dataclass
class SyncResult:
    """What `router sync` found and changed on one router; `kept`: the listed URLs it left,
    unknown or not ours, which --force would remove."""

    before: RouterState
    changes: list[Registration]
    dry_run: bool = False
    force: bool = False
    kept: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Read, every change made, and no URL left whose owner could not be checked."""
        unchecked = any(url in self.before.unknown for url in self.kept)
        return self.before.api is not None and all(c.ok for c in self.changes) and not unchecked


def sync_router(
    fleet: Fleet, router: Host, dry_run: bool = False, force: bool = False
) -> SyncResult:
    """Mend a router's drift: add our serving workers it lacks, remove what it lists where a
    worker of ours is known not to serve. A URL whose owner cannot be checked, or that no
    worker of the inventory has, is removed only with `force`."""
    state = router_state(fleet, router)
    owners = {w.url: w.owner for w in state.workers}
    others = [*state.unknown, *state.not_ours]
    removed = [*state.stray, *(others if force else [])]
    planned = [
        Registration(w, router.label, url, True, kind=state.kinds[url])
        for w, url in state.unregistered.items()
    ]
    # Listed in the wrong role: added anew as what it serves (the agent removes it first).
    planned += [
        Registration(w, router.label, url, True, kind=kind)
        for url, (w, kind) in state.miscast.items()
    ]
    planned += [Registration(owners.get(url, ""), router.label, url, False) for url in removed]
    kept = [] if force else others
    if dry_run or state.api is None:
        return SyncResult(state, planned, dry_run, force, kept)
    changes = [_apply(fleet, router, change) for change in planned]
    return SyncResult(state, changes, False, force, kept)


def register_workers_of(
    fleet: Fleet, routers: Iterable[Host], events: EventSink = DISCARD
) -> list[Registration]:
    """After a router came up: add every worker of ours that names it and serves."""
    changes: list[Registration] = []
    for router in routers:
        try:
            state = router_state(fleet, router)
        except DeployctlError as exc:
            changes.append(Registration("", router.label, "", True, exc.message))
            continue
        for label, url in state.unregistered.items():
            change = Registration(label, router.label, url, True, kind=state.kinds[url])
            changes.append(_apply(fleet, router, change, events))
    return changes
