"""Real OpenSSH test hosts on loopback addresses, one sshd and one login user per host."""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CAPTURES = TESTS / "data" / "nvidia-smi" / "h200-1gpu"
FAKE_NVIDIA_SMI = TESTS / "fakes" / "nvidia-smi"
STANDIN = TESTS / "standin" / "sglang_standin"  # a package: copy it with copy_standin
SSHD = "/usr/sbin/sshd"
# Debian's interpreter: readable by the test users (root's pyenv is not) and a cp311 like SGLang's wheel.
HOST_PYTHON = "/usr/bin/python3"
# libyaml's emitter for the inventories: PyYAML's own takes seconds on the hostile values.
INVENTORY_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# Where tests/slurm_cluster.py's cluster lives under the lab's base: every session gets its
# SLURM_CONF, so the hosts are the cluster's login nodes (nothing written to /etc/slurm).
SLURM_FOLDER = "slurm"


# Serialises useradd/usermod/userdel across test processes (xdist workers): they lock
# /etc/passwd and fail rather than wait when another holds it.
USERS_LOCK = Path("/tmp/deployctl-lab-users.lock")


def address_block() -> int:
    """The second byte of this test process's loopback addresses: 0 alone, 10 + N in xdist
    worker gwN, so two workers never share an address (nor a port on it); plus
    DEPLOYCTL_TEST_ADDRESS_OFFSET, so that two test runs on one machine never meet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    block = 10 + int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    return block + int(os.environ.get("DEPLOYCTL_TEST_ADDRESS_OFFSET", "0"))


def loopback_address(index: int) -> str:
    """The index-th lab host's address: 127.B.0.2 … 127.B.0.254, then 127.B.1.2 … (the
    fleet benchmark runs 256 hosts), B this process's `address_block()`."""
    high, low = divmod(index, 253)
    return f"127.{address_block()}.{high}.{low + 2}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) across test processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def worker_ports() -> range:
    """Ports handed to servers that bind later: below the ephemeral range (32768-60999), where
    an outbound connection's source port could take one between the choice and the bind, and
    each xdist worker its own share, so that a port bound or checked on every address (a
    rendezvous store) never meets another worker's server on its own address."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    share = (32768 - 20000) // max(workers, 1)
    return range(20000 + index * share, 20000 + (index + 1) * share)


TEST_PORTS = worker_ports()
_next_port = [random.randrange(len(TEST_PORTS))]


def free_port(address: str) -> int:
    """A port free on `address` now, never the same twice in a row in one process."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for _ in range(len(TEST_PORTS)):
        _next_port[0] = (_next_port[0] + 1) % len(TEST_PORTS)
        port = TEST_PORTS[_next_port[0]]
        with socket.socket(family) as sock:
            try:
                sock.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free test port on {address}")


