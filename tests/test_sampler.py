import numpy as np
import pytest

from engine.sampler import SamplingParams, counter_uniform, log_softmax, sample, top_logprobs

RNG = np.random.default_rng(7)


def test_counter_uniform_is_a_function_of_seed_and_index():
    a = [counter_uniform(1234, i) for i in range(1000)]
    assert a == [counter_uniform(1234, i) for i in range(1000)]
    assert a != [counter_uniform(1235, i) for i in range(1000)]
    assert all(0.0 <= u < 1.0 for u in a)
    assert abs(np.mean(a) - 0.5) < 0.05  # roughly uniform


def test_greedy_ties_go_to_lowest_index():
    row = np.array([0.1, 3.0, 3.0, -1.0], dtype=np.float32)
    assert sample(row, SamplingParams(temperature=0), [], 0) == 1


def test_top_k_one_is_greedy():
    row = RNG.standard_normal(100).astype(np.float32)
    p = SamplingParams(temperature=1.5, top_k=1, seed=3)
    assert all(sample(row, p, [], i) == int(np.argmax(row)) for i in range(20))


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    row = RNG.standard_normal(500).astype(np.float32)
    p1 = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    p2 = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=2)
    draws1 = [sample(row, p1, [], i) for i in range(50)]
    assert draws1 == [sample(row, p1, [], i) for i in range(50)]
    assert draws1 != [sample(row, p2, [], i) for i in range(50)]


def test_sampling_follows_the_distribution():
    row = np.log(np.array([0.7, 0.2, 0.1], dtype=np.float32))
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=9)
    counts = np.bincount([sample(row, p, [], i) for i in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.7, 0.2, 0.1], atol=0.03)


def test_top_p_and_min_p_cut_the_tail():
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    top_p = SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, seed=1)
    assert {sample(row, top_p, [], i) for i in range(300)} == {0, 1}
    min_p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=1)
    assert {sample(row, min_p, [], i) for i in range(300)} == {0, 1}


@pytest.mark.parametrize("kind", ["repeat", "presence", "frequency"])
def test_penalties_push_repeated_tokens_down(kind):
    row = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    kw = {"repeat": {"repeat_penalty": 1.5}, "presence": {"presence_penalty": 0.5},
          "frequency": {"frequency_penalty": 0.3}}[kind]
    p = SamplingParams(temperature=0, **kw)
    assert sample(row, p, [], 0) == 0
    assert sample(row, p, [0, 0], 0) == 1


def test_logprobs():
    row = RNG.standard_normal(50).astype(np.float32)
    lp = log_softmax(row)
    assert abs(np.exp(lp).sum() - 1) < 1e-9
    top = top_logprobs(lp, 5)
    assert [t for t, _ in top] == list(np.argsort(-row, kind="stable")[:5])
