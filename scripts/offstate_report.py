"""The off-state check of scripts/gpu-threshold-check: its server set and its table.

inventory FILE PORT T   turn the one-deployment inventory FILE into four on GPU 0: base
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

SKIP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"


def names(t: str) -> list[str]:
    return ["base", f"t{t}", f"t{t}skip", "adaptive"]


def inventory(path: str, port: int, t: str) -> None:
    lines = [ln for ln in Path(path).read_text().splitlines() if ln != f"    port: {port}"]
    at = lines.index("      ansible_connection: local") + 1
    extra = next(ln for ln in lines if ln.startswith("    extra_args: ["))
    adaptive_args = extra.split(": ", 1)[1][:-1] + ", --speculative-adaptive]"
    deployments = [
        "      deployments:",
        f"        base: {{gpus: [0], port: {port + 1}, template: baseline}}",
        f"        t{t}: {{gpus: [0], port: {port + 3}, threshold: {t}}}",
        f"        t{t}skip: {{gpus: [0], port: {port + 4}, threshold: {t}, "
        f"env: {{{SKIP_ENV}: '1'}}}}",
        f"        adaptive: {{gpus: [0], port: {port + 5}, extra_args: {adaptive_args}}}",
    ]
    Path(path).write_text("\n".join(lines[:at] + deployments + lines[at:]) + "\n")


def table(out: str, t: str) -> None:
    curves = {}
    for name in names(t):
        doc = json.loads(Path(f"{out}/offstate-{name}.json").read_text())
        host = next(iter(doc["hosts"].values()), {})
        entry = host.get("deployments", {}).get(name, host)  # a deployment's bench, or a host's
        curves[name] = {lv["concurrency"]: lv for lv in entry.get("levels", [])}
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
