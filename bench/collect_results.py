"""Files a device call brought back (bench/gpu_all.sh), tables regenerated: the product's evidence
(exactness, throughput, soak, speculation reports) into bench/evidence/, the rest into docs/lab/results/.

    python bench/collect_results.py /work/.device/N
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import markdown  # noqa: E402

from studio.evidence import Cell, Report  # noqa: E402

EVIDENCE = ROOT / "bench" / "evidence"
LAB = ROOT / "docs" / "lab" / "results"
EVIDENCE_KINDS = ("exactness-", "throughput-", "soak-", "speculation-")
RENAME = {"throughput-1b.json": "throughput-1b-h200.json", "throughput-8b.json": "throughput-8b-h200.json"}


def exactness_table(path: Path) -> str:
    d = json.loads(path.read_text())
    d.pop("all_identical", None)
    report = Report(**{**d, "cells": [Cell(**c) for c in d["cells"]]})
    device = "cuda" if "cuda" in path.name else "cpu"
    return f"# Exactness matrix ({device}, exact {report.exact})\n\n```\n{report.table()}\n```\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for src in sorted(Path(argv[0]).glob("*.json")):
        name = RENAME.get(src.name, src.name)
        dst = (EVIDENCE if name.startswith(EVIDENCE_KINDS) else LAB) / name
        shutil.copyfile(src, dst)
        dst.chmod(0o644)
        if dst.name.startswith("throughput-"):
            dst.with_suffix(".md").write_text(markdown(json.loads(dst.read_text())))
        elif dst.name.startswith("exactness-"):
            dst.with_suffix(".md").write_text(exactness_table(dst))
        print(f"{src.name} -> {dst.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
