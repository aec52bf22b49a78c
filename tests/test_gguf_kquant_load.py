"""Quantized GGUFs as people download them: every loadable block type (mixed per tensor, embedding and
output included) loads as raw blocks; the CPU engine's logits equal those of the F32 GGUF of the
dequantised weights; other types fail the load naming tensor and type."""

import json
import urllib.request

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from engine.errors import UnsupportedError
from engine.loader import load_model
from engine.loader.gguf import GGUFFile
from engine.runner import prompt_logits
from lockstep_kernels.quants import BLOCK_TYPES
from lockstep_kernels.quants.writer import QUANTIZERS, quantize
from lockstep_kernels.weights import RAW_BLOCK_TYPES, Weight
from tests.engine_helpers import Engine
from tests.test_quants_dequant import F16_FIELDS
from tests.tiny_models import (
    make_hf_model,
    make_q4_k_m_gguf,
    write_dequantized_gguf,
    write_gguf,
    write_gguf_file,
)

LOADABLE = sorted(BLOCK_TYPES)  # the 13 block types of the issue


@pytest.fixture(scope="module")
def q4km(tmp_path_factory):
    return make_q4_k_m_gguf(tmp_path_factory.mktemp("q4km"))


def _blocks_for(name: str, x: np.ndarray, rng) -> np.ndarray:
    """x [n, k] in block type `name`: our writer or gguf-py's where one exists, else random blocks
    whose f16 scales are set to the size of x (Q2_K, Q3_K, IQ4_NL, IQ4_XS)."""
    if name in QUANTIZERS:
        return quantize(x, name)
    try:
        from gguf.quants import quantize as gguf_quantize

        return gguf_quantize(x, Q[name.upper()])
    except NotImplementedError:
        kind = BLOCK_TYPES[name]
        n = x.size // kind.block_size
        raw = rng.integers(0, 256, (n, kind.type_size), dtype=np.uint8)
        for at in F16_FIELDS[name]:
            raw[:, at : at + 2] = (rng.uniform(0.2, 1.0, n) * 0.004).astype(np.float16).view(np.uint8).reshape(n, 2)
        return raw.reshape(x.shape[0], -1)


@pytest.fixture(scope="module")
def every_type(tmp_path_factory):
    """A tiny llama whose 16 matrices take the 13 types in turn (q/k/v and gate/up of mixed types)."""
    where = tmp_path_factory.mktemp("mixed")
    hf = make_hf_model(where, "llama", hidden=256, heads=4, head_dim=64, layers=2)
    f32 = GGUFFile(write_gguf(hf, where / "f32.gguf"))
    kv = {k: f32.meta(k) for k in f32.reader.fields if not k.startswith("GGUF.") and k != "general.architecture"}
    rng = np.random.default_rng(7)
    tensors, given, i = [], {}, 0
    for t in f32.reader.tensors:
        data = np.asarray(t.data, dtype=np.float32)
        if data.ndim == 2:
            name = LOADABLE[i % len(LOADABLE)]
            i += 1
            tensors.append((t.name, _blocks_for(name, data, rng), Q[name.upper()]))
            given[t.name] = name
        else:
            tensors.append((t.name, data, None))
    path = write_gguf_file(where / "every-type.gguf", "llama", kv, tensors)
    return path, write_dequantized_gguf(path, where / "every-type-f32.gguf"), given


def test_every_type_loads_as_raw_blocks_and_dequantises_like_gguf(every_type):
    path, _, given = every_type
    assert set(given.values()) == set(LOADABLE)
    assert given["token_embd.weight"] != "f32" and given["output.weight"] != "f32"
    loaded = load_model(path)
    reader = GGUFReader(str(path))
    hf_of = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
             "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
             "blk.1.attn_v.weight": "model.layers.1.self_attn.v_proj.weight"}
    for t in reader.tensors:
        if t.name not in hf_of:
            continue
        w = loaded.weights[hf_of[t.name]]
        assert w.dtype == given[t.name]
        if w.dtype in RAW_BLOCK_TYPES:
            assert w.data.dtype == np.uint8 and not w.data.flags.owndata  # blocks, memory-mapped
        ref = gguf_dequantize(t.data, t.tensor_type).reshape(w.shape)
        assert w.to_f32().tobytes() == ref.tobytes()
    assert loaded.tensor_types == sorted({*given.values(), "f32"})
    assert loaded.n_params == sum(int(np.prod(t.shape)) for t in reader.tensors)


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_every_type_logits_equal_the_f32_gguf_of_its_dequantised_weights(every_type, exact):
    path, f32_path, _ = every_type
    q, f = load_model(path), load_model(f32_path)
    ids = list(np.random.default_rng(3).integers(0, q.config.vocab_size, 48))
    got = prompt_logits(q, ids, exact=exact, kv_type="f32")
    ref = prompt_logits(f, ids, exact=exact, kv_type="f32")
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0.1
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_q4_k_m_logits_equal_the_f32_gguf(q4km, exact):
    q, f = (load_model(p) for p in q4km)
    assert q.tensor_types == ["f32", "q4_k", "q6_k"]
    ids = list(np.random.default_rng(4).integers(0, q.config.vocab_size, 300))  # crosses a page
    got = prompt_logits(q, ids, exact=exact)
    ref = prompt_logits(f, ids, exact=exact)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    if exact:  # chunking a prompt does not change its bits
        assert prompt_logits(q, ids, exact=True, chunk=37).tobytes() == got.tobytes()


