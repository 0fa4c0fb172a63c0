"""The off-state check of scripts/gpu-threshold-check: its server set and its table.

inventory FILE PORT T   turn the one-server inventory FILE (at PORT) into four on GPU 0: base
                        (no speculation), tT (EAGLE3 at T), tTskip (the same with SGLang
                        0.5.17's SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND) and adaptive
                        (EAGLE3 with SGLang's own --speculative-adaptive, its defaults)
table OUT T             per level, each one's output tok/s and the tuned runs' ratio to the
                        baseline (OUT/offstate.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

SKIP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"


def names(t: str) -> list[str]:
    return ["base", f"t{t}", f"t{t}skip", "adaptive"]


def inventory(path: str, port: int, t: str) -> None:
    doc = yaml.safe_load(Path(path).read_text())
    shared = doc["all"]["vars"]
    base_port = shared.pop("port")
    adaptive_args = [*shared["extra_args"], "--speculative-adaptive"]
    doc["all"]["hosts"]["localhost"]["deployments"] = {
        "base": {"gpus": [0], "port": base_port + 1, "template": "baseline"},
        f"t{t}": {"gpus": [0], "port": base_port + 3, "threshold": int(t)},
        f"t{t}skip": {
            "gpus": [0], "port": base_port + 4, "threshold": int(t), "env": {SKIP_ENV: "1"},
        },
        "adaptive": {"gpus": [0], "port": base_port + 5, "extra_args": adaptive_args},
    }  # fmt: skip
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False))


def table(out: str, t: str) -> None:
    curves = {}
    for name in names(t):
        doc = json.loads(Path(f"{out}/offstate-{name}.json").read_text())
        entry = doc["hosts"]["localhost"]["deployments"][name]
        curves[name] = {lv["concurrency"]: lv for lv in entry.get("levels") or []}
    tuned, skip = f"t{t}", f"t{t}skip"
    print(
        f"{'conc':>5} "
        + " ".join(f"{n:>10}" for n in curves)
        + "  tuned/base  skip/base  adaptive/base"
    )
    rows = []
    for c in sorted(curves["base"]):
        tok = {n: curves[n].get(c, {}).get("output_tokens_per_s", 0.0) for n in curves}
        base = tok["base"] or 1.0
        row = {
            "concurrency": c,
            **{n: round(v, 1) for n, v in tok.items()},
            "tuned_ratio": round(tok[tuned] / base, 3),
            "skip_ratio": round(tok[skip] / base, 3),
            "adaptive_ratio": round(tok["adaptive"] / base, 3),
        }
        rows.append(row)
        print(
            f"{c:>5} "
            + " ".join(f"{tok[n]:>10.1f}" for n in curves)
            + f"  {row['tuned_ratio']:>10.3f}  {row['skip_ratio']:>9.3f}"
            + f"  {row['adaptive_ratio']:>13.3f}"
        )
    Path(f"{out}/offstate.json").write_text(
        json.dumps({"threshold": int(t), "levels": rows}, indent=1)
    )


if __name__ == "__main__":
    verb, *args = sys.argv[1:]
    if verb == "inventory":
        inventory(args[0], int(args[1]), args[2])
    else:
        table(args[0], args[1])
