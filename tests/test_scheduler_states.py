"""Per-sequence state besides KV pages (the hook a hybrid model's recurrent state plugs into) lives
exactly as long as the pages: allocated when a sequence runs, copied on n > 1 forks, parked and
restored with its pages, freed when they are."""

import numpy as np
import pytest

from tests.test_scheduler import run


class RecordingState:
    """A real holder of a small array per sequence, that checks the order of the manager's calls."""

    def __init__(self):
        self.live: dict = {}
        self.sent: dict = {}
        self.calls = {"alloc": 0, "free": 0, "copy": 0, "park": 0, "restore": 0}

    def alloc(self, seq):
        assert seq not in self.live, "allocated twice"
        self.live[seq] = np.zeros(4, np.float32)
        self.calls["alloc"] += 1

    def free(self, seq):
        assert seq in self.live, "freed without an allocation"
        del self.live[seq]
        self.calls["free"] += 1

    def copy(self, src, dst):
        self.live[dst][:] = self.live[src]
        self.calls["copy"] += 1

    def host_bytes(self, seq):
        return self.live[seq].nbytes

    def park(self, seq):
        self.live[seq][0] += 1  # a count of parks, to see it come back
        self.calls["park"] += 1
        self.sent[seq] = self.live[seq].copy()
        return (seq, self.sent[seq].copy())

    def restore(self, seq, host):
        owner, data = host
        assert owner is seq, "another sequence's state came back"
        self.live[seq][:] = data
        assert np.array_equal(data, self.sent.pop(seq)) and data[0] >= 1
        self.calls["restore"] += 1


@pytest.fixture(scope="module")
def prompts(loaded_llama):
    rng = np.random.default_rng(3)
    return [[int(t) for t in rng.integers(4, loaded_llama.config.vocab_size, int(rng.integers(20, 300)))] for _ in range(5)]


def test_state_follows_parks_restores_and_ends(loaded_llama, prompts):
    st = RecordingState()
    _, stats = run(loaded_llama, prompts, n_pages=4, every=7, states=[st])
    assert stats["parks"] > 0 and st.calls["park"] == stats["parks"] == st.calls["restore"]
    assert not st.live, "state of finished sequences was not freed"
    assert st.calls["alloc"] == st.calls["free"] == len(prompts) + stats["restores"] + stats["recomputes"]


def test_state_is_dropped_for_recompute_and_copied_on_fork(loaded_llama, prompts):
    st = RecordingState()
    _, stats = run(loaded_llama, prompts[:2], every=5, ram=0, n=2, states=[st])
    assert stats["recomputes"] > 0 and st.calls["park"] == 0
    assert st.calls["copy"] == 2  # one fork per request
    assert not st.live and st.calls["alloc"] == st.calls["free"]
