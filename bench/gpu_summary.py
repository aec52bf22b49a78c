"""The few numbers of a gpu-ops.json that matter most, as a short table."""

from __future__ import annotations

import json
import sys


def junit_to_json(xml_path: str, json_path: str) -> None:
    """pytest's junit XML as JSON: counts and every test with its outcome and seconds."""
    import xml.etree.ElementTree as ET

    tests = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time", 0))})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    json.dump({**counts, "tests": tests}, open(json_path, "w"), indent=1)


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
        print(f"{'prefill ' + m['name'] + ' ' + m.get('kernel', 'exact' if m['exact'] else 'cuBLAS'):<34} {m['TFLOPs']:7.1f} TFLOP/s")
    for d in r["decode_step"]:
        label = (f"decode {d['shape']} b={d['batch']} exact={'on' if d['exact'] else 'off'}"
                 + ("" if d.get("pdl", True) else " no PDL"))
        print(f"{label:<34} {d['tok_s']:7.0f} tok/s  {d['step_ms']:.3f} ms/step  {d['bandwidth_TBps'] * 1e12 / bw:5.1%}")


if __name__ == "__main__":
    if sys.argv[1] == "--tests":
        junit_to_json(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
