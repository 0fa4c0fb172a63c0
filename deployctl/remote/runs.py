"""A deployment's runs on this host, whichever launcher starts them (remote/launchers.py):
preflight, start, poll, status, stop, point, runs."""

from __future__ import annotations

# `_socket`: `socket`'s own import brings `enum` and `selectors`, ~9 ms of a call's start.
import _socket
import os
import time

from .files import (
    base64_text,
    find_package,
    read_bytes,
    read_json,
    state_path,
    write_atomic,
    write_json,
)
from .launchers import launcher_of, launcher_to_poll, liveness, preflight_facts, start
from .locks import machine_identity, release_lock, take_lock
from .wire import POINTER, answers_at
from .wire import poll_args as protocol_poll_args

# The types for the checker only; a preflight's probe and flag check imported by it alone
# (files.py says why).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .protocol import (
        LiveRun,
        MetricsPage,
        PointArgs,
        PointReply,
        PollArgs,
        PollReply,
        PreflightArgs,
        PreflightReply,
        RunRecord,
        RunsArgs,
        RunsReply,
        StartArgs,
        StartReply,
        StatusArgs,
        StatusReply,
        StopArgs,
        StopReply,
    )


def version_of(name: str, stem: str, suffix: str) -> int | None:
    """N of a file named `<stem>_v<N><suffix>`; None for any other name."""
    head = f"{stem}_v"
    if not (name.startswith(head) and name.endswith(suffix)):
        return None
    digits = name[len(head) : len(name) - len(suffix)]
    return int(digits) if digits.isdecimal() else None


def next_log_version(log_dir: str, stem: str, runs_dir: str) -> int:
    """One more than the highest version of `stem` among the logs and the run records.

    Run records count too: a log deleted to save space must not let its run id, and so its
    record, be reused.
    """
    highest = 0
    for folder, suffix in ((log_dir, ".log"), (runs_dir, ".json")):
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                highest = max(highest, version_of(name, stem, suffix) or 0)
    return highest + 1


def module_found(module: str | None) -> bool:
    """Can `python -m module` find the module's top-level package (without importing it)?"""
    return not module or find_package(module.split(".")[0]) is not None


def port_free(host: str, port: int) -> tuple[bool, str]:
    address = "0.0.0.0" if host in ("", "0.0.0.0") else host
    sock = _socket.socket(_socket.AF_INET6 if ":" in address else _socket.AF_INET)
    try:
        # Like the server will: connections in TIME_WAIT do not make the port busy.
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        sock.bind((address, int(port)))
    except OSError as exc:
        return False, str(exc)
    finally:
        sock.close()
    return True, ""


def writable_dir(path: str) -> tuple[bool, str]:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return False, str(exc)
    return os.access(path, os.W_OK | os.X_OK), "not writable"


def cmd_preflight(args: PreflightArgs) -> PreflightReply:
    """Everything a launch needs to know, and the host lock, in one round trip."""
    from .patches import cmd_probe
    from .sglang_options import argv_check

    probe = cmd_probe(args)
    log_dir = os.path.expanduser(args["log_dir"])
    free, port_error = port_free(args["bind_host"], args["port"])
    busy = {
        port: why
        for port, address in args["also_ports"].items()
        for ok, why in [port_free(address, int(port))]
        if not ok
    }
    writable, log_dir_error = writable_dir(log_dir)
    version = next_log_version(log_dir, args["log_stem"], state_path(args["state_dir"], "runs"))
    return {
        **probe,
        "live_runs": live_runs(args["state_dir"]),
        "module_found": module_found(args["module"]),
        "port_free": free,
        "port_error": port_error,
        "busy_ports": busy,
        # As the server will see them: it runs from the home folder, and no shell expands a
        # `~` inside `--flag=~/x` for it.
        "paths": {
            p: os.path.exists(os.path.join(os.path.expanduser("~"), p)) for p in args["check_paths"]
        },
        "log_dir_writable": writable,
        "log_dir_error": log_dir_error,
        "next_log": os.path.join(log_dir, f"{args['log_stem']}_v{version}.log"),
        "next_version": version,
        "argv_check": argv_check(args["server_argv"], probe["sglang"]),
        "lock": take_lock(
            args["state_dir"], args["client"], args["break_lock"], args["deployment"], args["gpus"]
        ),
        "model_mla": model_mla(args["model"]),
        "machine": machine_identity(),
        "launcher_facts": preflight_facts(),
    }


