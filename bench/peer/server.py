"""llama-server's command line -> `lockstep-engine --device cpu` on the bundled model.

llama.cpp's server tests start `$LLAMA_SERVER_BIN_PATH` with llama-server flags. This wrapper passes
every flag through to the engine except those that have no meaning for Lockstep (they choose or fetch
llama.cpp's test models, or select features the suite's out-of-scope tests use); each dropped flag is
logged on stderr, so a test's log says what the engine never saw.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "assets" / "models" / "lockstep-pycode-13m"

# flag -> (takes a value, why it means nothing here)
DROP = {
    "--hf-repo": (True, "the wrapper serves the bundled model"),
    "--hf-file": (True, "the wrapper serves the bundled model"),
    "--model-url": (True, "the wrapper serves the bundled model"),
    "--model": (True, "the wrapper serves the bundled model"),
    "--offline": (False, "nothing is downloaded"),
    "--models-dir": (True, "router mode (out of scope)"),
    "--models-max": (True, "router mode (out of scope)"),
    "--models-preset": (True, "router mode (out of scope)"),
    "--no-models-autoload": (False, "router mode (out of scope)"),
    "--embedding": (False, "embeddings (out of scope)"),
    "--reranking": (False, "reranking (out of scope)"),
    "--pooling": (True, "embeddings (out of scope)"),
    "--mmproj-url": (True, "multimodal (out of scope)"),
    "--no-mmproj": (False, "multimodal (out of scope)"),
    "--media-path": (True, "multimodal (out of scope)"),
    "--tools": (True, "built-in tools (out of scope)"),
    "--tools-runtime": (True, "built-in tools (out of scope)"),
    "--mcp-servers-config": (True, "MCP (out of scope)"),
    "--mcp-servers-json": (True, "MCP (out of scope)"),
    "--ui-mcp-proxy": (False, "MCP (out of scope)"),
}


def _engine_flags() -> dict[str, bool]:
    """The engine's own flags and whether each takes a value (for PEER_DROP_UNKNOWN)."""
    sys.path.insert(0, str(ROOT))
    from engine.cli import build_parser

    out = {}
    for action in build_parser()._actions:
        for s in action.option_strings:
            out[s] = action.nargs != 0
    return out


def translate(argv: list[str], drop_unknown: bool = False) -> tuple[list[str], list[str]]:
    known = _engine_flags() if drop_unknown else {}
    out, dropped = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag = arg.split("=", 1)[0]
        if flag in DROP:
            takes, why = DROP[flag]
            n = 2 if takes and "=" not in arg else 1
            dropped.append(f"{' '.join(argv[i:i + n])} ({why})")
            i += n
            continue
        if drop_unknown and flag.startswith("-") and flag not in known:
            n = 2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in arg else 1
            dropped.append(f"{' '.join(argv[i:i + n])} (PEER_DROP_UNKNOWN: the engine lacks it)")
            i += n
            continue
        out.append(arg)
        i += 1
    return out, dropped


def main() -> int:
    args, dropped = translate(sys.argv[1:], os.environ.get("PEER_DROP_UNKNOWN") == "1")
    for d in dropped:
        print(f"peer wrapper: dropped {d}", file=sys.stderr, flush=True)
    argv = [sys.executable, "-m", "engine", "-m", str(MODEL), "--device", "cpu", *args]
    print(f"peer wrapper: exec {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    os.execve(sys.executable, argv, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