def alive(pid: int) -> bool:
    """Say whether pid runs (a zombie awaiting its reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def copy_standin(into: Path, standin: Path = STANDIN) -> Path:
    """Copy the stand-in package into a folder (a home, a venv's site-packages), without
    its __pycache__; a copy already there is overwritten.  Return the copy.

    The copy is compiled here: its folders are root's, so a test user's server (and each of
    its ranks) would otherwise compile all of it again at every start."""
    target = into / standin.name
    shutil.copytree(
        standin, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
    )
    compileall.compile_dir(target, quiet=1)
    return target


def live_processes(uid: int) -> list[int]:
    """The processes of `uid` that are not zombies (dead, waiting for their parent's read)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # it ended meanwhile
        if state not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def sh(*argv: str | Path, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], check=check, text=True, capture_output=True, **kwargs
    )


@dataclass
class TestHost:
    """One sshd on its own loopback address, with its own host key, user, home and fake GPUs."""

    __test__ = False  # not a pytest test class

    name: str
    address: str
    root: Path
    user_prefix: str = "dct"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    host_key_line: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def user(self) -> str:
        return f"{self.user_prefix}-{self.name}"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def known_hosts_name(self) -> str:
        return f"[{self.address}]:{self.port}"

    def setup(self, authorized_key: str) -> None:
        for folder in (self.etc, self.bin, self.home, self.root / "run"):
            folder.mkdir(parents=True, exist_ok=True)
        key = self.etc / "ssh_host_ed25519_key"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
        key_type, key_body = key.with_suffix(".pub").read_text().split()[:2]
        (self.etc / "authorized_keys").write_text(authorized_key)
        (self.etc / "captures").write_text(str(CAPTURES))
        shutil.copy(FAKE_NVIDIA_SMI, self.bin / "nvidia-smi")
        self.set_gpus("clean", 1)
        self._ensure_user()
        self.port = free_port(self.address)
        self.host_key_line = f"{self.known_hosts_name} {key_type} {key_body}\n"
        path = ":".join([str(self.bin), "/usr/local/bin", "/usr/bin", "/bin"])
        slurm_conf = self.root.parent / SLURM_FOLDER / "slurm.conf"
        config = f"""
Port {self.port}
ListenAddress {self.address}
HostKey {key}
PidFile {self.root / "run" / "sshd.pid"}
AuthorizedKeysFile {self.etc / "authorized_keys"}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers {self.user}
MaxStartups 500:30:1000
MaxSessions 100
LogLevel ERROR
SetEnv PATH={path} SLURM_CONF={slurm_conf}
Subsystem sftp internal-sftp
"""
        (self.etc / "sshd_config").write_text(config)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        sh(SSHD, "-t", "-f", self.etc / "sshd_config")
        self.start()

    def _ensure_user(self) -> None:
        with locked(USERS_LOCK):
            exists = sh("id", "-u", self.user, check=False).returncode == 0
            if not exists:
                sh("useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", self.user)
            # '*' (not '!'): no password, yet not locked, so sshd without PAM lets keys in.
            sh("usermod", "--home", self.home, "--password", "*", self.user)
        sh("chown", "-R", f"{self.user}:{self.user}", self.home)

    def remove_user(self) -> None:
        with locked(USERS_LOCK):
            sh("userdel", self.user, check=False)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.etc / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sshd.log", "ab"),  # noqa: SIM115 - lives with the process
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sshd for {self.name} exited: {(self.root / 'sshd.log').read_text()}"
                )
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd for {self.name} did not listen on {self.address}:{self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        self.proc = None

    def sshd_pids(self) -> list[int]:
        """The listener and every sshd process serving this host's user."""
        pids = [self.proc.pid] if self.proc is not None else []
        out = sh("pgrep", "-u", self.user, "-x", "sshd", check=False).stdout
        out += sh("pgrep", "-f", f"sshd: {self.user}", check=False).stdout
        return pids + [int(p) for p in out.split()]

    def _signal_sshd(self, signum: int) -> None:
        for pid in self.sshd_pids():
            with contextlib.suppress(ProcessLookupError):  # a session may end meanwhile
                os.kill(pid, signum)

    def pause(self) -> None:
        """Make the host go silent: stop (SIGSTOP) every sshd process serving it."""
        self._signal_sshd(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_sshd(signal.SIGCONT)

    def go_away(self) -> None:
        """The host drops off: sshd and every session with it are killed (start() brings
        it back)."""
        self._signal_sshd(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(5)

    def ensure_running(self) -> None:
        """Start sshd again if a test took it away (and did not bring it back)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def set_gpus(self, mode: str = "clean", count: int = 1, warn: bool = False) -> None:
        """clean, busy, ghost (memory used, no process listed), failing, or live (the GPUs
        hold what the user's stand-in ranks hold, placed by CUDA_VISIBLE_DEVICES); `missing`
        removes nvidia-smi from the host's PATH.

        `warn`: nvidia-smi prints a warning on stderr before each answer.
        """
        (self.etc / "gpu-warn").unlink(missing_ok=True)
        if warn:
            (self.etc / "gpu-warn").write_text("1\n")
        smi = self.bin / "nvidia-smi"
        if mode == "missing":
            smi.unlink(missing_ok=True)
            return
        if not smi.exists():
            shutil.copy(FAKE_NVIDIA_SMI, smi)
        (self.etc / "gpu-mode").write_text(mode)
        (self.etc / "gpu-count").write_text(str(count))

    def set_node_gpus(self, node: str, mode: str = "clean", count: int = 2) -> None:
        """What nvidia-smi shows inside a job on Slurm node `node` (the host's setting
        elsewhere): a mode of `set_gpus` but `missing`, and the GPU count."""
        if mode == "missing":
            raise ValueError("every node runs the host's nvidia-smi: use set_gpus('missing')")
        folder = self.etc / "nodes" / node
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu-mode").write_text(mode)
        (folder / "gpu-count").write_text(str(count))

    def as_user(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell command locally as this host's user, in its home."""
        return sh("runuser", "-u", self.user, "--", "sh", "-c", f"cd ~ && {command}", check=check)

    def kill_processes(self) -> None:
        """End every process of the host's user (servers left by a test), and wait until
        none is left (zombies aside: this machine's init reaps late, a Slurm job's srun for
        one). Read from /proc here, not by pkill and pgrep: it is done for every host
        before every lab test, and two more processes scanning /proc each time cost more."""
        uid = pwd.getpwnam(self.user).pw_uid
        deadline = time.monotonic() + 5
        while (alive := live_processes(uid)) and time.monotonic() < deadline:
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def reset(self) -> None:
        """Put the host back to a clean, empty state between tests."""
        self.ensure_running()
        self.kill_processes()
        (self.bin / "nvidia-smi").unlink(missing_ok=True)  # a test may have replaced it
        self.set_gpus("clean", 1)
        shutil.rmtree(self.etc / "nodes", ignore_errors=True)
        # Renaming is instant; the old home (a venv copy, logs) is deleted in the background.
        trash = self.root.parent / "trash" / f"{self.name}-{time.monotonic_ns()}"
        trash.parent.mkdir(exist_ok=True)
        if self.home.exists():
            self.home.rename(trash)
            subprocess.Popen(["rm", "-rf", str(trash)])
        self.home.mkdir()
        sh("chown", f"{self.user}:{self.user}", self.home)

    def inventory_vars(self, client_key: Path) -> dict[str, Any]:
        return {
            "ansible_host": self.address,
            "ansible_port": self.port,
            "ansible_user": self.user,
            "ansible_ssh_private_key_file": str(client_key),
        }


@dataclass
class SSHLab:
    """The client side: a key, known_hosts listing every test host, and the hosts."""

    base: Path
    client_key: Path
    known_hosts: Path
    hosts: dict[str, TestHost]

    @property
    def slurm_base(self) -> Path:
        """The folder of the Slurm cluster whose conf the hosts' sessions name."""
        return self.base / SLURM_FOLDER

    def inventory(
        self,
        path: Path,
        names: list[str],
        host_vars: dict[str, dict[str, Any]] | None = None,
        **common: Any,
    ) -> Path:
        """Write an Ansible inventory for the named test hosts."""
        hosts = {}
        for name in names:
            entry = self.hosts[name].inventory_vars(self.client_key)
            entry.update((host_vars or {}).get(name, {}))
            hosts[name] = entry
        variables = {
            "known_hosts_file": str(self.known_hosts),
            "python": HOST_PYTHON,
            "connect_timeout": 5,
            "command_timeout": 30,
            **common,
        }
        inventory = {"all": {"hosts": hosts, "vars": variables}}
        path.write_text(yaml.dump(inventory, Dumper=INVENTORY_DUMPER, sort_keys=False))
        return path


def start_lab(base: Path, names: list[str]) -> SSHLab:
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    client = base / "client"
    client.mkdir()
    key = client / "id_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
    authorized = key.with_suffix(".pub").read_text()
    hosts: dict[str, TestHost] = {}
    # Login users of their own per lab, so two test sessions on one machine never collide.
    prefix = "d" + base.name.rsplit("-", 1)[-1].lower().replace("_", "")[:6]
    for index, name in enumerate(names):
        host = TestHost(name, loopback_address(index), base / name, prefix)
        host.setup(authorized)
        hosts[name] = host
    known_hosts = client / "known_hosts"
    known_hosts.write_text("".join(h.host_key_line for h in hosts.values()))
    return SSHLab(base, key, known_hosts, hosts)


def stop_lab(lab: SSHLab) -> None:
    """Stop every sshd, end the users' processes and remove the users."""
    for host in lab.hosts.values():
        host.stop()
        host.kill_processes()
        host.remove_user()
    # Deleted in the background, as reset() deletes old homes: the SGLang template venv and
    # its copies (6,000 files each) took 5-12 s of a worker's last test on this disk.
    trash = lab.base.with_name(f"{lab.base.name}-trash")
    lab.base.rename(trash)
    subprocess.Popen(["rm", "-rf", str(trash)])
