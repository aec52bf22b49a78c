"""Tensor-parallel planning on the CPU: each rank's shapes and KV heads, and the refusals."""

import numpy as np
import pytest

from engine.config import ModelConfig, MoeConfig
from engine.parallel.collective import InProcessCollective, ordered_sum, reduce_partials
from engine.parallel.plan import PlanError, parse_tensor_split, plan_tp, resolve_tp
from engine.parallel.shard import cols, shard_weights
from lockstep_kernels.weights import Weight
from tests.engine_helpers import last_line, run_engine

EIGHT_B = ModelConfig("llama", 128256, 4096, 32, 32, 8, 128, 14336)


def test_even_split_of_the_8b_shape():
    plan = plan_tp(EIGHT_B, 2)
    assert [(s.n_heads, s.n_kv_heads, s.ffn) for s in plan.ranks] == [(16, 4, 7168), (16, 4, 7168)]
    assert [(s.q0, s.kv0, s.f0) for s in plan.ranks] == [(0, 0, 0), (16, 4, 7168)]
    assert plan.devices == (0, 1)


def test_uneven_split_keeps_query_heads_with_their_kv_group():
    plan = plan_tp(EIGHT_B, 2, (3.0, 1.0), n_devices=2, main_gpu=1)
    assert [s.n_kv_heads for s in plan.ranks] == [6, 2]
    assert [s.n_heads for s in plan.ranks] == [24, 8]
    assert sum(s.ffn for s in plan.ranks) == 14336 and plan.ranks[0].ffn == 10752
    assert plan.devices == (1, 0)  # rank 0 on the main GPU
    assert plan.split == (0.75, 0.25)


def test_ffn_cut_in_whole_blocks():
    plan = plan_tp(EIGHT_B, 2, (2.0, 1.0), ffn_unit=256)
    assert all(s.f0 % 256 == 0 for s in plan.ranks)


def test_shard_shapes_per_rank():
    c = ModelConfig("qwen2", 50, 16, 1, 4, 2, 4, 12, qkv_bias=True)
    rng = np.random.default_rng(0)
    names = {"self_attn.q_proj.weight": (16, 16), "self_attn.k_proj.weight": (8, 16), "self_attn.v_proj.weight": (8, 16),
             "self_attn.q_proj.bias": (16,), "self_attn.o_proj.weight": (16, 16), "mlp.gate_proj.weight": (12, 16),
             "mlp.up_proj.weight": (12, 16), "mlp.down_proj.weight": (16, 12), "input_layernorm.weight": (16,)}
    w = {f"model.layers.0.{n}": Weight(rng.standard_normal(s).astype(np.float32), "f32") for n, s in names.items()}
    w["model.embed_tokens.weight"] = Weight(rng.standard_normal((50, 16)).astype(np.float32), "f32")
    s1 = plan_tp(c, 2).ranks[1]
    out = shard_weights(c, w, s1)
    p = "model.layers.0."
    assert out[p + "self_attn.q_proj.weight"].shape == (8, 16)
    assert out[p + "self_attn.k_proj.weight"].shape == (4, 16)
    assert out[p + "self_attn.q_proj.bias"].data.tolist() == w[p + "self_attn.q_proj.bias"].data[8:].tolist()
    np.testing.assert_array_equal(out[p + "self_attn.o_proj.weight"].data, w[p + "self_attn.o_proj.weight"].data[:, 8:])
    np.testing.assert_array_equal(out[p + "mlp.down_proj.weight"].data, w[p + "mlp.down_proj.weight"].data[:, 6:])
    assert out[p + "mlp.up_proj.weight"].shape == (6, 16)
    assert out["model.embed_tokens.weight"] is w["model.embed_tokens.weight"]  # replicated
    assert out[p + "input_layernorm.weight"] is w[p + "input_layernorm.weight"]


def test_quantized_column_cut_keeps_its_scales_and_refuses_a_cut_inside_a_block():
    x = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)
    w = Weight.from_f32(x, "q8_0")
    right = cols(w, 64, 128, "down")
    np.testing.assert_array_equal(right.to_f32(), w.to_f32()[:, 64:])
    q4 = Weight.from_f32(np.tile(x, (1, 4)), "q4_k")
    np.testing.assert_array_equal(cols(q4, 256, 512, "down").to_f32(), q4.to_f32()[:, 256:])
    with pytest.raises(PlanError, match="blocks hold 32 values"):
        cols(w, 48, 128, "down")


