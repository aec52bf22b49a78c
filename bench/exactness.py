"""Runs the exactness evidence matrix (studio/evidence.py) and writes a JSON report and a table.

    python bench/exactness.py                      # a tiny random model on the CPU
    python bench/exactness.py --tiny qwen3_moe     # a tiny random mixture-of-experts model
    python bench/exactness.py --tiny q4_k_m        # a tiny random llama as a Q4_K_M-like GGUF
    python bench/exactness.py --tiny qwen3_5 --prompt-len 100   # a tiny Gated DeltaNet hybrid
    python bench/exactness.py -m MODEL --device cuda --exact off
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from studio.evidence import ENGINE_CMD, EvidenceError, run_matrix  # noqa: E402


def _tiny_model(where: Path, arch: str, positions: int = 8192) -> tuple[str, int]:
    """A tiny random model of `arch`; the llama with room for `positions` positions (at least 8192)."""
    if arch == "qwen3_moe":
        from tests.tiny_moe import make_moe_hf_model

        path = make_moe_hf_model(where)
    elif arch == "q4_k_m":
        from tests.tiny_models import make_q4_k_m_gguf

        path, _ = make_q4_k_m_gguf(where)
    elif arch == "qwen3_5":
        from tests.tiny_hybrid import make_hybrid_model

        path = make_hybrid_model(where)
    else:
        from tests.tiny_models import make_hf_model

        path = make_hf_model(where, arch, max_pos=max(8192, positions))
    from engine.loader import load_model

    return str(path), load_model(path).config.vocab_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="model path (default: build a tiny random llama)")
    ap.add_argument("--tiny", default="llama", choices=["llama", "qwen3_moe", "q4_k_m", "qwen3_5"],
                    help="the tiny random model built when -m is not given")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--exact", default="on", choices=["on", "off"])
    ap.add_argument("--n-predict", type=int, default=24)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--parks-every", type=int, default=0, metavar="N",
                    help="add cells parked every N tokens beside 7 neighbours, at -ub 512, 16 and 24")
    ap.add_argument("--long-prompt", type=int, default=0, metavar="N",
                    help="add a cell: an N-token prompt (e.g. 20000) beside 7 others, parked every 7 tokens")
    ap.add_argument("--out", default=str(ROOT / "bench" / "evidence" / "exactness-cpu"),
                    help="report path without extension (.json and .md are written)")
    ap.add_argument("--engine-args", default="", help="more engine flags for every server, e.g. '--tp 2'")
    ap.add_argument("--log-dir", help="keep each engine's log here (engine-PORT.log)")
    ap.add_argument("--only", help="of the cells with a server of their own, just these (comma-separated names)")
    args = ap.parse_args(argv)
    extra = []
    if args.parks_every:
        parks = {"LOCKSTEP_PREEMPT_EVERY": str(args.parks_every)}
        extra = [(f"parks_{args.parks_every}_beside_7", f"parked every {args.parks_every} tokens, beside 7", (),
                  parks, 7),
                 (f"ubatch_16_parks_{args.parks_every}", f"-ub 16, parked every {args.parks_every} tokens, beside 7",
                  ("--ubatch-size", "16"), parks, 7),
                 (f"ubatch_24_parks_{args.parks_every}", f"-ub 24, parked every {args.parks_every} tokens, beside 7",
                  ("--ubatch-size", "24"), parks, 7)]
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            from engine.loader import load_model

            model, vocab = args.model, load_model(args.model).config.vocab_size
        else:
            model, vocab = _tiny_model(Path(tmp), args.tiny, args.long_prompt + 4096)
        try:
            report = asyncio.run(run_matrix(model, vocab=vocab, device=args.device, exact=args.exact == "on",
                                            n_predict=args.n_predict, prompt_len=args.prompt_len,
                                            progress=lambda m: print(m, flush=True), extra_variants=extra,
                                            long_prompt=args.long_prompt,
                                            engine_cmd=[*ENGINE_CMD, *shlex.split(args.engine_args)],
                                            log_dir=Path(args.log_dir) if args.log_dir else None,
                                            only=args.only.split(",") if args.only else None))
        except EvidenceError as e:
            print(f"exactness run failed: {e}", file=sys.stderr)
            return 1
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(report.to_json() + "\n")
    out.with_suffix(".md").write_text(f"# Exactness matrix ({args.device}, exact {args.exact})\n\n```\n"
                                      f"{report.table()}\n```\n")
    print(report.table())
    return 0 if report.all_identical or args.exact == "off" else 2


if __name__ == "__main__":
    sys.exit(main())
