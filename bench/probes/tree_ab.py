"""Probe: A/B of two source trees on the bundled model, one engine child from each side by side, cells
(1 and 4 chats) alternating between them in both orders, so drift on a shared machine hits both alike
(bench/throughput.py's cell(): 128-token prompts, 128 generated, uncached then cached).

    python bench/probes/tree_ab.py TREE_A TREE_B THREADS on|off REPEATS OUT.json
    (a tree of another commit: git archive COMMIT | tar -x -C DIR)
"""
import asyncio
import json
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import aiohttp  # noqa: E402
from throughput import cell, prompts_for  # noqa: E402

from studio.evidence import EngineServer  # noqa: E402

MODEL = str(ROOT / "assets" / "models" / "lockstep-pycode-13m")
ARGS = ["--parallel", "4", "--ctx-size", "2048", "--kv-unified", "--device", "cpu", "--metrics"]
CELLS = (1, 4)


async def main(a: str, b: str, threads: str, mode: str, reps: int, out: str) -> None:
    flags = [*ARGS, "--threads", threads, "--exact-concurrency", mode]
    eng = {n: EngineServer(MODEL, flags, env={"PYTHONPATH": t}, engine_cmd=[sys.executable, "-m", "engine"])
           for n, t in (("A", a), ("B", b))}
    rng = random.Random(1)
    raw = {n: {c: {"uncached": [], "cached": [], "step_ms": [], "prefill": []} for c in CELLS} for n in eng}
    loads = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as s:
        try:
            for e in eng.values():
                await e.start(s, timeout=900)
            for e in eng.values():  # warm-up
                for c in CELLS:
                    await cell(s, e.url, prompts_for(c, 128, 8192, rng), 8)
            for rep in range(reps):
                loads.append(os.getloadavg()[0])
                for c in CELLS:
                    for n in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                        p = prompts_for(c, 128, 8192, rng)
                        got = await cell(s, eng[n].url, p, 128)
                        warm = await cell(s, eng[n].url, p, 128, cached=True)
                        for key, v in (("uncached", got["decode_tps"]), ("cached", warm["decode_tps"]),
                                       ("step_ms", warm["decode_step_ms"]), ("prefill", got["prefill_tps"])):
                            raw[n][c][key].append(v)
        finally:
            await asyncio.gather(*(e.stop() for e in eng.values()), return_exceptions=True)
    med = {n: {c: {k: round(statistics.median(v), 2) for k, v in raw[n][c].items()} for c in CELLS} for n in raw}
    res = {"A": a, "B": b, "threads": threads, "mode": mode, "repeats": reps, "loads": loads, "median": med,
           "raw": raw}
    Path(out).write_text(json.dumps(res, indent=1) + "\n")
    for c in CELLS:
        x, y = med["A"][c], med["B"][c]
        print(f"t{threads} {mode} chats {c}: A uncached {x['uncached']} cached {x['cached']} step {x['step_ms']} "
              f"prefill {x['prefill']} | B uncached {y['uncached']} cached {y['cached']} step {y['step_ms']} "
              f"prefill {y['prefill']} | B/A uncached {y['uncached'] / x['uncached']:.3f} "
              f"cached {y['cached'] / x['cached']:.3f}")
    print("load", [round(v, 2) for v in loads])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]))