@pytest.mark.parametrize("config, tp, split, devices, message", [
    (EIGHT_B, 3, None, None, "does not divide the model's 8 KV heads"),
    (ModelConfig("llama", 10, 64, 1, 4, 4, 16, 102), 4, None, None, "does not divide the model's FFN width 102"),
    (EIGHT_B, 4, None, 2, "more ranks than the 2 GPU"),
    (EIGHT_B, 2, (1.0, 1.0, 1.0), None, "3 proportions for --tp 2"),
    (EIGHT_B, 2, (30.0, 1.0), None, "rank 1 would get no KV head"),
    (EIGHT_B, 2, None, 2, None),
])
def test_plan_refusals(config, tp, split, devices, message):
    if message is None:
        assert plan_tp(config, tp, split, devices).tp == tp
        return
    with pytest.raises(PlanError, match=message):
        plan_tp(config, tp, split, devices)


def test_main_gpu_must_exist_and_moe_is_not_covered():
    with pytest.raises(PlanError, match="--main-gpu 2: no such GPU"):
        plan_tp(EIGHT_B, 2, n_devices=2, main_gpu=2)
    moe = ModelConfig("qwen3_moe", 10, 64, 1, 4, 4, 16, 64, moe=MoeConfig(8, 2, 32))
    with pytest.raises(PlanError, match="qwen3_moe is not covered"):
        plan_tp(moe, 2)


def test_flag_resolution():
    assert resolve_tp(None, None, None) == (1, (1.0,))
    assert resolve_tp(None, "row", (3.0, 0.0, 1.0)) == (2, (3.0, 1.0))  # a zero leaves a device out
    assert resolve_tp(2, None, None) == (2, (1.0, 1.0))
    assert resolve_tp(None, "layer", (1.0, 1.0)) == (1, (1.0,))  # one rank: nothing is split
    for args, message in (((2, "layer", None), "--split-mode layer .* not supported yet"),
                          ((2, "none", None), "contradicts --tp 2"),
                          ((3, "row", (1.0, 1.0)), "2 non-zero proportions for --tp 3")):
        with pytest.raises(PlanError, match=message):
            resolve_tp(*args)
    for bad in ("a,b", "-1,1", "0,0", "inf,1"):
        with pytest.raises(PlanError):
            parse_tensor_split(bad)


def test_exact_reduction_is_the_rank_order_sum_and_off_uses_all_reduce():
    rng = np.random.default_rng(2)
    parts = [rng.standard_normal((5, 8)).astype(np.float32) * 10 ** i for i in range(4)]
    coll = InProcessCollective(4)
    exact = reduce_partials(coll, parts, exact=True)
    want = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    assert all(x.tobytes() == want.tobytes() for x in exact)
    assert ordered_sum(parts).tobytes() == want.tobytes()
    off = reduce_partials(coll, parts, exact=False)
    np.testing.assert_allclose(off[0], want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("args, message", [
    (["--tp", "2", "--split-mode", "layer"], "--split-mode layer (layers spread over GPUs) is not supported yet"),
    (["--tp", "2", "-sm", "none"], "--split-mode none uses one GPU, which contradicts --tp 2"),
    (["-ts", "1,x"], "--tensor-split '1,x': expects proportions"),
    (["--tp", "0"], "expects an integer >= 1"),
])
def test_engine_refuses_bad_splits(tiny_llama, args, message):
    r = run_engine(["-m", str(tiny_llama), "--device", "cpu", *args])
    assert r.returncode == 2
    assert message in last_line(r.stderr), r.stderr


def test_engine_refuses_a_split_the_model_cannot_take(tiny_llama):
    r = run_engine(["-m", str(tiny_llama), "--device", "cpu", "--port", "0", "--tp", "4"])
    assert r.returncode == 2, r.stderr
    assert last_line(r.stderr) == "error: --tp 4 does not divide the model's 2 KV heads"


def test_main_gpu_with_one_rank_on_cuda_is_refused_by_name(tiny_llama):
    """-mg only orders the ranks; with one GPU it would be ignored, so it is refused (the CUDA check runs
    before any CUDA code, so a CPU machine tests it with the device probe reporting a working GPU)."""
    from tests.test_engine_exact import AS_IF_CUDA, run_patched

    r = run_patched(AS_IF_CUDA, ["-m", str(tiny_llama), "--device", "cuda", "-mg", "1", "--port", "0"])
    assert r.returncode == 2, r.stderr
    assert last_line(r.stderr).startswith("error: --main-gpu 1 with one GPU is not supported yet")
