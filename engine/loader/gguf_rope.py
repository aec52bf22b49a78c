"""RoPE scaling as GGUF states it, turned back into the `rope_scaling` dict a config.json would hold.

llama.cpp's converter does not store Llama 3's scaling parameters: it bakes them into a float32
`rope_freqs` tensor of per-dimension divisors. Dividing by those stored factors rounds differently
from transformers' llama3 formula, and one ulp in a frequency changes the logits' bits. So we
recover the parameters from the factors (the formula has few degrees of freedom) and check that
they reproduce the file; only factors that fit no llama3 parameters are passed on as they are.
"""

from __future__ import annotations

import math

import numpy as np

from engine.errors import UnsupportedError

# Agreement needed between the stored float32 factors (computed in float32 by the converter) and
# float64 recomputation from the recovered parameters.
_FIT_RTOL = 1e-4


def base_inv_freq(theta: float, dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def llama3_factors(theta: float, dim: int, factor: float, low: float, high: float, old_ctx: float) -> np.ndarray:
    """The divisors convert_hf_to_gguf writes as `rope_freqs` for a llama3 `rope_scaling`."""
    wavelen = 2 * math.pi / base_inv_freq(theta, dim)
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, mid))


def _fits(stored: np.ndarray, theta: float, dim: int, params: dict) -> bool:
    got = llama3_factors(theta, dim, params["factor"], params["low_freq_factor"],
                         params["high_freq_factor"], params["original_max_position_embeddings"])
    return bool(np.allclose(got, stored, rtol=_FIT_RTOL, atol=0.0))


def _candidates(f: np.ndarray, band: np.ndarray, factor: float, inv: np.ndarray, orig_ctx: int | None):
    """(high_freq_factor, original context) pairs to try, with low_freq_factor = 1.

    In the smooth band s = (1/f - 1/factor) / (1 - 1/factor) is linear in the base frequency:
    s = A*freq + B with A = old_ctx / (2*pi*(high - low)) and B = -low / (high - low). Two band
    points fix A and B; scaling all three parameters together leaves the exact result unchanged, so
    low = 1 (every Llama 3.x release). With fewer points we also assume high = 4 (likewise universal).
    Rounded values come first: they are what people write in config.json.
    """
    s = (1.0 / f[band] - 1.0 / factor) / (1.0 - 1.0 / factor)
    if band.sum() >= 2:
        a, b = np.polyfit(inv[band], s, 1)
        if b < 0 < a:
            span = -1.0 / b
            old = a * 2 * math.pi * span
            yield round(1.0 + span, 4), float(round(old))
            yield 1.0 + span, old
    if band.sum() >= 1:
        old = (3.0 * s[0] + 1.0) * 2 * math.pi / inv[band][0]
        yield 4.0, float(round(old))
        yield 4.0, old
    for ctx in (orig_ctx, 8192):
        if ctx:
            yield 4.0, float(ctx)


def llama3_from_factors(factors: np.ndarray, theta: float, dim: int, orig_ctx: int | None = None) -> dict | None:
    """llama3 `rope_scaling` parameters that reproduce `factors`, or None when none do."""
    f = np.asarray(factors, dtype=np.float64)
    if f.shape != (dim // 2,) or not np.all(f >= 1.0):
        return None
    factor = float(f.max())
    if factor <= 1.0:
        return None
    band = (f > 1.0 + 1e-6) & (f < factor * (1 - 1e-6))
    for high, ctx in _candidates(f, band, factor, base_inv_freq(theta, dim), orig_ctx):
        params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                  "high_freq_factor": float(high), "original_max_position_embeddings": ctx}
        if ctx > 0 and high > 1.0 and _fits(f, theta, dim, params):
            if float(ctx).is_integer():
                params["original_max_position_embeddings"] = int(ctx)
            return params
    return None


def rope_scaling(kind: str | None, factor: float | None, orig_ctx: int | None,
                 freq_factors: np.ndarray | None, theta: float, dim: int) -> dict | None:
    """The `rope_scaling` dict for a GGUF's `rope.scaling.*` keys and its `rope_freqs` tensor."""
    if freq_factors is not None:
        f = np.asarray(freq_factors, dtype=np.float64)
        if np.all(f == 1.0):
            return None
        # Exactly llama3 when it fits; otherwise the factors themselves divide the base frequencies.
        return llama3_from_factors(f, theta, dim, orig_ctx) or {"rope_type": "freq_factors", "factors": f.tolist()}
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    detail = f" (factor {factor}, original context {orig_ctx})" if factor else ""
    raise UnsupportedError(f"unsupported rope scaling {kind!r}{detail} (supported: linear, llama3)")
