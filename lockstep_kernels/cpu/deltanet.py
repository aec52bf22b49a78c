"""NumPy reference of the recurrent half of hybrid models: causal conv1d and the gated delta rule.

Each sequence's rows are computed by themselves with shapes fixed by the model, so nothing depends on
which other sequences share the step. Prompt rows advance the state in chunks of CHUNK tokens; in
exact mode the chunks lie at multiples of CHUNK along the sequence (position 0 onwards) whatever
piece of the prompt a step holds, so a prompt's state is a function of its tokens alone. Decode rows
take the token-by-token rule, one token per sequence, the same arithmetic for any batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lockstep_kernels.base import RecurrentRows

CHUNK = 16  # the CPU's fixed chunk of prompt tokens (engine planners cut prompt pieces at its multiples)


@dataclass
class CpuRecurrentLayer:
    """One sequence's state in one layer: the conv window (the last kernel - 1 inputs, oldest first)
    and the delta-rule state, one [k_dim, v_dim] matrix per value head."""

    conv: np.ndarray  # [kernel - 1, conv_dim] float32
    ssm: np.ndarray  # [v_heads, k_dim, v_dim] float32


def state_alloc(n_layers: int, conv_dim: int, kernel: int, v_heads: int, k_dim: int, v_dim: int) -> list:
    return [CpuRecurrentLayer(np.zeros((kernel - 1, conv_dim), np.float32),
                              np.zeros((v_heads, k_dim, v_dim), np.float32)) for _ in range(n_layers)]


def state_read(state: list) -> list[np.ndarray]:
    return [a.copy() for layer in state for a in (layer.conv, layer.ssm)]


def state_write(state: list, data: list[np.ndarray]) -> None:
    for i, layer in enumerate(state):
        layer.conv[...] = data[2 * i]
        layer.ssm[...] = data[2 * i + 1]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    # torch's threshold: above 20 softplus(x) is x in float32
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, np.float32(20))))).astype(np.float32)


def _l2norm(x: np.ndarray) -> np.ndarray:
    inv = np.float32(1.0) / np.sqrt(np.add.reduce(x * x, axis=-1) + np.float32(1e-6))
    return x * inv[..., None]


def conv1d_silu(x: np.ndarray, weight: np.ndarray, rows: RecurrentRows, layer: int) -> np.ndarray:
    """x [T, D] through each sequence's causal depthwise conv (weight [D, kernel]) and silu; the
    window moves on by the rows. The taps are added in one fixed order, so every row's value depends
    on its own inputs only."""
    x = np.asarray(x, dtype=np.float32)
    out = np.empty_like(x)
    kernel = weight.shape[1]
    for i, (a, b) in enumerate(rows.bounds):
        st = rows.states[i][layer]
        n = b - a
        buf = np.concatenate([st.conv, x[a:b]])  # buf[j] is the input at position start - kernel + 1 + j
        acc = buf[0:n] * weight[:, 0]
        for j in range(1, kernel):
            acc = acc + buf[j : j + n] * weight[:, j]
        out[a:b] = acc * _sigmoid(acc)
        for p in rows.snap[i]:
            rows.taken.setdefault((i, p), []).append(buf[p - rows.starts[i] : p - rows.starts[i] + kernel - 1].copy())
        st.conv[...] = buf[n:]
    return out


def gated_delta(mixed: np.ndarray, a: np.ndarray, b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray,
                rows: RecurrentRows, layer: int, n_k_heads: int, exact: bool) -> np.ndarray:
    """The gated delta rule over each sequence's rows. mixed [T, 2 * k_heads * k_dim + v_heads * v_dim]
    holds q | k | v after the conv; a, b [T, v_heads] the decay and write-strength inputs. Returns
    [T, v_heads, v_dim]."""
    t = mixed.shape[0]
    v_heads, k_dim, v_dim = rows.states[0][layer].ssm.shape if rows.states else (1, 1, 1)
    kd = n_k_heads * k_dim
    rep = v_heads // n_k_heads
    q = _l2norm(mixed[:, :kd].reshape(t, n_k_heads, k_dim)) * np.float32(k_dim ** -0.5)
    k = _l2norm(mixed[:, kd : 2 * kd].reshape(t, n_k_heads, k_dim))
    q, k = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)  # value head h reads key head h // rep
    v = np.ascontiguousarray(mixed[:, 2 * kd :].reshape(t, v_heads, v_dim))
    beta = _sigmoid(np.asarray(b, dtype=np.float32))
    g = -np.exp(a_log) * _softplus(np.asarray(a, dtype=np.float32) + dt_bias)
    out = np.empty((t, v_heads, v_dim), np.float32)
    for i, (r0, r1) in enumerate(rows.bounds):
        st = rows.states[i][layer]
        args = (q[r0:r1], k[r0:r1], v[r0:r1], g[r0:r1], beta[r0:r1])
        if rows.prompt[i]:
            origin = 0 if exact else rows.starts[i]  # exact: the chunk grid starts at position 0
            out[r0:r1] = _chunked(*args, st, rows, i, origin)
        else:
            out[r0:r1] = _recurrent(*args, st)
    return out


def _recurrent(q, k, v, g, beta, st: CpuRecurrentLayer) -> np.ndarray:
    s = st.ssm.copy()
    out = np.empty_like(v)
    for j in range(q.shape[0]):
        s *= np.exp(g[j])[:, None, None]
        kv_mem = np.matmul(k[j][:, None, :], s)[:, 0]
        delta = (v[j] - kv_mem) * beta[j][:, None]
        s += k[j][:, :, None] * delta[:, None, :]
        out[j] = np.matmul(q[j][:, None, :], s)[:, 0]
    st.ssm[...] = s
    return out


def _chunked(q, k, v, g, beta, st: CpuRecurrentLayer, rows: RecurrentRows, seg: int, origin: int) -> np.ndarray:
    """Chunks of CHUNK positions from `origin`: the first one may start inside a chunk (a piece
    resumed there), the last may end inside one (padded with rows that add exact zeros)."""
    start = rows.starts[seg]
    n = q.shape[0]
    out = np.empty_like(v)
    s = st.ssm.copy()
    at = 0
    while at < n:
        pos = start + at
        end = min(n, at + CHUNK - (pos - origin) % CHUNK)
        out[at:end], s = _chunk(q[at:end], k[at:end], v[at:end], g[at:end], beta[at:end], s)
        at = end
        if start + at in rows.snap[seg]:
            rows.taken.setdefault((seg, start + at), []).append(s.copy())
    st.ssm[...] = s
    return out


def _pad(x: np.ndarray) -> np.ndarray:
    """[n, heads, ...] -> [heads, CHUNK, ...], zero rows after the n given."""
    out = np.zeros((x.shape[1], CHUNK, *x.shape[2:]), np.float32)
    out[:, : x.shape[0]] = np.swapaxes(x, 0, 1)
    return out


_UPPER = np.triu(np.ones((CHUNK, CHUNK), dtype=bool), 1)
_EYE = np.eye(CHUNK, dtype=np.float32)


def _chunk(q, k, v, g, beta, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One chunk by the WY/UT form transformers' torch_chunk_gated_delta_rule uses, with the
    triangular system solved by forward substitution in row order."""
    n = q.shape[0]
    qc, kc, vc = _pad(q), _pad(k), _pad(v)
    bc, gc = _pad(beta), _pad(g)  # [heads, CHUNK]
    v_beta, k_beta = vc * bc[..., None], kc * bc[..., None]
    cum = np.cumsum(gc, axis=1)
    decay = np.exp(np.where(_UPPER, -np.inf, cum[:, :, None] - cum[:, None, :])).astype(np.float32)
    kt = np.swapaxes(kc, 1, 2)
    a = -np.tril(np.matmul(k_beta, kt) * decay, -1)
    for r in range(1, CHUNK):
        a[:, r, :r] = a[:, r, :r] + np.add.reduce(a[:, r, :r, None] * a[:, :r, :r], axis=1)
    a = a + _EYE
    e_cum = np.exp(cum)
    new_v = np.matmul(a, v_beta) - np.matmul(np.matmul(a, k_beta * e_cum[..., None]), s)
    intra = np.matmul(qc, kt) * decay
    out = np.matmul(qc * e_cum[..., None], s) + np.matmul(intra, new_v)
    k_dec = kc * np.exp(cum[:, -1:] - cum)[..., None]
    s = s * np.exp(cum[:, -1])[:, None, None] + np.matmul(np.swapaxes(k_dec, 1, 2), new_v)
    return np.swapaxes(out, 0, 1)[:n], s


def gated_rms_norm(x: np.ndarray, weight: np.ndarray, gate: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm(x) * weight * silu(gate), per row of the last axis."""
    x = np.asarray(x, dtype=np.float32)
    ms = np.add.reduce(x * x, axis=-1) / np.float32(x.shape[-1])
    inv = (np.float32(1.0) / np.sqrt(ms + np.float32(eps))).astype(np.float32)
    return (x * inv[..., None]) * weight * (gate * _sigmoid(gate))


def sigmoid_mul(x: np.ndarray, gate: np.ndarray) -> np.ndarray:
    return x * _sigmoid(gate)
