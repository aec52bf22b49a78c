"""The decode-graph row layout (one page-table row per token row) on the CPU.

A CUDA graph cannot run here, so a stand-in with DecodeGraphs' call protocol runs the same rows
uncaptured. It checks the runner's flattening of decode and speculative verify rows, not CUDA.
"""

import numpy as np

from engine.runner import Runner, make_ops
from lockstep_kernels.base import PagedRows
from tests.test_scheduler import GREEDY, run


class RowsStandIn:
    """Like lockstep_kernels.cuda.graphs.DecodeGraphs: row i uses page-table row i, logits for every row."""

    def __init__(self, runner: Runner, width: int, max_batch: int = 64):
        self.runner, self.width, self.max_batch = runner, width, max_batch
        self.calls = self.fed = 0

    def __call__(self, tokens, positions, tables, slots, ids_from=None):
        self.calls += 1
        self.fed += ids_from is not None
        tokens = tokens if ids_from is None else ids_from  # the previous replay's argmax, on the "device"
        n = len(tokens)
        rows = PagedRows(np.asarray(positions, np.int32), np.arange(n, dtype=np.int32), tables,
                         np.asarray(slots, np.int64))
        logits = self.runner.model.forward(np.asarray(tokens, np.int32), rows, self.runner.pool.layers,
                                           np.arange(n, dtype=np.int64))
        self.last_argmax = self.runner.ops.argmax(logits)  # the replay's own argmax, as DecodeGraphs keeps it
        return logits


def test_graph_rows_give_the_same_output_for_decode_and_verify_steps(loaded_llama, monkeypatch):
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(4, loaded_llama.config.vocab_size, 12)] * 6 for _ in range(3)]
    plain, _ = run(loaded_llama, prompts, params=GREEDY, max_tokens=40)

    stand_ins = []
    real_init = Runner.__init__

    def with_stand_in(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.graphs = RowsStandIn(self, width=self.pool.n_pages)
        stand_ins.append(self.graphs)

    monkeypatch.setattr(Runner, "__init__", with_stand_in)
    graphed, stats = run(loaded_llama, prompts, params=GREEDY, max_tokens=40, spec=3)
    assert graphed == plain
    assert stats["draft_accepted_total"] > 0
    assert stand_ins[0].calls > 0


def test_prefill_chunks_do_not_take_the_graph_path(loaded_llama):
    runner = Runner(loaded_llama, make_ops("cpu", True), 2, "f32")
    runner.graphs = RowsStandIn(runner, width=2)
    from engine.runner import StepEntry

    pages = runner.pool.alloc(1)
    runner.step([StepEntry(pages, [5, 6, 7], 0, "last")])
    assert runner.graphs.calls == 0
    runner.step([StepEntry(pages, [8], 3, "last"), StepEntry(pages, [9, 10], 4, "all")])
    assert runner.graphs.calls == 1
