"""Tensor parallelism over NCCL on two GPUs (skipped without them): the transport, exact mode's row
invariance bit for bit at TP=2, and closeness to the CPU. Written without a multi-GPU machine;
bench/gpu_tp.sh runs it on nvidia-h200-x2."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from lockstep_kernels.cuda import available  # noqa: E402

_OK, _WHY = available()
if not _OK:
    pytest.skip(_WHY, allow_module_level=True)
if cp.cuda.runtime.getDeviceCount() < 2:
    pytest.skip("needs 2 GPUs", allow_module_level=True)

from engine.parallel.collective import reduce_partials  # noqa: E402
from engine.parallel.nccl import NcclCollective, nccl_available  # noqa: E402

if nccl_available():
    pytest.skip(nccl_available(), allow_module_level=True)

from engine.loader import load_model  # noqa: E402
from engine.parallel.setup import build_ranks, tp_plan  # noqa: E402
from engine.runner import Runner, StepEntry, prompt_logits  # noqa: E402
from tests.tiny_models import make_hf_model  # noqa: E402

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(20261202)
CPU_TOLERANCE = 1e-3  # relative L2 of the logits against the CPU with the same f16 KV (f32 weights)


def _on(device: int, host: np.ndarray):
    with cp.cuda.Device(device):
        return cp.asarray(host)


@pytest.fixture(scope="module")
def coll():
    return NcclCollective((0, 1))


def test_all_gather_hands_every_rank_both_parts_and_all_reduce_sums(coll):
    a, b = RNG.standard_normal((7, 33)).astype(np.float32), RNG.standard_normal((7, 33)).astype(np.float32)
    gathered = coll.all_gather([_on(0, a), _on(1, b)])
    for parts in gathered:
        assert cp.asnumpy(parts[0]).tobytes() == a.tobytes() and cp.asnumpy(parts[1]).tobytes() == b.tobytes()
    for total in coll.all_reduce([_on(0, a), _on(1, b)]):
        np.testing.assert_allclose(cp.asnumpy(total), a + b, rtol=1e-6, atol=1e-6)


def _add_on(device: int):
    def add(a, b):
        with cp.cuda.Device(device):
            return a + b

    return add


def test_exact_reduction_of_a_row_is_the_same_alone_and_in_512(coll):
    rows = [RNG.standard_normal((512, 4096)).astype(np.float32) for _ in range(2)]
    adds = [_add_on(0), _add_on(1)]
    big = reduce_partials(coll, [_on(r, rows[r]) for r in range(2)], exact=True, adds=adds)
    one = reduce_partials(coll, [_on(r, rows[r][300:301]) for r in range(2)], exact=True, adds=adds)
    for r in range(2):
        assert cp.asnumpy(one[r]).tobytes() == cp.asnumpy(big[r][300:301]).tobytes()
    assert cp.asnumpy(big[0]).tobytes() == cp.asnumpy(big[1]).tobytes()  # every rank the same bits


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(make_hf_model(tmp_path_factory.mktemp("tpgpu"), "llama", heads=8, kv_ratio=2, hidden=128,
                                    head_dim=64))


def _runner(loaded, n_pages: int) -> Runner:
    ranks = build_ranks(tp_plan(loaded.config, loaded.weights, "cuda", 2), "cuda", True)
    return Runner(loaded, ranks.ops[0], n_pages, "f16", parallel=ranks)


def _tokens(loaded, n):
    return [int(t) for t in RNG.integers(4, loaded.config.vocab_size, n)]


def test_tp2_decode_row_alone_inside_batches_and_a_512_row_prefill(loaded):
    r = _runner(loaded, 70)
    prompt = _tokens(loaded, 512)
    mine = r.pool.alloc(3)
    whole = r.step([StepEntry(mine, prompt, 0, "all")])[0].logits
    again = r.pool.alloc(3)
    r.step([StepEntry(again, prompt[:300], 0, "none")])
    target = StepEntry(again, [prompt[300]], 300)
    alone = r.step([target])[0].logits
    assert alone.tobytes() == whole[300:301].tobytes()
    for batch in (2, 3, 8, 16, 33, 64):
        others = [StepEntry(r.pool.alloc(1), _tokens(loaded, int(RNG.integers(1, 9))), 0) for _ in range(batch - 1)]
        at = int(RNG.integers(batch))
        inside = r.step(others[:at] + [target] + others[at:])[at].logits
        assert inside.tobytes() == alone.tobytes(), f"batch {batch}"
        for e in others:
            r.pool.release(e.pages)


def test_tp2_is_close_to_the_cpu_and_the_same_across_builds(loaded):
    prompt = _tokens(loaded, 200)
    runs = []
    for _ in range(2):
        r = _runner(loaded, 1)
        runs.append(r.step([StepEntry(r.pool.alloc(1), prompt, 0, "all")])[0].logits)
    assert runs[0].tobytes() == runs[1].tobytes()
    ref = prompt_logits(loaded, prompt, exact=True, kv_type="f16")
    assert np.linalg.norm(runs[0] - ref) / np.linalg.norm(ref) < CPU_TOLERANCE