def model_mla(model: str | None) -> bool | None:
    """Does the model use MLA (DeepSeek V2/V3, Kimi K2: `kv_lora_rank` in its config, or its
    text model's)? None when its config.json cannot be read."""
    if not model:
        return None
    config = read_json(os.path.join(os.path.expanduser("~"), model, "config.json"))
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    return "kv_lora_rank" in config or (isinstance(text, dict) and "kv_lora_rank" in text)


def cmd_start(args: StartArgs) -> StartReply:
    """Start the server detached in its own session, logging to a new versioned file."""
    state_dir, log_dir = args["state_dir"], os.path.expanduser(args["log_dir"])
    runs = state_path(state_dir, "runs")
    os.makedirs(log_dir, exist_ok=True)
    for path, text in args["files"].items():  # what the command names, e.g. its config
        target = os.path.join(os.path.expanduser("~"), os.path.expanduser(path))
        if read_bytes(target) != text.encode():
            os.makedirs(os.path.dirname(target), exist_ok=True)
            write_atomic(target, text.encode(), mode=0o644)
    version = max(next_log_version(log_dir, args["log_stem"], runs), args["min_version"])
    while True:  # O_EXCL: a log is never reused, even by a racing start
        run_id = f"{args['log_stem']}_v{version}"
        log_path = os.path.join(log_dir, run_id + ".log")
        if os.path.exists(os.path.join(runs, run_id + ".json")):
            version += 1
            continue
        try:
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            break
        except FileExistsError:
            version += 1
    record = start(args, run_id, log_path, log_fd)
    # Private: the record shows the (masked) command, and the .cmd file the real one.
    write_atomic(os.path.join(runs, run_id + ".cmd"), args["command"].encode(), mode=0o600)
    write_json(os.path.join(runs, run_id + ".env"), args["env"], mode=0o600)
    write_json(os.path.join(runs, run_id + ".json"), record, mode=0o600)
    write_atomic(os.path.join(runs, pointer_name(args["deployment"])), run_id.encode())
    if args["lock_token"]:
        release_lock(state_dir, args["lock_token"], args["deployment"])
    return {"run": record}


def server_address(bind_host: str) -> str:
    """Where a client on this host reaches a server bound to `bind_host` (any address: loopback)."""
    return "127.0.0.1" if bind_host in ("", "0.0.0.0", "::") else bind_host


def http_get(
    host: str, port: int, path: str, limit: int = 0, timeout: float = 0.5, method: str = "GET"
) -> tuple[int | None, bytes]:
    """GET `path` from the server on this host: the status code (None when nothing answers)
    and up to `limit` bytes of the body. HTTP/1.0: the server closes the connection after
    its answer."""
    address = server_address(host)
    request = f"{method} {path} HTTP/1.0\r\nHost: {address}\r\nContent-Length: 0\r\n\r\n"
    try:
        received = _exchange(address, int(port), request.encode(), limit, timeout)
    except OSError:
        return None, b""
    head, _, body = received.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    code = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else None
    return code, body[:limit]


