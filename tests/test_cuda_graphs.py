"""Replayed decode graphs give the bits of an uncaptured step, for any bucket and any neighbours;
a tiny model's logits on the GPU follow the CPU reference."""

import os

import numpy as np
import pytest

from tests.cuda_fixtures import cp

pytestmark = pytest.mark.gpu

from engine.config import ModelConfig  # noqa: E402
from engine.kv_cache import PagePool  # noqa: E402
from engine.models.llama import LlamaModel, expected_shapes  # noqa: E402
from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.cpu.ops import CpuOps  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from lockstep_kernels.weights import Weight  # noqa: E402

RNG = np.random.default_rng()
PAGES_PER_SEQ = 3
PROMPTS = [5, 254, 17, 300, 1, 90]  # sequence 1 crosses a page boundary while decoding


def _model(ops, arch, dtype, seed, width=1):
    cfg = ModelConfig(arch=arch, vocab_size=320, hidden=128 * width, n_layers=2, n_heads=4 * width,
                      n_kv_heads=2 * width, head_dim=32, ffn=256 * width, qkv_bias=arch == "qwen2",
                      qk_norm=arch == "qwen3")
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if len(shape) == 1:
            x = 1.0 + 0.1 * rng.standard_normal(shape) if name.endswith("norm.weight") else rng.standard_normal(shape)
            weights[name] = Weight(np.asarray(x, np.float32), "f32")
        else:
            x = rng.standard_normal(shape) * shape[1] ** -0.5 * 2.0
            weights[name] = Weight.from_f32(x.astype(np.float32), dtype)
    return cfg, LlamaModel(cfg, weights, ops, PAGES_PER_SEQ * PAGE_SIZE)


