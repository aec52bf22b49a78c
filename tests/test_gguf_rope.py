"""GGUF RoPE scaling back to `rope_scaling`: llama3 parameters recovered from `rope_freqs` give the
same float32 frequencies, bit for bit, as the config.json they were converted from."""

import numpy as np
import pytest

pytest.importorskip("torch")  # the converter computes rope_freqs with torch; we mirror it

from engine.config import ModelConfig  # noqa: E402
from engine.errors import UnsupportedError  # noqa: E402
from engine.loader.gguf_rope import base_inv_freq, llama3_from_factors, rope_scaling  # noqa: E402
from tests.tiny_models import llama3_rope_factors  # noqa: E402

RELEASES = {  # head dim, theta, rope_scaling
    "llama-3.1-8b": (128, 500000.0, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192}),
    "llama-3.2-1b": (64, 500000.0, {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}),
    "one-band-point": (32, 500000.0, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}),
    "three-band-points": (32, 10000.0, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 4096}),
    "other-high": (128, 500000.0, {"factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
                                   "original_max_position_embeddings": 4096}),
}


def _inv_freq(dim, theta, scaling):
    cfg = ModelConfig("llama", 8, dim, 1, 1, 1, dim, 8, rope_theta=theta, rope_scaling=scaling)
    return cfg.rope_inv_freq().astype(np.float32)


@pytest.mark.parametrize("name", RELEASES)
def test_llama3_parameters_recovered_exactly(name):
    dim, theta, params = RELEASES[name]
    hf = {"rope_type": "llama3", **params}
    factors = llama3_rope_factors({"rope_theta": theta, **params}, dim)
    got = rope_scaling(None, None, None, factors, theta, dim)
    assert got == hf
    assert _inv_freq(dim, theta, got).tobytes() == _inv_freq(dim, theta, hf).tobytes()


def test_dividing_by_the_stored_factors_would_not_be_exact():
    """Why the parameters are recovered: float32 factors move some frequencies by an ulp."""
    dim, theta, params = RELEASES["llama-3.1-8b"]
    factors = llama3_rope_factors({"rope_theta": theta, **params}, dim)
    naive = (base_inv_freq(theta, dim) / factors.astype(np.float64)).astype(np.float32)
    assert naive.tobytes() != _inv_freq(dim, theta, {"rope_type": "llama3", **params}).tobytes()


def test_factors_of_another_shape_are_passed_on():
    factors = np.linspace(1.0, 3.0, 16).astype(np.float32)
    got = rope_scaling(None, None, None, factors, 10000.0, 32)
    assert got["rope_type"] == "freq_factors" and got["factors"] == factors.astype(np.float64).tolist()
    assert llama3_from_factors(factors, 10000.0, 32) is None


def test_metadata_scaling_types():
    assert rope_scaling(None, None, None, np.ones(16, np.float32), 1e4, 32) is None
    assert rope_scaling("none", None, None, None, 1e4, 32) is None
    assert rope_scaling("linear", 4.0, None, None, 1e4, 32) == {"rope_type": "linear", "factor": 4.0}
    with pytest.raises(UnsupportedError, match="unsupported rope scaling 'yarn'.*factor 4.0"):
        rope_scaling("yarn", 4.0, 32768, None, 1e4, 32)