def _exchange(address: str, port: int, request: bytes, limit: int, timeout: float) -> bytes:
    """Send `request` to the first of the address's addresses that takes a connection, and
    read its answer until it ends, or up to its status line (`limit` 0) or `limit` bytes of
    body (as socket.create_connection and a file's reads, each step within `timeout`)."""
    failed: OSError = OSError(f"{address} has no address")
    for family, kind, proto, _, where in _socket.getaddrinfo(address, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            sock.sendall(request)
            received = bytearray()
            while not _enough(received, limit):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
            return bytes(received)
        except OSError as exc:
            failed = exc
        finally:
            sock.close()
    raise failed


def _enough(received: bytearray, limit: int) -> bool:
    if not limit:
        return b"\r\n" in received
    end = received.find(b"\r\n\r\n")
    return end >= 0 and len(received) - end - 4 >= limit


# Real SGLang's /health (0.5.17: the same handler as /health_generate) sends a 1-token request
# to the scheduler and answers 200 only after a 1 s sleep, under load too: 0.5 s never saw it.
HEALTH_TIMEOUT = 5.0


def health(host: str, port: int) -> int | None:
    """GET /health on the host itself: the status code, or None when nothing answers."""
    return http_get(host, port, "/health", timeout=HEALTH_TIMEOUT)[0]


def read_from(path: str, offset: int, limit: int) -> tuple[int, bytes]:
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = size - limit if offset < 0 else offset
            handle.seek(max(0, min(start, size)))
            data = handle.read(limit)
    except OSError:
        return 0, b""
    return size, data


def cmd_poll(args: PollArgs) -> PollReply:
    """Is the run alive, is it healthy, and what did its log gain since `offset`.

    With `wait`, keep watching (in this one process) until something changes, so the
    caller learns of a ready line or a crash within ~50 ms instead of a poll interval. A
    Slurm job is asked of slurmctld at most every SLURM_QUERY_EVERY seconds meanwhile.
    """
    deadline = time.monotonic() + float(args["wait"])
    watch = launcher_to_poll(args).watch(args)
    while True:
        members, alive, address, serving = watch.look()
        size, data = read_from(args["log"], args["offset"], args["limit"])
        code = health(address, args["port"]) if serving and address else None
        if data or not alive or code == 200 or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    watch.end()
    return {
        "alive": alive,
        "members": members,
        "health": code,
        "size": size,
        "data": base64_text(data),
        "placement": watch.placement,
    }


def pointer_name(deployment: str | None) -> str:
    """The file naming a deployment's current run: `current`, or `current-NAME`."""
    return POINTER if deployment is None else f"{POINTER}-{deployment}"


def current_run(
    state_dir: str, run_id: str | None = None, deployment: str | None = None
) -> RunRecord | None:
    runs = state_path(state_dir, "runs")
    if run_id is None:
        current = read_bytes(os.path.join(runs, pointer_name(deployment)))
        if current is None:
            return None
        run_id = current.decode().strip()
    record: RunRecord | None = read_json(os.path.join(runs, run_id + ".json"))
    return record


def live_runs(state_dir: str) -> list[LiveRun]:
    """Every deployment's current run on this host that still has processes."""
    runs = state_path(state_dir, "runs")
    names = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    found: list[LiveRun] = []
    for name in names:
        if name != POINTER and not name.startswith(POINTER + "-"):
            continue
        deployment = name[len(POINTER) + 1 :] or None
        run = current_run(state_dir, deployment=deployment)
        if not run or run["status"] != "running":
            continue
        members, alive, said = liveness(run)
        if alive:
            live: LiveRun = {
                "id": run["id"],
                "pid": run["pid"],
                "deployment": deployment,
                "gpus": run.get("gpus"),
                "mem_fraction_static": run.get("mem_fraction_static"),
                "port": run["port"],
                "members": members,
                "origin": run.get("origin"),
                **said,  # its launcher, its placement's id
            }
            found.append(live)
    return found


def cmd_runs(args: RunsArgs) -> RunsReply:
    return {"live_runs": live_runs(args["state_dir"])}


def cmd_status(args: StatusArgs) -> StatusReply:
    """The current (or named) run with liveness, health and the tail of its log."""
    run = current_run(args["state_dir"], args["run"], args["deployment"])
    if run is None:
        nothing: PollReply = {
            "alive": False, "members": [], "health": None, "size": 0, "data": "",
            "placement": None,
        }  # fmt: skip
        return {**nothing, "run": None, "command": None, "env": None, "metrics": None}
    ref = launcher_of(run).placement_ref(args["state_dir"], run)
    poll_args = protocol_poll_args(run, ref, -1, args["tail_bytes"], wait=0)
    poll = cmd_poll(poll_args)
    command = read_bytes(state_path(args["state_dir"], "runs", run["id"] + ".cmd"))
    env = read_json(state_path(args["state_dir"], "runs", run["id"] + ".env"))
    metrics: MetricsPage | None = None
    if args["metrics_bytes"] > 0 and poll["alive"]:
        address = answers_at(run["bind_host"], poll["placement"])
        code, body = http_get(address, run["port"], "/metrics", args["metrics_bytes"], 2.0)
        metrics = {"status": code, "text": body.decode("utf-8", "replace")}
    return {
        **poll,
        "run": run,
        "command": None if command is None else command.decode(),
        "env": env if isinstance(env, dict) else None,
        "metrics": metrics,
    }


def cmd_stop(args: StopArgs) -> StopReply:
    """End the current (or named) run as its launcher does."""
    state_dir = args["state_dir"]
    run = current_run(state_dir, args["run"], args["deployment"])
    if run is None:
        return {"run": None, "ended": [], "killed": [], "left": [], "placement": None,
                "shutdown": None, "shutdown_s": None}  # fmt: skip
    timeout = float(args["timeout"])
    return launcher_of(run).stop(state_dir, run, timeout, args["first_signal"])


def cmd_point(args: PointArgs) -> PointReply:
    """Make a recorded run the deployment's current one (a successor that failed gives way
    to the run it was to replace)."""
    if current_run(args["state_dir"], args["run"]) is None:
        return {"pointed": False}
    runs = state_path(args["state_dir"], "runs")
    write_atomic(os.path.join(runs, pointer_name(args["deployment"])), args["run"].encode())
    return {"pointed": True}
