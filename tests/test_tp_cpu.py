"""Tensor parallelism on the CPU: TP=2 and TP=4 models built from the sharded weights of a tiny llama.

With exact mode a row's logits are the same bits alone, inside batches of 2..64 and inside a 512-row
prefill; TP=N logits equal TP=1's within a tolerance only (the o and down reductions are cut in N
pieces, which reorders their sums); parks and restores move every rank's pages together.
"""

import numpy as np
import pytest

from engine.kv_cache import PagePool
from engine.loader import load_model
from engine.parallel.model import ShardedPagePool
from engine.parallel.setup import build_ranks, tp_plan
from engine.runner import Runner, StepEntry
from lockstep_kernels.base import PAGE_SIZE
from lockstep_kernels.cpu.ops import CpuOps
from tests.tiny_models import make_hf_model

RNG = np.random.default_rng(20261201)
TP1_TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # measured max |diff| ~3e-7 at logits of magnitude ~1


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def loaded(request, tmp_path_factory):
    """8 query heads over 4 KV heads, so TP=4 gives each rank one KV head; qwen3 adds q/k norms."""
    return load_model(make_hf_model(tmp_path_factory.mktemp("tp"), request.param, heads=8, kv_ratio=2))


def runner(loaded, tp: int, n_pages: int, exact: bool = True, kv_type: str = "f32") -> Runner:
    if tp == 1:
        return Runner(loaded, CpuOps(exact=exact), n_pages, kv_type)
    ranks = build_ranks(tp_plan(loaded.config, loaded.weights, "cpu", tp), "cpu", exact)
    return Runner(loaded, ranks.ops[0], n_pages, kv_type, parallel=ranks)


def tokens(loaded, n: int) -> list[int]:
    return [int(t) for t in RNG.integers(4, loaded.config.vocab_size, n)]


@pytest.mark.parametrize("tp", [2, 4])
def test_decode_row_alone_and_inside_batches_of_2_to_64(loaded, tp):
    r = runner(loaded, tp, n_pages=66)
    prompt = tokens(loaded, 37)
    mine = r.pool.alloc(1)
    r.step([StepEntry(mine, prompt, 0, "none")])
    target = StepEntry(mine, [prompt[-1]], len(prompt))
    alone = r.step([target])[0].logits
    for batch in (2, 3, 8, 17, 33, 64):
        others = [StepEntry(r.pool.alloc(1), tokens(loaded, int(RNG.integers(1, 9))), 0) for _ in range(batch - 1)]
        at = int(RNG.integers(batch))
        entries = others[:at] + [target] + others[at:]
        inside = r.step(entries)[at].logits
        assert inside.tobytes() == alone.tobytes(), f"TP={tp}, batch {batch}"
        for e in others:
            r.pool.release(e.pages)


@pytest.mark.parametrize("tp", [2, 4])
def test_rows_of_a_512_row_prefill_equal_rows_computed_alone_and_in_chunks(loaded, tp):
    r = runner(loaded, tp, n_pages=8)
    prompt = tokens(loaded, 512)
    a, b, c = r.pool.alloc(2), r.pool.alloc(2), r.pool.alloc(2)
    whole = r.step([StepEntry(a, prompt, 0, "all")])[0].logits
    assert whole.shape[0] == 512
    chunks = np.concatenate([r.step([StepEntry(b, prompt[i : i + 40], i, "all")])[0].logits
                             for i in range(0, 512, 40)])
    assert chunks.tobytes() == whole.tobytes()
    r.step([StepEntry(c, prompt[:300], 0, "none")])
    alone = r.step([StepEntry(c, [prompt[300]], 300)])[0].logits
    assert alone.tobytes() == whole[300:301].tobytes()


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_logits_equal_tp1_within_tolerance_not_bits(loaded, tp):
    prompt = tokens(loaded, 300)
    out = {}
    for n in (1, tp):
        r = runner(loaded, n, n_pages=2)
        out[n] = r.step([StepEntry(r.pool.alloc(2), prompt, 0, "all")])[0].logits
    np.testing.assert_allclose(out[tp], out[1], **TP1_TOLERANCE)
    assert (np.argmax(out[tp], -1) == np.argmax(out[1], -1)).mean() > 0.99


def test_exact_off_tp_uses_all_reduce_and_stays_close(loaded):
    prompt = tokens(loaded, 64)
    out = {}
    for exact in (True, False):
        r = runner(loaded, 2, n_pages=1, exact=exact)
        out[exact] = r.step([StepEntry(r.pool.alloc(1), prompt, 0, "all")])[0].logits
    np.testing.assert_allclose(out[False], out[True], **TP1_TOLERANCE)


def greedy(r: Runner, pages: list[int], prompt: list[int], n: int, park_at: int | None = None):
    """Greedy decoding; at step `park_at` the sequence is parked, freed and restored elsewhere."""
    row = r.step([StepEntry(pages, prompt, 0)])[0]
    seq, rows = list(prompt), [row.logits]
    for i in range(n):
        seq.append(int(np.argmax(rows[-1][-1])))
        if i == park_at:
            parked = r.pool.park(pages)
            r.pool.release(pages)
            moved = r.pool.alloc(len(pages), from_top=True)
            assert moved != pages
            r.pool.restore(moved, parked)
            pages = moved
        rows.append(r.step([StepEntry(pages, [seq[-1]], len(seq) - 1)])[0].logits)
    return seq, np.concatenate(rows)


@pytest.mark.parametrize("tp", [2, 4])
def test_park_and_restore_move_every_ranks_pages_together(loaded, tp):
    c = loaded.config
    r = runner(loaded, tp, n_pages=6, kv_type="f16")
    assert isinstance(r.pool, ShardedPagePool)
    prompt = tokens(loaded, PAGE_SIZE + 20)  # two pages
    plain = greedy(r, r.pool.alloc(2), prompt, 6)
    parked_run = greedy(r, r.pool.alloc(2), prompt, 6, park_at=2)
    assert parked_run[0] == plain[0]
    assert parked_run[1].tobytes() == plain[1].tobytes()
    parked = r.pool.park([0, 1])
    assert len(parked.layers) == tp * c.n_layers  # every rank's layers
    assert {layer[0].shape[2] for layer in parked.layers} == {c.n_kv_heads // tp}  # each its own KV heads
    one = PagePool(CpuOps(), c.n_layers, 1, c.n_kv_heads, c.head_dim, "f16")
    assert parked.nbytes == 2 * one.page_bytes  # all ranks' pages together weigh one TP=1 page each