class Session:
    """A model, a KV pool and sequences, driven like engine/runner.py drives them."""

    def __init__(self, ops, arch="llama", dtype="f32", kv_type="f16", seed=0, width=1):
        self.ops = ops
        self.cfg, self.model = _model(ops, arch, dtype, seed, width)
        self.pool = PagePool(ops, self.cfg.n_layers, PAGES_PER_SEQ * len(PROMPTS) + 2, self.cfg.n_kv_heads,
                             self.cfg.head_dim, kv_type)
        order = RNG.permutation(self.pool.n_pages)[: PAGES_PER_SEQ * len(PROMPTS)]
        self.pages = order.reshape(len(PROMPTS), PAGES_PER_SEQ).astype(np.int32)
        self.lengths = [0] * len(PROMPTS)

    def forward(self, ids, rows, logit_rows):
        return self.model.forward(ids, rows, self.pool.layers, logit_rows)

    def inputs(self, seqs, tokens_per_seq):
        tokens, positions, seq_idx, slots = [], [], [], []
        for i, (s, toks) in enumerate(zip(seqs, tokens_per_seq, strict=True)):
            pos = np.arange(self.lengths[s], self.lengths[s] + len(toks))
            tokens += list(toks)
            positions += list(pos)
            seq_idx += [i] * len(toks)
            slots += list(self.pages[s][pos // PAGE_SIZE].astype(np.int64) * PAGE_SIZE + pos % PAGE_SIZE)
        return (np.array(tokens, np.int32), np.array(positions, np.int32), np.array(seq_idx, np.int32),
                self.pages[list(seqs)], np.array(slots, np.int64))

    def step(self, seqs, tokens_per_seq, last_only=True):
        """An uncaptured step; logits of each sequence's last row (or of every row)."""
        tokens, positions, seq_idx, tables, slots = self.inputs(seqs, tokens_per_seq)
        ops = self.ops
        rows = PagedRows(ops.tensor(positions), ops.tensor(seq_idx), ops.tensor(tables), ops.tensor(slots))
        ends = np.cumsum([len(t) for t in tokens_per_seq]) - 1
        want = ends if last_only else np.arange(len(tokens))
        logits = ops.to_host(self.forward(ops.tensor(tokens), rows, ops.tensor(want.astype(np.int64))))
        for s, toks in zip(seqs, tokens_per_seq, strict=True):
            self.lengths[s] += len(toks)
        return logits

    def prefill(self):
        for s, n in enumerate(PROMPTS):
            self.step([s], [RNG.integers(0, 320, n)])


def _decode_inputs(sess, seqs, tokens):
    t, positions, _, tables, slots = sess.inputs(seqs, [[x] for x in tokens])
    return t, positions, tables, slots


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_graph_replay_equals_uncaptured_step(arch, dtype):
    ops = CudaOps(exact=True)
    sess = Session(ops, arch, dtype)
    sess.prefill()
    graphs = ops.decode_graphs(sess.forward, max_pages=PAGES_PER_SEQ, buckets=(1, 2, 4, 8))
    seqs = list(range(len(PROMPTS)))
    for _ in range(4):
        tokens = RNG.integers(0, 320, len(seqs))
        replay = ops.to_host(graphs(*_decode_inputs(sess, seqs, tokens)))
        assert ops.to_host(graphs.last_argmax).tolist() == np.argmax(replay, axis=1).tolist()
        alone = [ops.to_host(graphs(*_decode_inputs(sess, [s], [tok])))[0] for s, tok in zip(seqs, tokens, strict=True)]
        plain = sess.step(seqs, [[x] for x in tokens])  # writes the same K/V bits again, then advances
        assert replay.tobytes() == plain.tobytes()
        assert np.stack(alone).tobytes() == plain.tobytes()


def test_early_launched_kernels_change_no_bits(monkeypatch):
    """Graphs launch each kernel with programmatic dependent launch (it starts before the previous
    one ends, loading weights): replays must equal graphs captured with plain launches, every time."""
    from lockstep_kernels.cuda import launch

    hopper = int(cp.cuda.Device().compute_capability) >= 90
    assert launch.pdl_supported() == (hopper and os.environ.get("LOCKSTEP_PDL", "1") != "0")
    ops = CudaOps(exact=True)
    sess = Session(ops, "llama", "f16", seed=3, width=8)  # hidden 1024: matmuls of many blocks
    sess.prefill()
    seqs = list(range(len(PROMPTS)))
    inputs = [_decode_inputs(sess, seqs, RNG.integers(0, 320, len(seqs))) for _ in range(3)]
    early = ops.decode_graphs(sess.forward, max_pages=PAGES_PER_SEQ, buckets=(8,))
    early(*inputs[0])  # captured now, with PDL
    monkeypatch.setattr(launch, "pdl_supported", lambda: False)
    plain = ops.decode_graphs(sess.forward, max_pages=PAGES_PER_SEQ, buckets=(8,))
    for step in inputs:
        want = ops.to_host(plain(*step))
        for _ in range(5):
            assert ops.to_host(early(*step)).tobytes() == want.tobytes()


def test_tokens_fed_from_the_previous_replay_on_the_device():
    """A step launched ahead takes its token ids from the previous replay's argmax on the device,
    before the host has read them; it must equal the step given those ids from the host, and the
    previous step's tokens, copied to the host as it was launched, must not see the next replay."""
    ops = CudaOps(exact=True)
    sess = Session(ops, "llama", "f16", seed=4)
    sess.prefill()
    seqs = list(range(len(PROMPTS)))
    graphs = ops.decode_graphs(sess.forward, max_pages=PAGES_PER_SEQ, buckets=(8,))
    first = _decode_inputs(sess, seqs, RNG.integers(0, 320, len(seqs)))
    graphs(*first)
    fed_from = graphs.last_argmax
    tokens_first = ops.to_host_async(fed_from)  # copied now; the next replay overwrites the buffer
    _, positions, tables, slots = first
    nxt = (np.zeros(len(seqs), np.int32), positions + 1, tables,
           np.array([sess.pages[s][(p + 1) // PAGE_SIZE] * PAGE_SIZE + (p + 1) % PAGE_SIZE
                     for s, p in zip(seqs, positions, strict=True)], np.int64))
    ahead = ops.to_host(graphs(*nxt, ids_from=fed_from))
    host_tokens = tokens_first()
    assert host_tokens.tolist() == ops.to_host(graphs(*first)).argmax(axis=1).tolist()
    given = ops.to_host(graphs(host_tokens, *nxt[1:]))
    assert ahead.tobytes() == given.tobytes()


def test_prefill_chunking_and_batching_keep_bits():
    """A prompt prefilled whole, in chunks, or beside other prompts: the same last-row logits."""
    ops = CudaOps(exact=True)
    prompt = RNG.integers(0, 320, 300)
    results = []
    for plan in ("whole", "chunks", "beside"):
        sess = Session(ops, "llama", "f16", seed=1)
        if plan == "whole":
            results.append(sess.step([0], [prompt])[-1])
        elif plan == "chunks":
            sess.step([0], [prompt[:100]])
            sess.step([0], [prompt[100:257]])
            results.append(sess.step([0], [prompt[257:]])[-1])
        else:
            results.append(sess.step([2, 0, 3], [RNG.integers(0, 320, 40), prompt, RNG.integers(0, 320, 9)])[1])
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()


@pytest.mark.parametrize("dtype,tol", [("f32", 1e-4), ("f16", 1e-2)])
def test_tiny_model_logits_follow_cpu(dtype, tol):
    gpu_sess, cpu_sess = Session(CudaOps(exact=True), "qwen3", dtype, "f32", seed=2), None
    cpu_sess = Session(CpuOps(exact=True), "qwen3", dtype, "f32", seed=2)
    cpu_sess.pages = gpu_sess.pages
    prompt = RNG.integers(0, 320, 280)
    got = gpu_sess.step([1], [prompt], last_only=False)
    ref = cpu_sess.step([1], [prompt], last_only=False)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < tol, f"relative error {err:.2e}"
