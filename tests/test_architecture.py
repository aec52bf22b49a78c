"""The developer docs against the tree: every file docs/ARCHITECTURE.md and lockstep_kernels/cuda/DECISIONS.md
name exists (a rename or a removal leaves them stale otherwise), and the scheduler stays in parts."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/ARCHITECTURE.md", "lockstep_kernels/cuda/DECISIONS.md")
TREE = ("contract", "settings", "lockstep_kernels", "engine", "studio", "assets", "bench", "scripts", "tests", "docs")


def cited_paths(doc: str) -> list[str]:
    """Backquoted names of files or folders (a slash, or a source or doc suffix); globs left out."""
    names = re.findall(r"`([^`\s]+)`", (ROOT / doc).read_text())
    return sorted({n for n in names if ("/" in n or re.search(r"\w\.(py|cu|cuh|md|toml)$", n)) and "*" not in n})


def exists(name: str) -> bool:
    """A path from the root, or a bare file name that some product, bench or test folder holds."""
    if (ROOT / name.rstrip("/")).exists():
        return True
    return "/" not in name and any(next((ROOT / d).rglob(name), None) for d in TREE)


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_the_docs_name_exists(doc):
    cited = cited_paths(doc)
    assert len(cited) >= 5, cited
    assert [n for n in cited if not exists(n)] == []


def test_the_scheduler_is_in_parts_under_200_lines_each():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "engine" / "scheduler").glob("*.py")}
    assert len(sizes) >= 8 and {n: k for n, k in sizes.items() if k > 200} == {}


def test_no_installed_distribution_provides_a_package_named_like_ours():
    """Our top-level packages share no name with another installed distribution's modules: transformers
    5.25 brought the PyPI package `kernels`, which then shadowed ours or was shadowed by it."""
    from importlib.metadata import packages_distributions

    provided = packages_distributions()
    ours = ("contract", "settings", "lockstep_kernels", "engine", "studio")
    assert {p: provided[p] for p in ours if set(provided.get(p, [])) - {"lockstep"}} == {}
