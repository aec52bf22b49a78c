"""Token sampling on the host, one row at a time.

Every step depends only on the row's logits, the request's parameters and history, and the
token's index: the random number for token i is a counter-based function of (seed, i), never a
stream shared by the batch. Ties go to the lowest token id.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

_M64 = (1 << 64) - 1


def counter_uniform(seed: int, index: int) -> float:
    """splitmix64 of (seed, index) -> a float in [0, 1) with 53 random bits."""
    z = ((seed & _M64) * 0x9E3779B97F4A7C15 + (index + 1) * 0xD1B54A32D192ED03) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


def random_seed() -> int:
    return secrets.randbits(32)


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    # (token id, bias) pairs added to the logits before sampling; -inf bans a token (ignore_eos bans the EOGs)
    logit_bias: tuple[tuple[int, float], ...] = ()
    post_sampling_probs: bool = False  # report probabilities after the samplers' filters, not log-softmax
    grammar: str = ""  # GBNF the answer must follow (engine.constraints masks the logits to it)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def needs_logits(p: SamplingParams, logprobs: int) -> bool:
    """False when the row's argmax alone decides the token: greedy, no penalties, no logprobs."""
    penalized = p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
    return not p.greedy or penalized or logprobs >= 0 or bool(p.logit_bias) or bool(p.grammar)


def _bias(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    if not p.logit_bias:
        return logits
    out = logits.copy()
    for token, bias in p.logit_bias:
        if token < out.shape[0]:
            out[token] += bias
    return out


def _penalize(logits: np.ndarray, p: SamplingParams, history: list[int]) -> np.ndarray:
    if not history or (p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0):
        return logits
    recent = history[-p.repeat_last_n:] if p.repeat_last_n > 0 else history
    ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
    ids_ok = ids < logits.shape[0]
    ids, counts = ids[ids_ok], counts[ids_ok]
    out = logits.copy()
    sel = out[ids]
    if p.repeat_penalty != 1.0:
        sel = np.where(sel > 0, sel / p.repeat_penalty, sel * p.repeat_penalty)
    sel = sel - counts * p.frequency_penalty - p.presence_penalty
    out[ids] = sel
    return out


def _sorted_desc(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits, by value descending then index ascending."""
    n = logits.shape[0]
    if 0 < k < n:
        part = np.argpartition(-logits, k - 1)[:k]
        kth = logits[part].min()
        part = np.flatnonzero(logits >= kth)  # every tie of the k-th value, so ties resolve by index
    else:
        part = np.arange(n)
    order = np.lexsort((part, -logits[part]))
    return part[order][:k] if 0 < k < n else part[order]


def sample(row: np.ndarray, p: SamplingParams, history: list[int], index: int) -> int:
    logits = _bias(_penalize(np.asarray(row, dtype=np.float64), p, history), p)
    if p.greedy:
        return int(np.argmax(logits))
    cand, weights = _candidates(logits, p)
    cdf = np.cumsum(weights)
    u = counter_uniform(p.seed, index) * cdf[-1]
    pick = int(np.searchsorted(cdf, u, side="right"))
    return int(cand[min(pick, len(cand) - 1)])


def _candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens top-k, top-p and min-p keep, likeliest first, with their unnormalized weights."""
    cand = _sorted_desc(logits, p.top_k)
    vals = logits[cand]
    if p.top_p < 1.0 or p.min_p > 0.0:
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = len(cand)
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(probs >= p.min_p * probs[0]))))
        cand, vals = cand[:keep], vals[:keep]
    scaled = (vals - vals[0]) / p.temperature
    return cand, np.exp(scaled)


def post_sampling_logprobs(row: np.ndarray, p: SamplingParams, history: list[int], token: int,
                           n: int) -> tuple[float, list[tuple[int, float]]]:
    """llama-server's post_sampling_probs: the chosen token's and the n likeliest tokens' probabilities in
    the distribution the sampler drew from (as logs; a filtered-out token has none and is not listed)."""
    logits = _bias(_penalize(np.asarray(row, dtype=np.float64), p, history), p)
    if p.greedy:
        return 0.0, [(int(np.argmax(logits)), 0.0)][:n]
    cand, weights = _candidates(logits, p)
    logw = np.log(weights / weights.sum())
    chosen = np.flatnonzero(cand == token)
    lp = float(logw[chosen[0]]) if chosen.size else float("-inf")
    return lp, [(int(cand[i]), float(logw[i])) for i in range(min(n, len(cand)))]


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def top_logprobs(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    idx = _sorted_desc(logprobs, n)
    return [(int(i), float(logprobs[i])) for i in idx]
