"""The exactness evidence matrix against real engine servers on the CPU (issue 4's integration)."""

import asyncio

import psutil
import pytest

from engine.loader import load_model
from studio.evidence import CELLS, EvidenceError, Sample, complete, run_matrix


def _engine_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "engine" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
def vocab(tiny_llama):
    return load_model(tiny_llama).config.vocab_size


def test_every_cell_identical_with_exact_on(tiny_llama, vocab):
    # with the long-prompt cell (a 700-token prompt: three pages, beside 7, parked every 7 tokens)
    report = asyncio.run(run_matrix(str(tiny_llama), vocab=vocab, n_predict=24, long_prompt=700))
    assert tuple(c.name for c in report.cells) == (*CELLS, "long_700_beside_7_parks_7")
    assert report.all_identical, report.table()
    assert all(c.n_tokens == 24 for c in report.cells)
    parks = [s for s in report.servers if s["inherited_env"].get("LOCKSTEP_PREEMPT_EVERY") == "7"]
    assert len(parks) == 3, "the report records the environment the child really inherited"
    assert all("--exact-concurrency" in s["argv"] for s in report.servers)
    assert not _engine_children()


def test_the_control_sees_divergence_with_exact_off(tiny_llama, vocab):
    report = asyncio.run(run_matrix(str(tiny_llama), vocab=vocab, n_predict=24, exact=False))
    assert not report.all_identical
    assert any(c.first_diff is not None for c in report.cells)


def test_a_failing_worker_fails_the_run_and_stops_every_server(tiny_llama, vocab):
    calls = []

    async def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("worker exploded")
        return await complete(*args, **kwargs)

    with pytest.raises(EvidenceError, match="worker exploded"):
        asyncio.run(run_matrix(str(tiny_llama), vocab=vocab, n_predict=4, complete_fn=flaky))
    assert not _engine_children()


def test_a_server_that_cannot_start_fails_the_run(tiny_llama, vocab, tmp_path):
    with pytest.raises(EvidenceError, match="exited"):
        asyncio.run(run_matrix(str(tmp_path / "missing-model"), vocab=vocab, n_predict=4))
    assert not _engine_children()


def test_first_difference_compares_logprob_bits():
    a = Sample([1, 2, 3], [-0.5, -0.25, -1.0])
    assert a.first_difference(Sample([1, 2, 3], [-0.5, -0.25, -1.0])) is None
    assert a.first_difference(Sample([1, 2, 3], [-0.5, -0.25000000000000006, -1.0])) == 1
    assert a.first_token_difference(Sample([1, 2, 3], [-0.5, -0.2, -1.0])) is None
    assert a.first_difference(Sample([1, 2], [-0.5, -0.25])) == 2
    assert a.first_token_difference(Sample([1, 9, 3], [-0.5, -0.25, -1.0])) == 1
