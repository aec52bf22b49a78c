"""Speculative decoding speed: n-gram drafts on and off at one chat, exact mode on.

    python bench/speculation.py --device cuda            # the bundled code model
    python bench/speculation.py -m MODEL --device cpu

Workloads from Python source (the standard library's, tokenized with the model's tokenizer):
`copy` prompts end inside a second copy of a function, so the answer repeats a span of the prompt
(what prompt-lookup drafts predict); `plain` prompts are ordinary code, decoded greedily; `sampled`
are the plain prompts at temperature 0.9 with a seed, whose answers rarely repeat (the cost of drafts
that fail). Every request runs on a server without drafts and on one per draft length; each must
produce the same tokens (speculation must never change the output). Medians of --repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import sysconfig
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.loader import load_model  # noqa: E402
from studio.evidence import EngineServer  # noqa: E402

DEFAULT_MODEL = ROOT / "assets" / "models" / "lockstep-pycode-13m"


def workloads(tokenizer, n: int, prompt_tokens: int) -> dict[str, list[list[int]]]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    funcs = []
    for f in files:
        text = f.read_text(errors="replace")
        for block in text.split("\ndef ")[1:]:
            body = "def " + block.split("\n\n")[0]
            if 200 < len(body) < 1500:
                funcs.append(body)
    copy, plain = [], []
    for i in range(n):
        f = funcs[(i * 7) % len(funcs)]
        ids = tokenizer.encode(f + "\n\n\n" + f[: len(f) // 3], add_special=True)
        copy.append(ids[-prompt_tokens:])
        other = tokenizer.encode(files[(i * 13) % len(files)].read_text(errors="replace"), add_special=True)
        plain.append(other[:prompt_tokens])
    return {"copy": copy, "plain": plain}


async def generate(session, url: str, prompt: list[int], n_predict: int,
                   temperature: float = 0.0) -> tuple[list[int], float]:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature, "seed": 1234,
            "cache_prompt": False}
    async with session.post(url + "/completion", json=body) as r:
        data = await r.json()
    return data["tokens"], data["timings"]["predicted_per_second"]


async def run(args) -> dict:
    model = args.model or str(DEFAULT_MODEL)
    prompts = workloads(load_model(model).tokenizer, args.prompts, args.prompt)
    base = ["--parallel", "1", "--ctx-size", "2048", "--device", args.device, "--exact-concurrency", "on",
            "--metrics"]
    drafts = [int(d) for d in args.drafts.split(",")]
    servers = {"off": EngineServer(model, base)} | {
        f"n{d}": EngineServer(model, [*base, "--spec-type", "ngram", "--spec-draft-n-max", str(d)]) for d in drafts}
    workloads_ = {"copy": (prompts["copy"], 0.0), "plain": (prompts["plain"], 0.0), "sampled": (prompts["plain"], 0.9)}
    rates: dict = {w: {m: [] for m in servers} for w in workloads_}
    mismatches = 0
    counters: dict = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            for s in servers.values():
                await s.start(session)
            for s in servers.values():  # warm-up
                await generate(session, s.url, prompts["plain"][0], 16)
            for _ in range(args.repeats):
                for w, (ps, temp) in workloads_.items():
                    for p in ps:
                        got = {m: await generate(session, s.url, p, args.gen, temp) for m, s in servers.items()}
                        mismatches += sum(got[m][0] != got["off"][0] for m in got)
                        for m in got:
                            rates[w][m].append(got[m][1])
            for m, s in servers.items():
                async with session.get(s.url + "/metrics") as r:
                    counters[m] = _counters(await r.text())
    finally:
        await asyncio.gather(*(s.stop() for s in servers.values()), return_exceptions=True)
    out = {"model": model, "device": args.device, "prompt": args.prompt, "generated": args.gen,
           "prompts_per_workload": args.prompts, "repeats": args.repeats,
           "outputs_identical": mismatches == 0, "mismatches": mismatches, "draft_n_max": {}}
    for m in servers:
        if m == "off":
            continue
        row = {"drafted": counters[m].get("drafted_total"), "accepted": counters[m].get("draft_accepted_total")}
        for w in rates:
            off, on = statistics.median(rates[w]["off"]), statistics.median(rates[w][m])
            row[w] = {"off_tps": round(off, 1), "on_tps": round(on, 1), "speedup": round(on / off, 3)}
        out["draft_n_max"][m[1:]] = row
    return out


def _counters(text: str) -> dict:
    return {line.split(" ")[0].split(":")[-1]: float(line.split(" ")[-1])
            for line in text.splitlines() if line and not line.startswith("#")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--drafts", default="1,2,3,4", help="draft lengths (--spec-draft-n-max) to compare")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "evidence" / "speculation"))
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["outputs_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
