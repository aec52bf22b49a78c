"""From bench/probes/matvec_ab.py's timings, the matvec.cu build (or mm_tc) for each split and the norm
bound that a decode step of the 4B hybrid and the 8B dense shapes spends least time on, as a table
bench/hybrid_decode.py --matvec plans with (plan.MV_BUILDS, plan.MV_NORM_BYTES). Only builds whose
outputs were bit-equal to mm_tc's count.

    python3 bench/probes/matvec_pick.py AB.json TABLE.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.probes.matvec_ab import BUILDS  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402

# launches of each matrix a decode step (4B hybrid: 24 DeltaNet, 8 attention, 32 FFN layers; 8B: 32 layers)
COUNTS = {"dn_in": 24, "dn_out": 24, "attn_qkv": 8, "attn_o": 8, "gate_up": 32, "down": 32, "lm_head": 1,
          "8b_qo": 32, "8b_gate_up": 32, "8b_down": 32, "8b_lm_head": 1}
SM = 132


def pick(rows: list[dict]) -> dict:
    gated = [r for r in rows if r["name"] == "dn_out_gated" and r["us"] > 0 and r.get("equal") is not False]
    rows = [r for r in rows if r["name"] in COUNTS]
    bad = {(r["build"], r["name"]) for r in rows if r.get("equal") is False}
    timed = [r for r in rows if r["us"] > 0 and (r.get("build"), r["name"]) not in bad]
    old = {(r["name"], r["prologue"]): r["us"] for r in timed if r["kernel"].startswith("mm_")}
    sep = {r["name"]: r["us"] for r in timed if r["kernel"].startswith("rms_norm+")}
    new = {(r["name"], r["prologue"], r["build"], r["wps"]): r for r in timed if r["kernel"].startswith("mv_")}
    split = {r["name"]: r["split"] for r in timed}
    # cost of each candidate per split: the step's launches of that split, one-row and normed alike
    cost: dict = defaultdict(lambda: defaultdict(float))
    for (name, _), us in old.items():
        cost[split[name]]["mm_tc"] += COUNTS[name] * us
    for (name, _, build, wps), r in new.items():
        cost[split[name]][(build, wps)] += COUNTS[name] * r["us"]
    defines = {label: d for label, d, _ in BUILDS}
    builds, chosen = [], {}
    for s in sorted(cost):
        full = {c: v for c, v in cost[s].items()
                if c == "mm_tc" or all((n, p, *c) in new for (n, p) in old if split[n] == s)}
        best = min(full, key=full.get)
        chosen[s] = best
        builds.append([s, None, 0] if best == "mm_tc" else [s, [list(p) for p in defines[best[0]]], best[1]])
    # the norm: fused where the normalising build beats rms_norm (sep - old one-row) plus the one-row build
    norm_bytes = 0
    fused = []
    for name in sep:
        c = chosen[split[name]]
        if c == "mm_tc":
            continue
        rms = sep[name] - old[(name, None)]
        one, normed = new.get((name, None, *c)), new.get((name, "norm", *c))
        if one and normed:
            k = normed["k"]
            nbytes = normed["grid"] * plan.round_up(k, plan.K_CHUNK) * 4
            fused.append((nbytes, normed["us"] < one["us"] + rms, name))
    for nbytes, wins, _ in sorted(fused):
        if not wins:
            break
        norm_bytes = nbytes
    saved = sum(cost[s]["mm_tc"] - cost[s][chosen[s]] for s in chosen if chosen[s] != "mm_tc")
    sep_gated = [r["us"] for r in gated if not r["kernel"].startswith("mv_")]
    chosen_gated = [r["us"] for r in gated if r.get("build") == (chosen.get(16) or ("",))[0]]
    fuse_gated = bool(sep_gated and chosen_gated and chosen_gated[0] < sep_gated[0])
    return {"builds": builds, "norm_bytes": norm_bytes, "gated": fuse_gated, "fused": fused, "chosen": {str(s): str(c) for s, c in chosen.items()},
            "us_saved_per_4b_and_8b_step": round(saved, 1)}


def main() -> int:
    table = pick(json.loads(Path(sys.argv[1]).read_text()))
    Path(sys.argv[2]).write_text(json.dumps(table, indent=1))
    print(json.dumps(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
