"""Reading a 5,000-host inventory: deployctl against `ansible-inventory --list` on the same file.

Writes one fleet of --hosts hosts (default 5000) as INI and as YAML: racks of 8 hosts given as
ranges (`gpu-r0001-[01:08]`), each rack a group under one of 8 pods under `gpu`, group vars at
every level, one templated variable (`model_path: "{{ models_root }}/{{ model }}"`) and
group_vars/ files. Then, side by side in one run, medians of --rounds:

  load      deployctl.inventory.load_inventory in this process (parse, merge, templates)
  hosts     `python -m deployctl hosts --json -i FILE` as a new process (start-up included)
  ansible   `ansible-inventory --list -i FILE` as a new process (needs ansible-core in the venv)

JSON goes to benchmarks/results/inventory_load.json (git-ignored).
Run: python benchmarks/inventory_load.py [--hosts 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RESULTS = Path(__file__).resolve().parent / "results"
RACK = 8
PODS = 8


def write_fleet(root: Path, hosts: int) -> dict[str, Path]:
    racks = hosts // RACK
    ini = ["[all:vars]", "models_root=/models", 'model_path="{{ models_root }}/{{ model }}"', ""]
    ini += ["[gpu:children]", *(f"pod{p}" for p in range(PODS)), "", "[gpu:vars]", "model=kimi"]
    yaml_pods: dict[int, list[str]] = {p: [] for p in range(PODS)}
    for rack in range(racks):
        pod = rack % PODS
        name = f"rack{rack:04d}"
        ini += ["", f"[{name}]", f"gpu-r{rack:04d}-[01:{RACK:02d}] rack={rack}"]
        ini += [f"[{name}:vars]", f"row={rack // 16}"]
        yaml_pods[pod].append(name)
    for pod in range(PODS):
        ini += ["", f"[pod{pod}:children]", *yaml_pods[pod], f"[pod{pod}:vars]", f"pod={pod}"]
    yaml = [
        "all:",
        "  vars:",
        "    models_root: /models",
        '    model_path: "{{ models_root }}/{{ model }}"',
        "  children:",
        "    gpu:",
        "      vars: {model: kimi}",
        "      children:",
    ]
    for pod in range(PODS):
        yaml += [f"        pod{pod}:", f"          vars: {{pod: {pod}}}", "          children:"]
        for name in yaml_pods[pod]:
            rack = int(name[4:])
            yaml += [
                f"            {name}:",
                f"              vars: {{row: {rack // 16}}}",
                "              hosts:",
                f"                gpu-r{rack:04d}-[01:{RACK:02d}]: {{rack: {rack}}}",
            ]
    (root / "group_vars").mkdir()
    (root / "group_vars" / "gpu.yml").write_text("tp: 8\nregion: eu\n", encoding="utf-8")
    (root / "group_vars" / "pod3.yml").write_text("region: us\n", encoding="utf-8")
    paths = {"ini": root / "fleet.ini", "yaml": root / "fleet.yml"}
    paths["ini"].write_text("\n".join(ini) + "\n", encoding="utf-8")
    paths["yaml"].write_text("\n".join(yaml) + "\n", encoding="utf-8")
    return paths


def median_of(rounds: int, action: Callable[[], object]) -> float:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        action()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from deployctl.inventory import load_inventory

    ansible_inventory = Path(sys.executable).parent / "ansible-inventory"
    rows = []
    with tempfile.TemporaryDirectory(prefix="deployctl-inv-bench-") as scratch:
        files = write_fleet(Path(scratch), args.hosts)
        for kind, path in files.items():
            inventory = load_inventory(path)  # warm-up, and a check of what was read
            assert len(inventory.hosts) == args.hosts // RACK * RACK, len(inventory.hosts)
            sample = inventory.hosts["gpu-r0003-02"].vars
            assert sample["model_path"] == "/models/kimi" and sample["region"] == "us", sample

            def run(argv: list[str]) -> None:
                subprocess.run(argv, check=True, capture_output=True)

            row = {
                "format": kind,
                "hosts": len(inventory.hosts),
                "load_s": median_of(args.rounds, lambda p=path: load_inventory(p)),
                "hosts_cli_s": median_of(
                    args.rounds,
                    lambda p=path: run(
                        [sys.executable, "-m", "deployctl", "hosts", "--json", "-i", str(p)]
                    ),
                ),
                "ansible_inventory_s": median_of(
                    args.rounds,
                    lambda p=path: run([str(ansible_inventory), "--list", "-i", str(p)]),
                ),
            }
            rows.append(row)
    print(f"{'format':<6} {'hosts':>6} {'load':>8} {'hosts --json':>13} {'ansible-inventory':>18}")
    for row in rows:
        print(
            f"{row['format']:<6} {row['hosts']:>6} {row['load_s']:>7.3f}s "
            f"{row['hosts_cli_s']:>12.3f}s {row['ansible_inventory_s']:>17.3f}s"
        )
    RESULTS.mkdir(exist_ok=True)
    out = {"rounds": args.rounds, "rows": rows}
    (RESULTS / "inventory_load.json").write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
