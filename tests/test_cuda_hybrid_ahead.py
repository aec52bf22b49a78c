"""A hybrid's decode steps launched ahead on CUDA (each replay taking its tokens from the previous
replay's argmax on the device, its recurrent states updated in stream order) give the tokens of
steps run one after another with the tokens read back: what lets Runner.can_launch_ahead take
recurrent models on an asynchronous backend (one row and several: 1 and 3 rows passed on the H200,
bench/evidence/gpu-tests-s18/)."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp  # noqa: F401 (skips without a GPU)

pytestmark = pytest.mark.gpu

from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402


@pytest.fixture(scope="module", params=[{}, {"moe": True}], ids=["dense", "moe"])
def hybrid(request, tmp_path_factory):
    from engine.loader import load_model
    from tests.tiny_hybrid import make_hybrid_model

    return load_model(make_hybrid_model(tmp_path_factory.mktemp("hybrid"), **request.param))


def _chats(runner, vocab, n):
    from engine.runner import StepEntry

    rng = np.random.default_rng(5)
    seqs = []
    for i in range(n):
        pages, state = runner.pool.alloc(2), runner.new_state()
        prompt = [int(t) for t in rng.integers(4, vocab, 20 + 7 * i)]
        out = runner.step([StepEntry(pages, prompt, 0, "last", full_rows=False, state=state, prompt=True)])
        seqs.append([pages, state, int(out[0].argmax[-1]), len(prompt)])
    return seqs


def _entries(seqs, ahead=False):
    from engine.runner import StepEntry

    return [StepEntry(p, [0 if ahead else tok], pos + ahead, "last", full_rows=False, state=st)
            for p, st, tok, pos in seqs]


@pytest.mark.parametrize("chats", [1, 3])
def test_hybrid_steps_launched_ahead_give_the_tokens_of_plain_steps(hybrid, chats):
    from engine.runner import Runner

    steps, vocab = 12, hybrid.config.vocab_size
    want = []
    plain = Runner(hybrid, CudaOps(exact=True), 8, "f32", max_pages_per_seq=2)
    seqs = _chats(plain, vocab, chats)
    for _ in range(steps):
        out = plain.step(_entries(seqs))
        for s, o in zip(seqs, out, strict=True):
            s[2], s[3] = int(o.argmax[-1]), s[3] + 1
        want.append([s[2] for s in seqs])

    runner = Runner(hybrid, CudaOps(exact=True), 8, "f32", max_pages_per_seq=2)
    seqs = _chats(runner, vocab, chats)
    assert runner.can_launch_ahead(_entries(seqs, ahead=True))
    got, pending = [], runner.launch(_entries(seqs))
    for i in range(steps):
        nxt = runner.launch_ahead(pending, _entries(seqs, ahead=True)) if i + 1 < steps else None
        for s, o in zip(seqs, pending.collect(), strict=True):
            s[2], s[3] = int(o.argmax[-1]), s[3] + 1
        got.append([s[2] for s in seqs])
        pending = nxt
    assert len(runner.graphs._graphs) == 1  # the ahead steps replayed the bucket's graph
    assert got == want
