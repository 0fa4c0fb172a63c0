"""The launch_server main process: ranks, HTTP, signals, readiness, multi-node, drain."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import random
import select
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

from .adaptive_spec import (
    DEFAULT_CUDA_GRAPH_MAX_BS,
    adaptive_steps,
    cuda_graph_batch_sizes,
    initial_slot_steps,
)
from .decoder import Decoder, DecodeStats
from .http_facing import HTTPFacing
from .http_surface import activate, make_http_server
from .log_lines import (
    SIGQUIT_LINE,
    SIGTERM_LINE,
    child_crashed_line,
    drain_line,
    kill_tree_line,
    log,
    scheduler_exit_line,
    uvicorn_log,
    write,
)
from .pd_decode import DecodePD
from .pd_prefill import PrefillPD
from .ranks import CHILD_FLAG
from .server_args import server_args_dict
from .sglang_sources import THRESHOLD_FIELD, sglang_root
from .tracebacks import format_traceback

if TYPE_CHECKING:
    import argparse
    import subprocess
    from http.server import ThreadingHTTPServer

# After a SIGQUIT the parent waits this long at most for the other crashing
# ranks to print their tracebacks before it kills the tree.
CRASH_GATHER_S = 1.0
WATCHDOG_INTERVAL_S = 1.0  # SGLang's SubprocessWatchdog polls every second
# After a drain, how long the main process waits for its schedulers to exit on the
# ShutdownReq before it kills its tree (TokenizerManager.sigterm_watchdog's 15 s).
SCHEDULER_EXIT_S = 15.0
# What rank 0 sends the other nodes once its drain has ended: its ShutdownReq, which SGLang
# broadcasts to every rank.
SHUTDOWN_BYTE = b"S"


class Launcher(HTTPFacing):
    """The launch_server main process: ranks, HTTP, signals, readiness."""

    def __init__(
        self,
        args: argparse.Namespace,
        knobs: dict[str, Any],
        adaptive_slots: dict[int, list[int]] | None = None,
    ) -> None:
        self.args = args
        self.knobs = knobs
        self.listen_host: str = knobs["bind_by_node"].get(
            os.environ.get("SLURMD_NODENAME", ""), args.host
        )
        self.pid = os.getpid()
        self.server_args = server_args_dict(args)
        self.served_model_name: str = self.server_args["served_model_name"]
        self.ranks: list[subprocess.Popen[bytes]] = []
        self.children: list[subprocess.Popen[bytes]] = []
        self.detokenizer: subprocess.Popen[bytes] | None = None
        self.ctl_fds: list[int] = []
        self.status_r: int | None = None  # ranks report "ready N" / "crashed N" here
        self.status_buf = b""
        self.started_ranks: set[int] = set()
        self.ready_ranks: set[int] = set()
        self.crashed_ranks: set[int] = set()
        self.sigquit_pending = False
        self.http: ThreadingHTTPServer | None = None
        self.ready = False
        self.exiting = False
        self.sigterm_at: float | None = None
        self.requests: dict[str, float] = {}  # rid -> arrival, of the requests answering now
        self.requests_lock = threading.Lock()
        self.startup_time = time.time()
        self.node_rank = args.node_rank if args.nnodes > 1 else 0
        threshold = getattr(args, THRESHOLD_FIELD, None)
        adaptive = None
        if adaptive_slots is not None:
            max_bs = args.cuda_graph_max_bs_decode or DEFAULT_CUDA_GRAPH_MAX_BS
            graph_bs = None if args.disable_cuda_graph else cuda_graph_batch_sizes(max_bs)
            adaptive = functools.partial(
                adaptive_steps,
                slots=adaptive_slots,
                num_steps=args.speculative_num_steps,
                graph_bs=graph_bs,
            )
        self.decoder = Decoder(
            knobs, bool(args.speculative_algorithm), threshold, adaptive,
            os.path.join(args.model_path, "standin-jit-cache.json"),
        )  # fmt: skip
        self.decoder.thresholded = threshold is not None or any(
            initial_slot_steps(c, args.speculative_num_steps) == 0
            for c in (adaptive_slots or {}).values()
        )
        if knobs["crash"] == "above_threshold":
            self.decoder.on_plain_fallback = self.crash_schedulers
        self.pd: PrefillPD | DecodePD | None = None
        if args.disaggregation_mode == "prefill":
            self.pd = PrefillPD(self)
        elif args.disaggregation_mode == "decode":
            self.pd = DecodePD(self)
        graphs = not args.disable_cuda_graph and args.cuda_graph_backend_decode != "disabled"
        self.decoder.stats = DecodeStats(
            args.decode_log_interval,
            bool(args.speculative_algorithm),
            (args.speculative_num_draft_tokens or 4) - 1,
            (args.cuda_graph_max_bs_decode or DEFAULT_CUDA_GRAPH_MAX_BS) if graphs else None,
            self.rank_prefix(0 if args.dp_size > 1 else None, 0),
            self.pd_decode_figures if isinstance(self.pd, DecodePD) else None,
        )
        self.peers: list[socket.socket] = []  # rank 0: the other nodes; others: rank 0
        self.shutdown_asked = False  # a node > 0: rank 0's drain has ended
        self.peer_lost_at: float | None = None
        config = self._hf_config()
        archs = config.get("architectures") or ["LlamaForCausalLM"]
        self.arch: str = archs[0]
        self.model_type: str | None = config.get("model_type")
        self.context_len = int(config.get("max_position_embeddings") or 4096)
        if args.context_length and str(args.context_length).isdigit():
            self.context_len = int(args.context_length)

    def _hf_config(self) -> dict[str, Any]:
        try:
            with open(os.path.join(self.args.model_path, "config.json"), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- HTTP-facing state: HTTPFacing, in http_facing.py ---------------------

    # -- start-up -------------------------------------------------------------

    def bind(self) -> str | None:
        """Bind the HTTP port; return uvicorn's error text when that fails."""
        host, port = self.listen_host, self.args.port
        try:
            infos = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except socket.gaierror as exc:
            return str(exc)
        family, _, _, _, sockaddr = infos[0]
        server = make_http_server(family, sockaddr, self)
        error = activate(server, sockaddr)
        if error is not None:
            return error
        self.http = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return None

    def rank_layout(self) -> list[tuple[int | None, int]]:
        """Return (dp rank or None, tp rank) per scheduler process."""
        tp, dp = max(1, self.args.tp_size), max(1, self.args.dp_size)
        if self.args.nnodes > 1:  # this node's share of the TP ranks
            per_node = tp // self.args.nnodes
            return [
                (None, t) for t in range(self.node_rank * per_node, (self.node_rank + 1) * per_node)
            ]
        if dp == 1:
            return [(None, t) for t in range(tp)]
        if self.args.enable_dp_attention:
            width = tp // dp if tp % dp == 0 else 1
            return [(t // width, t) for t in range(tp)]
        return [(d, t) for d in range(dp) for t in range(tp)]

    def pd_decode_figures(self) -> str:
        """The part of a PD decode's `Decode batch` line about its queues (no pool here)."""
        queues = self.pd.queues if self.pd is not None else {}
        figures = (
            "pre-allocated usage: 0.00, "
            f"#prealloc-req: {queues.get('num_decode_prealloc_queue_reqs', 0)}, "
            f"#transfer-req: {queues.get('num_decode_transfer_queue_reqs', 0)}, "
        )
        if self.args.disaggregation_decode_host_receive_threshold < 1:
            figures += "#host-receive-req: 0, "
        return figures + "#retracted-req: 0, "

    def rank_prefix(self, dp_rank: int | None, tp_rank: int) -> str:
        """The `[time DPd TPt]` part a rank's log lines carry."""
        prefix = "" if dp_rank is None else f" DP{dp_rank}"
        return prefix + (f" TP{tp_rank}" if self.args.tp_size > 1 else "")

    def spawn_children(self, t0: float) -> None:
        """Start the ranks and the detokenizer."""
        self.status_r, status_w = os.pipe()
        spec = bool(self.args.speculative_algorithm)
        draft_tokens = self.args.speculative_num_draft_tokens or 4
        max_bs = self.args.cuda_graph_max_bs_decode or DEFAULT_CUDA_GRAPH_MAX_BS
        capture_bs = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64) if b <= max_bs]
        capture_bs += list(range(80, max_bs + 1, 16))
        common = {
            "parent": self.pid,
            "startup_s": float(self.knobs["startup_s"]),
            "crash": self.knobs["crash"],
            "crash_after_s": float(self.knobs["crash_after_s"]),
            "crash_message": str(self.knobs["crash_message"]),
            "gpu_mib": int(self.knobs["gpu_mib"]),
            "gpu_fraction": bool(self.knobs["gpu_fraction"]),
            "mem_fraction": self.args.mem_fraction_static,
            "tp": max(1, self.args.tp_size),
            "host_mib": int(self.knobs["host_mib"]),
            "pdeathsig": bool(self.knobs["pdeathsig"]),
            "sglang_root": sglang_root(),
            "arch": self.arch,
            "context_len": self.context_len,
            "speculative": spec,
            "draft_tokens": draft_tokens,
            "capture_bs": capture_bs,
            "status_fd": status_w,
        }
        # CUDA numbers only the devices CUDA_VISIBLE_DEVICES names (all when it is unset).
        names = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = None if names is None else [v for v in names.split(",") if v.strip()]
        if visible is not None:
            log(f"[standin] CUDA_VISIBLE_DEVICES={names}: {len(visible)} visible GPUs")
        for index, (dp_rank, tp_rank) in enumerate(self.rank_layout()):
            prefix = self.rank_prefix(dp_rank, tp_rank)
            ctl_r, ctl_w = os.pipe()
            gpu = self.args.base_gpu_id + index
            cfg = {
                **common,
                "role": "rank",
                "index": index,
                "prefix": prefix,
                "title": f"sglang::scheduler{prefix.replace(' ', '_')}",
                "gpu": gpu,
                "first": index == 0,
                "ignore_sigterm": bool(self.knobs["ignore_sigterm"]),
                "ctl_fd": ctl_r,
            }
            if visible is not None and gpu >= len(visible):
                # As torch.cuda.set_device fails for a rank beyond the visible devices.
                cfg.update(crash="startup", crash_message="CUDA error: invalid device ordinal")
            proc = self._spawn(cfg, (status_w, ctl_r))
            os.close(ctl_r)
            self.ranks.append(proc)
            self.ctl_fds.append(ctl_w)
        detok = {**common, "role": "detokenizer", "title": "sglang::detokenizer"}
        ignore = bool(self.knobs["ignore_sigterm"])
        self.detokenizer = self._spawn({**detok, "ignore_sigterm": ignore}, ())
        os.close(status_w)
        self.release_ranks(t0)

    def release_ranks(self, t0: float) -> None:
        """Wait until every rank has started, then start their schedules together: from t0,
        or from now less a little when process creation lagged (eight ranks on a small CPU)."""
        self.wait_for_reports(self.started_ranks)
        span = float(self.knobs["startup_s"])
        self.tell_ranks(f"go {max(t0, time.time() - 0.05 * span)!r}\n".encode())

    def crash_schedulers(self) -> None:
        """Tell every rank to fail now, as the running schedulers do on the threshold bug."""
        line = f"crash {time.time()!r}\n".encode()
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, line)

    def _spawn(self, cfg: dict[str, Any], fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
        import subprocess  # the main process only; ranks start faster without it

        # -S skips site (tens of ms per rank) unless a rank needs torch from it.
        flags = [] if cfg["gpu_mib"] > 0 or cfg["gpu_fraction"] else ["-S"]
        # The package re-executed by path (its __main__.py), installed or not; the command
        # line names sglang_standin until the rank sets its title.
        package = os.path.dirname(os.path.abspath(__file__))
        cmd = [sys.executable, *flags, package, CHILD_FLAG, json.dumps(cfg)]
        # Same process group and session as the parent, like mp.Process.
        proc = subprocess.Popen(cmd, pass_fds=fds)
        self.children.append(proc)
        return proc

    def read_reports(self, timeout: float) -> None:
        """Collect "started N", "ready N" and "crashed N" lines from the ranks for up to
        ``timeout`` s."""
        if self.status_r is None:
            time.sleep(timeout)
            return
        readable, _, _ = select.select([self.status_r], [], [], timeout)
        if not readable:
            return
        chunk = os.read(self.status_r, 4096)
        if not chunk:  # every rank has closed its end
            os.close(self.status_r)
            self.status_r = None
            return
        *lines, self.status_buf = (self.status_buf + chunk).split(b"\n")
        reports = {b"started": self.started_ranks, b"ready": self.ready_ranks}
        for line in lines:
            word, _, index = line.partition(b" ")
            reports.get(word, self.crashed_ranks).add(int(index))

    def pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for rank reports, then act on a pending SIGQUIT."""
        self.read_reports(timeout)
        if self.sigquit_pending:
            self.handle_sigquit()

    def idle_until(self, deadline: float) -> None:
        while time.time() < deadline:
            self.pump(min(0.05, max(0.0, deadline - time.time())))

    def wait_for_ranks(self) -> None:
        """Block until every rank reports ready, failing like SGLang if one dies."""
        self.wait_for_reports(self.ready_ranks)

    def wait_for_reports(self, reported: set[int]) -> None:
        """Block until every rank is in ``reported``, failing like SGLang if one dies."""
        while len(reported) < len(self.ranks):
            self.pump(0.2)
            for index, proc in enumerate(self.ranks):
                code = proc.poll()
                if code is not None and index not in reported:
                    self.fail_rank_died(index, code)

    def fail_rank_died(self, index: int, code: int) -> NoReturn:
        """Exit like launch_server when a rank dies without a traceback."""
        self.kill_process_tree(include_parent=False)
        message = (
            f"Rank {index} scheduler died during initialization (exit code: {code}). "
            "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
            "Run `dmesg -T | grep -i oom` to check."
        )
        root = sglang_root()
        write(
            2,
            "Traceback (most recent call last):\n"
            f'  File "{root}/launch_server.py", line 86, in <module>\n'
            "    run_server(server_args)\n"
            f'  File "{root}/srt/entrypoints/engine.py", line 2027, in _wait_for_scheduler_ready\n'
            "    raise _scheduler_died_error(i, scheduler_procs[i])\n"
            f"RuntimeError: {message}\n",
        )
        os._exit(1)

    def kill_process_tree(self, include_parent: bool) -> None:
        log(kill_tree_line(self.pid, include_parent))
        for proc in self.children:
            with contextlib.suppress(OSError):
                proc.kill()
        if include_parent:
            os.kill(self.pid, signal.SIGKILL)

    # -- signals ----------------------------------------------------------------

    def on_sigquit(self, signum: int, frame: Any) -> None:
        self.sigquit_pending = True  # acted on by pump(), outside the handler

    def handle_sigquit(self) -> NoReturn:
        """Log SGLang's SIGQUIT line for the current phase and kill the tree."""
        if self.knobs["crash"] or self.knobs["pd_crash"]:
            # Let the other crashing ranks finish their tracebacks first.
            deadline = time.time() + CRASH_GATHER_S
            while time.time() < deadline and any(
                proc.poll() is None and index not in self.crashed_ranks
                for index, proc in enumerate(self.ranks)
            ):
                self.read_reports(0.05)
        if self.ready:
            # The tokenizer manager's handler, added through the event loop,
            # so SGLang formats signum and frame as None.
            log(SIGQUIT_LINE)
        else:
            log("Received sigquit from a child process. It usually means the child failed.")
        self.kill_process_tree(include_parent=True)
        os._exit(1)  # not reached: kill_process_tree SIGKILLs this process

    def on_sigterm_running(self, signum: int, frame: Any) -> None:
        # TokenizerManager's SignalHandler.sigterm_handler: it only sets gracefully_exit;
        # sigterm_watchdog does the rest (serve() here).
        log(SIGTERM_LINE)
        if not self.exiting:
            self.exiting = True
            self.sigterm_at = time.time()

    # -- phases -------------------------------------------------------------------

    def uvicorn_startup_lines(self) -> None:
        uvicorn_log("INFO", f"Started server process [{self.pid}]")
        uvicorn_log("INFO", "Waiting for application startup.")
        uvicorn_log("INFO", "Application startup complete.")

    def exit_bind_failed(self, error: str) -> NoReturn:
        uvicorn_log("ERROR", error)
        uvicorn_log("INFO", "Waiting for application shutdown.")
        uvicorn_log("INFO", "Application shutdown complete.")
        # launch_server's `finally: kill_process_tree(os.getpid(), include_parent=False)`
        self.kill_process_tree(include_parent=False)
        os._exit(1)

    # -- multi-node: rank 0 hosts the rendezvous at --dist-init-addr, the others join it --

    def dist_address(self) -> tuple[str, int]:
        host, _, port = (self.args.dist_init_addr or "").rpartition(":")
        if not host or not port.isdigit():
            self.fail_dist(
                f"ValueError: --dist-init-addr {self.args.dist_init_addr!r} is not host:port"
            )
        return host.strip("[]"), int(port)

    def fail_dist(self, error: str) -> NoReturn:
        """Fail the way torch.distributed's rendezvous fails in a scheduler, and exit."""
        tb = format_traceback([], sglang_root(), error)
        log(f"Scheduler hit an exception: {tb}", " TP0" if self.args.tp_size > 1 else "")
        log("Received sigquit from a child process. It usually means the child failed.")
        self.kill_process_tree(include_parent=False)
        os._exit(1)

    def open_rendezvous(self) -> socket.socket:
        host, port = self.dist_address()
        server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as c10d's TCPStore does
        try:
            server.bind((host, port))
        except OSError as exc:
            self.fail_dist(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on "
                f"any local network address. port: {port}, useIpv6: false, code: -{exc.errno}, "
                f"name: {errno.errorcode.get(exc.errno or 0, '?')}, message: {exc.strerror}"
            )
        server.listen(16)
        return server

    def gather_nodes(self, server: socket.socket) -> None:
        """Rank 0: wait until every other node has joined and brought its ranks up (NCCL's
        init needs every rank); a node that drops out on the way fails this one too."""
        deadline = time.time() + float(self.knobs["dist_timeout_s"])
        server.settimeout(0.05)
        ready: set[socket.socket] = set()
        while len(ready) < self.args.nnodes - 1:
            self.pump(0)
            if time.time() > deadline:
                self.fail_dist(
                    f"torch.distributed.DistStoreError: Timed out after "
                    f"{self.knobs['dist_timeout_s']:g} seconds waiting for clients. "
                    f"{len(self.peers) + 1}/{self.args.nnodes} clients joined."
                )
            if len(self.peers) < self.args.nnodes - 1:
                with contextlib.suppress(TimeoutError):
                    self.peers.append(server.accept()[0])
            readable, _, _ = select.select([p for p in self.peers if p not in ready], [], [], 0.05)
            for peer in readable:
                if peer.recv(6) != b"ready\n":  # the node's end closed: it failed
                    self.fail_dist(
                        "torch.distributed.DistBackendError: NCCL error in: "
                        "../torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process "
                        "exited or there was a network error, NCCL version 2.27.5"
                    )
                ready.add(peer)
        server.close()

    def join_rank0(self) -> None:
        """A node > 0: connect to rank 0's rendezvous, retrying as torch does."""
        host, port = self.dist_address()
        deadline = time.time() + float(self.knobs["dist_timeout_s"])
        while True:
            try:
                self.peers.append(socket.create_connection((host, port), timeout=1.0))
                return
            except OSError as exc:
                if time.time() > deadline:
                    self.fail_dist(
                        "torch.distributed.DistNetworkError: The client socket has timed out "
                        f"after {self.knobs['dist_timeout_s']:g}s while trying to connect to "
                        f"({host}, {port}). {exc.strerror or exc}"
                    )
                time.sleep(0.1)

    def check_peers(self) -> bool:
        """Another node gone: NCCL's watchdog ends this node a little later.  True once
        rank 0's drain has ended (its ShutdownReq reaches every rank): from then on the
        nodes part without an error."""
        if self.shutdown_asked:
            return False
        if self.peer_lost_at is None:
            readable, _, _ = select.select(self.peers, [], [], 0)
            for peer in readable:
                byte = peer.recv(1)
                if byte == SHUTDOWN_BYTE:
                    self.shutdown_asked = True
                    return True
                if not byte:
                    self.peer_lost_at = time.time()
        elif time.time() >= self.peer_lost_at + float(self.knobs["peer_loss_s"]):
            first = self.rank_layout()[0][1]
            log(
                f"[PG ID 0 PG GUID 0(default_pg) Rank {first}] Process group watchdog thread "
                "terminated with exception: NCCL error: remote process exited or there was a "
                "network error, NCCL version 2.27.5",
                f" TP{first}",
            )
            log("Received sigquit from a child process. It usually means the child failed.")
            self.kill_process_tree(include_parent=False)
            os._exit(1)
        return False

    def run_node(self) -> NoReturn:
        """A node > 0: join rank 0, bring up its ranks, then serve only a dummy /health."""
        # A node > 0 installs no SIGTERM handler: its main process blocks in
        # block_until_scheduler_exits, and SIGTERM ends it at once.
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        if self.knobs["ignore_sigterm"]:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.join_rank0()
        self.spawn_children(time.time())
        self.wait_for_ranks()
        self.peers[0].sendall(b"ready\n")
        error = self.bind()
        if error is not None:
            self.exit_bind_failed(error)
        self.ready = True
        serving = f"serving {time.time()!r}\n".encode()
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, serving)
        while True:
            self.pump(0.05)
            if self.check_peers():
                self.tell_ranks(b"shutdown\n")  # rank 0's ShutdownReq, broadcast to every rank
            if all(rank.poll() is not None for rank in self.ranks):
                # block_until_scheduler_exits() returned: this node's schedulers are gone.
                for rank in self.ranks:
                    log(scheduler_exit_line(rank.pid, rank.returncode))
                # launch_server's `finally: kill_process_tree(os.getpid(), include_parent=False)`
                self.kill_process_tree(include_parent=False)
                os._exit(0)

    def run(self) -> NoReturn:
        """Start up, report readiness, then serve until signalled."""
        if self.node_rank > 0:
            self.run_node()
        span = float(self.knobs["startup_s"])
        t0 = time.time()
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        rendezvous = self.open_rendezvous() if self.args.nnodes > 1 else None
        if isinstance(self.pd, PrefillPD):
            self.pd.start()
        if not self.knobs["late_bind"]:
            error = self.bind()
            if error is not None:
                self.uvicorn_startup_lines()
                self.exit_bind_failed(error)
        self.spawn_children(t0)
        if rendezvous is not None:
            self.gather_nodes(rendezvous)
        self.wait_for_ranks()
        if isinstance(self.pd, PrefillPD):
            self.pd.register_ranks()  # each KV manager, before its scheduler reports ready
        warm = time.time()
        self.uvicorn_startup_lines()
        if self.knobs["late_bind"]:
            error = self.bind()
            if error is not None:
                self.exit_bind_failed(error)
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        uvicorn_log(
            "INFO", f"Uvicorn running on http://{host}:{self.args.port} (Press CTRL+C to quit)"
        )
        # The warmup request: TP0 runs a prefill, then the server reports ready.
        self.idle_until(max(t0 + 0.9 * span, warm + 0.05 * span))
        client = f"127.0.0.1:{random.randint(40000, 60000)}"
        uvicorn_log("INFO", f'{client} - "GET /model_info HTTP/1.1" 200 OK', fd=1)
        first_prefix = self.rank_prefix(0 if self.args.dp_size > 1 else None, 0)
        log(
            "Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
            "input throughput (token/s): 0.00",
            first_prefix,
        )
        uvicorn_log("INFO", f'{client} - "POST /generate HTTP/1.1" 200 OK', fd=1)
        self.idle_until(max(t0 + span, warm + 0.1 * span))
        # From here on SGLang's tokenizer manager owns SIGTERM and SIGQUIT.
        ignore = self.knobs["ignore_sigterm"]
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else self.on_sigterm_running)
        self.ready = True
        if isinstance(self.pd, PrefillPD):
            self.pd.on_ready()
        log("The server is fired up and ready to roll!")
        serving = f"serving {time.time()!r}\n".encode()
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, serving)
        self.serve()

    def serve(self) -> NoReturn:
        """Watch the children like SubprocessWatchdog; drain after a SIGTERM."""
        drain = float(self.knobs["drain_s"])
        watched = [(f"scheduler_{i}", proc) for i, proc in enumerate(self.ranks)]
        if self.detokenizer is not None:
            watched.append(("detokenizer", self.detokenizer))
        next_check = time.time() + WATCHDOG_INTERVAL_S
        next_drain_check: float | None = None
        request_error_at = (
            time.time() + float(self.knobs["crash_after_s"])
            if self.knobs["request_error"]
            else None
        )
        while True:
            self.pump(0.05)
            if self.peers:
                self.check_peers()
            now = time.time()
            if request_error_at is not None and now >= request_error_at:
                request_error_at = None
                self.log_request_error()
            if self.sigterm_at is not None:
                # sigterm_watchdog: a look every drain_s (5 s in SGLang) until none is left.
                next_drain_check = next_drain_check or self.sigterm_at + drain
                if now >= next_drain_check:
                    if not self.log_remaining():
                        self.shutdown()
                    next_drain_check = now + drain
            if now < next_check:
                continue
            next_check = now + WATCHDOG_INTERVAL_S
            for name, proc in watched:
                code = proc.poll()
                if code is not None and code != 0:
                    log(child_crashed_line(name, proc.pid, code))
                    self.sigquit_pending = True  # SGLang SIGQUITs itself here
                    break

    def log_remaining(self) -> int:
        """Log the drain's look at the requests still answering; how many there are."""
        with self.requests_lock:
            rids = list(self.requests)
        log(drain_line(rids))
        return len(rids)

    def log_request_error(self) -> None:
        """One failed request, as uvicorn logs it; the server keeps serving."""
        site = "/usr/local/lib/python3.11/site-packages"
        lines = [
            "Traceback (most recent call last):",
            f'  File "{site}/uvicorn/protocols/http/httptools_impl.py", line 409, in run_asgi',
            "    result = await app(  # type: ignore[func-returns-value]",
            f'  File "{site}/sglang/srt/entrypoints/http_server.py", line 1089, in openai_v1_chat_completions',
            "    return await raw_request.app.state.openai_serving_chat.handle_request(request, raw_request)",
            f'  File "{site}/sglang/srt/managers/tokenizer_manager.py", line 612, in _tokenize_one_request',
            "    input_ids = self.tokenizer.encode(input_text)",
            "ValueError: The input (40961 tokens) is longer than the model's context length (40960 tokens).",
        ]
        uvicorn_log("ERROR", "Exception in ASGI application\n" + "\n".join(lines))

    def tell_ranks(self, line: bytes) -> None:
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, line)

    def shutdown(self) -> NoReturn:
        """The end of a drain, as sigterm_watchdog ends it: the watchdog stopped (children
        exiting now are no crash), a ShutdownReq to every scheduler (the other nodes' too),
        up to 15 s for them to exit, then kill_process_tree of everything, this process
        included (SIGKILL: no uvicorn shutdown lines)."""
        self.tell_ranks(b"shutdown\n")
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.sendall(SHUTDOWN_BYTE)
        deadline = time.time() + SCHEDULER_EXIT_S
        while time.time() < deadline and any(rank.poll() is None for rank in self.ranks):
            time.sleep(0.05)
        self.kill_process_tree(include_parent=True)
        os._exit(0)  # not reached: kill_process_tree SIGKILLs this process
