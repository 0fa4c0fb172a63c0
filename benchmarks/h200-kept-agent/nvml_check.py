"""Device check of the kept agent's GPU query through NVML against nvidia-smi itself.

Run on a GPU host from the repository root: python benchmarks/h200-kept-agent/nvml_check.py
(needs torch for the busy case). Unpacks the agent bundle, starts a kept agent, and compares
the GPU probe's text through NVML with nvidia-smi's own, idle and with a process holding
20 GiB; then the agent's CPU per status call through NVML (200 calls) and through
nvidia-smi (50 calls), and NVML's raw bytes against nvidia-smi's MiB (rounding).
"""

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from deployctl import agent
from deployctl.facts import parse_gpus_command
from deployctl.remote import bootstrap, wire

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
folder = f"/tmp/kept/agent/{agent.agent_hash()}"
subprocess.run(
    [sys.executable, "-c", bootstrap.UNPACK, folder], input=agent.agent_bundle(), check=True
)
digest = agent.manifest_digest()
proc = subprocess.Popen(
    [sys.executable, "-c", bootstrap.BOOTSTRAP, folder, digest, wire.SESSION, "{}"],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
)


def read():
    line = proc.stdout.readline().decode()
    assert line.startswith(wire.REPLY_MARK), line
    return json.loads(line[len(wire.REPLY_MARK) :])


def ask(req):
    proc.stdin.write(json.dumps(req).encode() + b"\n")
    proc.stdin.flush()
    return read()


print("ready", read())
STATUS = {
    "state_dir": "/tmp/kept/state",
    "deployment": None,
    "run": None,
    "tail_bytes": 100,
    "metrics_bytes": 0,
}
report = {}


def compare(label):
    smi = subprocess.run(["sh", "-c", wire.GPUS_COMMAND], capture_output=True, text=True)
    kept = ask(
        {"call": "status", "args": STATUS, "probes": {"gpus": wire.GPUS_COMMAND}, "timeout": 30}
    )["probes"]["gpus"]
    a = parse_gpus_command(smi.returncode, smi.stdout, smi.stderr)
    b = parse_gpus_command(kept["exit_code"], kept["output"], kept["stderr"])

    def strip(s):
        return [(g.index, g.uuid, g.name, g.memory_total_mib, g.compute_cap) for g in s.gpus]

    report[label] = {
        "smi_text": smi.stdout,
        "kept_text": kept["output"],
        "same_static": strip(a) == strip(b),
        "used_mib": [
            (x.memory_used_mib, y.memory_used_mib) for x, y in zip(a.gpus, b.gpus, strict=False)
        ],
        "procs": [[(p.pid, p.name, p.used_memory_mib) for p in s.processes] for s in (a, b)],
    }
    print(label, json.dumps(report[label], indent=1))


def cost(label, command, rounds=50):
    before = ask({"call": "echo", "args": {}})["reply"]["cpu_s"]

    # children's CPU (nvidia-smi) shows in the session's children times: read via /proc
    def children():
        f = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")

    c0 = children()
    w = time.perf_counter()
    for _ in range(rounds):
        ask({"call": "status", "args": STATUS, "probes": {"gpus": command}, "timeout": 30})
    wall = (time.perf_counter() - w) / rounds
    after = ask({"call": "echo", "args": {}})["reply"]["cpu_s"]
    report["cost_" + label] = {
        "agent_cpu_ms": round(1000 * (after - before) / rounds, 2),
        "children_cpu_ms": round(1000 * (children() - c0) / rounds, 2),
        "wall_ms": round(1000 * wall, 2),
    }
    print(label, report["cost_" + label])


compare("idle")
cost("nvml", wire.GPUS_COMMAND, 200)
cost("nvidia-smi", wire.GPUS_COMMAND + " ")  # not the known command: run by sh
holder = subprocess.Popen(
    [
        sys.executable,
        "-c",
        "import torch,time; x=torch.empty(20*2**30, dtype=torch.uint8, device='cuda'); print('ok', flush=True); time.sleep(120)",
    ],
    stdout=subprocess.PIPE,
    text=True,
)
holder.stdout.readline()
time.sleep(1)
compare("busy")


# raw bytes for the MiB rounding
class MemV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


nvml = ctypes.CDLL("libnvidia-ml.so.1")
nvml.nvmlInit_v2()
h = ctypes.c_void_p()
nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
m = MemV2()
m.version = ctypes.sizeof(MemV2) | (2 << 24)
nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m))
smi = subprocess.run(
    [
        "nvidia-smi",
        "--query-gpu=memory.used,memory.total,memory.reserved,memory.free",
        "--format=csv,nounits",
    ],
    capture_output=True,
    text=True,
).stdout
report["raw"] = {
    "total": m.total,
    "reserved": m.reserved,
    "free": m.free,
    "used": m.used,
    "smi": smi,
}
print(report["raw"])
holder.kill()
proc.stdin.close()
proc.wait(10)
print("session exit", proc.returncode)
Path(OUT, "nvml_check.json").write_text(json.dumps(report, indent=1))
