"""The few numbers of a gpu-ops.json that matter most, as a short table."""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    r = json.load(open(path))
    for key in ("matmul", "prefill_matmul", "decode_step"):
        r[key] = [x for x in r[key] if "error" not in x]
    bw = r["copy_TBps"] * 1e12
    print(f"{'copy bandwidth':<34} {r['copy_TBps']:.2f} TB/s")
    for m in r["matmul"]:
        if m["m"] == 1 and m["dtype"] == "f16" and m["name"].endswith(("qo", "gate_up", "lm_head")):
            print(f"{'matmul ' + m['name'] + ' M=1':<34} {m['us']:7.1f} us  {m['weight_GBps'] * 1e9 / bw:5.1%} of copy bw")
    for m in r["prefill_matmul"]:
        print(f"{'prefill ' + m['name'] + (' exact' if m['exact'] else ' cuBLAS'):<34} {m['TFLOPs']:7.1f} TFLOP/s")
    for d in r["decode_step"]:
        label = f"decode {d['shape']} b={d['batch']} exact={'on' if d['exact'] else 'off'}"
        print(f"{label:<34} {d['tok_s']:7.0f} tok/s  {d['step_ms']:.3f} ms/step  {d['bandwidth_TBps'] * 1e12 / bw:5.1%}")


if __name__ == "__main__":
    main(sys.argv[1])