@pytest.mark.parametrize("kind", [Q.IQ2_XXS, Q.IQ3_S, Q.TQ1_0, Q.IQ1_M])
def test_other_types_fail_the_load_naming_tensor_and_type(tmp_path, kind):
    llama = make_hf_model(tmp_path, "llama", hidden=256, heads=4, head_dim=64, layers=2)
    f = GGUFFile(write_gguf(llama, tmp_path / "ok.gguf"))
    kv = {k: f.meta(k) for k in f.reader.fields if not k.startswith("GGUF.") and k != "general.architecture"}
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[kind]
    tensors = []
    for t in f.reader.tensors:
        data = np.asarray(t.data)
        if t.name == "blk.1.ffn_up.weight":
            tensors.append((t.name, np.zeros((data.shape[0], data.shape[1] // block * size), np.uint8), kind))
        else:
            tensors.append((t.name, data, None))
    path = write_gguf_file(tmp_path / "bad.gguf", "llama", kv, tensors)
    with pytest.raises(UnsupportedError, match=rf"tensor blk\.1\.ffn_up\.weight: unsupported tensor type {kind.name} "
                                               r"\(supported: F32, F16, BF16, Q8_0, Q4_0, .*Q4_K, .*MXFP4\)"):
        load_model(path)


def _complete(engine: Engine, prompt: list[int]) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": 24, "temperature": 0, "n_probs": 1}).encode()
    req = urllib.request.Request(engine.base + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_engine_child_generates_from_a_q4_k_m_file_as_from_its_f32_twin(q4km):
    """A real engine (CPU, exact on, f32 KV) on the Q4_K_M file and on the F32 file of its dequantised
    weights: the same greedy tokens, log-probabilities within 1e-5 of each other."""
    prompt = [int(t) for t in np.random.default_rng(5).integers(4, 300, 20)]
    out = []
    for path in q4km:
        engine = Engine(path, "--exact-concurrency", "on", "-ctk", "f32", "-ctv", "f32", "-c", "512", "-np", "2")
        try:
            engine.wait_ready()
            assert engine.get_json("/props")["exact_concurrency"]["granted"] is True
            out.append(_complete(engine, prompt))
        finally:
            engine.stop()
    q, f = out
    toks = [[p["id"] for p in r["completion_probabilities"]] for r in (q, f)]
    assert len(toks[0]) == 24 and toks[0] == toks[1]
    lq = np.array([p["logprob"] for p in q["completion_probabilities"]])
    lf = np.array([p["logprob"] for p in f["completion_probabilities"]])
    np.testing.assert_allclose(lq, lf, rtol=1e-5, atol=1e-5)


def test_cuda_keeps_k_quants_as_blocks_takes_other_block_types_as_f16_and_plans_memory(q4km, monkeypatch):
    """CUDA reads Q4_K, Q5_K and Q6_K as blocks (lockstep_kernels/cuda/kquant.py planes, about their stored size;
    Q5_K only on the integer kernels);
    other raw block types, and stacks of parts of different types, become f16 at upload. The
    conversion and the memory plan need no GPU, so they are checked here."""
    from engine.launch import memory_need
    from lockstep_kernels.cuda import plan
    from lockstep_kernels.cuda.kquant import packed_bytes
    from lockstep_kernels.cuda.weights import device_bytes, kernel_weight, stack_bytes
    from lockstep_kernels.weights import RowStack, Weight, concat_rows

    monkeypatch.setattr(plan, "KQ_INTEGER", True)
    rng = np.random.default_rng(9)
    w = Weight.from_f32(rng.standard_normal((64, 256)).astype(np.float32), "q4_k")
    assert kernel_weight(w) is w and device_bytes(w) == packed_bytes(64, 256, "q4_k")
    q40 = Weight.from_f32(rng.standard_normal((64, 256)).astype(np.float32), "q4_0")
    half = kernel_weight(q40)
    assert half.dtype == "f16" and half.data.tobytes() == q40.to_f32().astype(np.float16).tobytes()
    assert device_bytes(q40) == device_bytes(half)
    assert kernel_weight(half) is half
    q5 = Weight.from_f32(rng.standard_normal((64, 256)).astype(np.float32), "q5_k")  # the integer kernels' only
    assert kernel_weight(q5) is q5 and device_bytes(q5) == packed_bytes(64, 256, "q5_k")
    v = Weight.from_f32(rng.standard_normal((32, 256)).astype(np.float32), "q6_k")
    stack = concat_rows([w, v])
    assert isinstance(stack, RowStack)
    assert kernel_weight(stack).data.tobytes() == np.concatenate([w.to_f32(), v.to_f32()]).astype(np.float16).tobytes()
    loaded = load_model(q4km[0])
    stored = sum(w.nbytes for w in loaded.weights.values())
    need = memory_need(loaded, "cuda", n_pages=1, kv_type="f16")
    assert stored <= need["weights"]
    # layer 1's q|k|v is q4_k, q4_k, q6_k (Q4_K_M's v): on the integer kernels a stack of the runs'
    # planes (lockstep_kernels/cuda/weights.py CudaStack), so every tensor at its own device size; on matmul.cu's
    # f16 MMAs one RowStack, f16 on the device, and the plan counts what the upload makes of it
    qkv = [loaded.weights[f"model.layers.1.self_attn.{x}_proj.weight"] for x in "qkv"]
    assert [w.dtype for w in qkv] == ["q4_k", "q4_k", "q6_k"]
    assert stack_bytes(qkv) == sum(device_bytes(w) for w in qkv)
    assert need["weights"] == sum(device_bytes(w) for w in loaded.weights.values())
    monkeypatch.setattr(plan, "KQ_INTEGER", False)
    assert kernel_weight(q5).dtype == "f16"
    uploaded = device_bytes(kernel_weight(concat_rows(qkv)))
    assert uploaded == stack_bytes(qkv) > sum(device_bytes(w) for w in qkv)
    others = sum(device_bytes(w) for w in loaded.weights.values()) - sum(device_bytes(w) for w in qkv)
    assert memory_need(loaded, "cuda", n_pages=1, kv_type="f16")["weights"] == others + uploaded


def _blocks(n: int, k: int, kind: str) -> Weight:
    """A weight of zero blocks (only its type and shape matter to the plan)."""
    return Weight(np.zeros((n, k // BLOCK_TYPES[kind].block_size * BLOCK_TYPES[kind].type_size), np.uint8), kind)


def test_cuda_memory_plan_counts_mixed_type_stacks_of_8b_at_their_f16_size(monkeypatch):
    """On matmul.cu's f16 MMAs; on the integer kernels a mixed q|k|v is its runs' planes (a mixed gate|up
    is f16 there too: its epilogue needs one operand)."""
    from engine.launch import cuda_weight_bytes
    from lockstep_kernels.cuda import plan
    from lockstep_kernels.cuda.weights import device_bytes

    layer = "model.layers.0."
    mixed = {layer + "self_attn.q_proj.weight": _blocks(4096, 4096, "q4_k"),
             layer + "self_attn.k_proj.weight": _blocks(1024, 4096, "q4_k"),
             layer + "self_attn.v_proj.weight": _blocks(1024, 4096, "q6_k"),
             layer + "mlp.gate_proj.weight": _blocks(14336, 4096, "q4_k"),
             layer + "mlp.up_proj.weight": _blocks(14336, 4096, "q4_k")}
    as_stored = sum(device_bytes(w) for w in mixed.values())
    monkeypatch.setattr(plan, "KQ_INTEGER", True)
    assert cuda_weight_bytes(mixed) == as_stored
    monkeypatch.setattr(plan, "KQ_INTEGER", False)
    gate_up = device_bytes(mixed[layer + "mlp.gate_proj.weight"]) * 2  # one type: as it is
    assert cuda_weight_bytes(mixed) == 6144 * 4096 * 2 + gate_up
    # Q4_K_M gives about half of 8B's 32 layers a Q6_K v: the f16 stacks add ~0.6 GB to the plan
    assert 0.5e9 < 16 * (cuda_weight_bytes(mixed) - as_stored) < 0.65e9
    mixed[layer + "mlp.up_proj.weight"] = _blocks(14336, 4096, "q6_k")  # a mixed gate|up is f16 too
    assert cuda_weight_bytes(mixed) == 6144 * 4096 * 2 + 28672 * 4096 * 2
    monkeypatch.setattr(plan, "KQ_INTEGER", True)
    assert cuda_weight_bytes(mixed) == sum(device_bytes(mixed[layer + f"self_attn.{x}_proj.weight"]) for x in "qkv") \
        + 28672 * 4096 * 2
    one_type = {n: _blocks(*w.shape, "q4_k") for n, w in mixed.items()}
    assert cuda_weight_bytes(one_type) == sum(device_bytes(w) for w in one_type.values())


def test_cuda_load_line_names_mixed_type_stacks_and_their_memory(monkeypatch):
    """A q|k|v (or gate|up) whose parts differ in type is one f16 weight on matmul.cu's MMAs: the CUDA
    load logs how many, their types and the GiB the memory plan counts; stacks of one type, and
    mixed q|k|v runs on the integer kernels (planes), get no line."""
    from engine.launch import cuda_weight_bytes, mixed_stacks_line
    from lockstep_kernels.cuda import plan
    from lockstep_kernels.cuda.weights import device_bytes

    weights = {}
    for i, v in enumerate(("q6_k", "q4_k", "q6_k")):
        p = f"model.layers.{i}."
        weights |= {p + "self_attn.q_proj.weight": _blocks(4096, 4096, "q4_k"),
                    p + "self_attn.k_proj.weight": _blocks(1024, 4096, "q4_k"),
                    p + "self_attn.v_proj.weight": _blocks(1024, 4096, v)}
    monkeypatch.setattr(plan, "KQ_INTEGER", False)
    gib = 1 << 30
    stored = 2 * sum(w.nbytes for n, w in weights.items() if n.startswith("model.layers.0."))
    on_gpu = 2 * 6144 * 4096 * 2
    assert cuda_weight_bytes(weights) == on_gpu + sum(device_bytes(w) for n, w in weights.items() if ".1." in n)
    assert mixed_stacks_line(weights) == (
        f"cuda: 2 stacks mix types (Q4_K, Q6_K; q|k|v or gate|up as one matmul): f16 at load, "
        f"{stored / gib:.2f} GiB stored -> {on_gpu / gib:.2f} GiB on the GPU")
    assert mixed_stacks_line({n: w for n, w in weights.items() if ".1." in n}) is None
    monkeypatch.setattr(plan, "KQ_INTEGER", True)
    assert mixed_stacks_line(weights) is None


def test_cuda_load_line_names_k_quant_experts_read_as_f16_and_their_memory():
    """Routed experts in K-quants become f16 on CUDA (the grouped kernels read no planes): the load
    logs a line with their types, count and GiB, the GiB the memory plan counts; dense K-quants stay
    planes and are not named; a type without kernels gets its own line."""
    from engine.launch import cuda_weight_bytes
    from lockstep_kernels.cuda.weights import device_bytes, f16_at_load

    layer = "model.layers.0."
    experts = {layer + f"mlp.experts.{e}.{p}_proj.weight": _blocks(*shape, kind) for e in range(4)
               for p, shape, kind in (("gate", (768, 2048), "q4_k"), ("up", (768, 2048), "q4_k"),
                                      ("down", (2048, 768), "q6_k"))}
    dense = {layer + "self_attn.o_proj.weight": _blocks(2048, 4096, "q4_k")}
    assert f16_at_load(dense) == []
    (line,) = f16_at_load(experts | dense)
    gib = 1 << 30
    f16 = sum(device_bytes(w, planes=False) for w in experts.values())
    assert f16 == 4 * (2 * 768 * 2048 + 2048 * 768) * 2 == cuda_weight_bytes(experts)
    assert line == (f"cuda: no MoE expert kernels for Q4_K, Q6_K yet: 12 tensors dequantised to f16 at load, "
                    f"{sum(w.nbytes for w in experts.values()) / gib:.2f} GiB stored -> {f16 / gib:.2f} GiB on the GPU")
    q40 = {"lm_head.weight": _blocks(4096, 2048, "q4_0")}
    lines = f16_at_load(experts | q40)
    assert len(lines) == 2 and lines[0].startswith("cuda: no kernels for Q4_0 yet: 1 tensors dequantised")


def test_moe_experts_in_block_types_stay_raw_and_compute_as_their_values(tmp_path):
    """Stacked experts in a raw block type (Q4_0 here: the tiny MoE's rows are 32-multiples) are views
    of the stacked blocks, and the model computes as its dequantised weights."""
    from engine.loader import LoadedModel
    from lockstep_kernels.weights import Weight
    from tests.tiny_moe import make_moe_hf_model, write_moe_gguf

    g = load_model(write_moe_gguf(make_moe_hf_model(tmp_path), tmp_path / "moe-q4_0.gguf", "q4_0"))
    expert = next(w for k, w in g.weights.items() if ".mlp.experts.5.down_proj." in k)
    assert expert.dtype == "q4_0" and expert.data.dtype == np.uint8 and expert.data.base is not None
    as_f32 = LoadedModel(g.path, g.format, g.config, {k: Weight(w.to_f32(), "f32") for k, w in g.weights.items()},
                         g.tokenizer)
    ids = list(range(3, 43))
    want = prompt_logits(as_f32, ids, exact=True)
    assert np.abs(prompt_logits(g, ids, exact=True) - want).max() <= 1e-5 * np.abs(want).max()
