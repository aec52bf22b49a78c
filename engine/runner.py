"""One forward step over a batch of sequences' token rows, on whichever backend is loaded."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from contract.env import DECODE_GRAPHS, switch
from engine.kv_cache import PagePool, pages_for
from engine.loader import LoadedModel
from engine.models.build import model_class
from engine.modes import LogitRows
from lockstep_kernels.base import PAGE_SIZE, Ops, PagedRows, RecurrentRows


@dataclass
class StepEntry:
    """A sequence's part of a step: `tokens` at positions start.. written into its `pages`.

    `full_rows` asks for the logits rows on the host; without it the argmax of each row is enough
    (greedy decoding without logprobs), which saves copying a vocabulary-wide row per token."""

    pages: list[int]
    tokens: list[int]
    start: int
    logits: LogitRows = "last"
    full_rows: bool = True
    # hybrid models: the sequence's recurrent state (Runner.new_state), whether these tokens are
    # prompt tokens (advanced in fixed chunks) or generated ones, the chunk ends to snapshot there;
    # the step fills `snapshots` {position: host copy of the state}
    state: object = None
    prompt: bool = False
    snap: tuple[int, ...] = ()
    snapshots: dict = field(default_factory=dict)


@dataclass
class RowsOut:
    """An entry's logits rows: their argmax always, the rows themselves when asked for."""

    argmax: np.ndarray  # [k] int
    logits: np.ndarray | None  # [k, vocab] float32 on the host

    def row(self, i: int) -> tuple[np.ndarray | None, int]:
        return (None if self.logits is None else self.logits[i]), int(self.argmax[i])


class Pending:
    """A launched step; `collect()` waits for it and returns its outputs. `argmax` is each logits
    row's argmax on the device where the step made one (a later step may take its tokens from it)."""

    def __init__(self, finish: Callable[[], list[RowsOut | None]], argmax=None):
        self._finish, self.argmax = finish, argmax
        self._out: list[RowsOut | None] | None = None

    def collect(self) -> list[RowsOut | None]:
        if self._out is None:
            self._out = self._finish()
        return self._out


class Runner:
    def __init__(self, loaded: LoadedModel, ops: Ops, n_pages: int, kv_type: str, max_pages_per_seq: int = 0,
                 v_type: str | None = None, parallel=None):
        """`parallel`: an engine.parallel.setup.TPSetup for a tensor-parallel model (`ops` is then its rank 0's)."""
        c = loaded.config
        self.ops, self.config = ops, c
        self.max_positions = n_pages * PAGE_SIZE
        if parallel is not None and parallel.plan.tp > 1:
            from engine.parallel.model import ShardedPagePool, TensorParallelModel

            self.model = TensorParallelModel(c, loaded.weights, parallel.plan, parallel.ops, parallel.coll,
                                             self.max_positions)
            self.pool = ShardedPagePool(parallel.ops, parallel.plan, c.n_layers, n_pages, c.head_dim, kv_type, v_type)
        else:
            self.model = model_class(c)(c, loaded.weights, ops, self.max_positions)
            self.pool = PagePool(ops, getattr(self.model, "n_kv_layers", c.n_layers), n_pages, c.n_kv_heads,
                                 c.head_dim, kv_type, v_type)
        self.recurrent = hasattr(self.model, "state_shape")
        self.graphs = None  # decode graphs of a tensor-parallel step: not built yet
        graphs = switch(os.environ, DECODE_GRAPHS, default=True)
        if hasattr(ops, "decode_graphs") and max_pages_per_seq and parallel is None and graphs:
            # decode steps (one token per sequence) replay a captured graph per batch bucket
            self.graphs = ops.decode_graphs(
                lambda ids, rows, lr: self.model.forward(ids, rows, self.pool.layers, lr),
                max_pages=max_pages_per_seq, recurrent=self.model.state_shape() if self.recurrent else None)

    def step(self, entries: list[StepEntry]) -> list[RowsOut | None]:
        """Runs one batch; returns per entry its logits rows (argmax, and the rows when asked) or None."""
        return self.launch(entries).collect()

    def launch(self, entries: list[StepEntry]) -> Pending:
        """Starts a step. On an asynchronous backend the device works while the caller does other
        things (the scheduler hands the previous step's tokens to the server); `collect` waits.
        Elsewhere the whole step runs in `collect`, so that work still comes first."""
        if not getattr(self.ops, "asynchronous", False):
            return Pending(lambda: self._run(entries)[0]())
        return Pending(*self._run(entries))

    def can_launch_ahead(self, entries: list[StepEntry]) -> bool:
        """Whether launch_ahead overlaps anything for these decode entries: on an asynchronous
        backend only a replayed graph takes its tokens on the device (elsewhere it would wait for
        the previous step); a synchronous one runs steps in collect() anyway. The scheduler parks no
        recurrent state while such a step is in flight (it would keep the dropped row's token:
        engine/scheduler/loop.py admits and restores only between steps with none). A replay
        updates the recurrent states in stream order, after the tokens it takes on the device
        (tests/test_cuda_hybrid_ahead.py compares 1 and 3 rows bit for bit with plain steps)."""
        if not getattr(self.ops, "asynchronous", False):
            return True
        return self._graphable(entries)

    def launch_ahead(self, prev: Pending, entries: list[StepEntry]) -> Pending:
        """Starts a decode step whose entry i takes as its token the argmax of `prev`'s row i (the
        entries' own tokens are placeholders), before `prev`'s tokens reach the host."""

        def with_tokens() -> list[StepEntry]:
            out = prev.collect()
            return [replace(e, tokens=[int(r.argmax[-1])]) for e, r in zip(entries, out, strict=True)]

        if getattr(self.ops, "asynchronous", False) and prev.argmax is not None and self._graphable(entries):
            return Pending(*self._graph_step(entries, prev.argmax))
        return Pending(lambda: self._run(with_tokens())[0]())  # runs once `prev` is read

    def _run(self, entries: list[StepEntry]) -> tuple[Callable[[], list[RowsOut | None]], object]:
        """Issues the step's device work; returns a function that waits for it and reads the
        results, and the device argmax of the step's logits rows."""
        if self._graphable(entries):
            return self._graph_step(entries)
        tokens, positions, seq, slots, logit_rows = [], [], [], [], []
        width = max(len(e.pages) for e in entries)
        tables = np.zeros((len(entries), width), dtype=np.int32)
        spans = []
        for i, e in enumerate(entries):
            n = len(e.tokens)
            if pages_for(e.start + n) > len(e.pages):
                raise ValueError(f"entry {i}: {e.start + n} positions need more than {len(e.pages)} pages")
            tables[i, : len(e.pages)] = e.pages
            pos = np.arange(e.start, e.start + n, dtype=np.int64)
            base = len(tokens)
            tokens.extend(e.tokens)
            positions.append(pos)
            seq.append(np.full(n, i, dtype=np.int32))
            slots.append(np.asarray(e.pages, dtype=np.int64)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE)
            first = len(logit_rows)
            if e.logits == "all":
                logit_rows.extend(range(base, base + n))
            elif e.logits == "last":
                logit_rows.append(base + n - 1)
            spans.append((first, len(logit_rows)))
        ops = self.ops
        rows = PagedRows(
            positions=ops.tensor(np.concatenate(positions).astype(np.int32)),
            seq=ops.tensor(np.concatenate(seq)),
            block_tables=ops.tensor(tables),
            slots=ops.tensor(np.concatenate(slots)),
        )
        if self.recurrent:
            rows.recurrent = self._recurrent_rows(entries)
        ids = ops.tensor(np.asarray(tokens, dtype=np.int32))
        if not logit_rows:
            self.model.forward(ids, rows, self.pool.layers, ops.tensor(np.zeros(0, dtype=np.int64)))
            return (lambda: [None] * len(entries)), None
        logits = self.model.forward(ids, rows, self.pool.layers, ops.tensor(np.asarray(logit_rows, dtype=np.int64)))
        if self.recurrent:
            self._hand_snapshots(entries, rows.recurrent)
        return self._outputs(entries, logits, spans)

    # --- hybrid models' recurrent state
    def new_state(self):
        """A zeroed recurrent state for one sequence (hybrid models)."""
        return self.ops.state_alloc(*self.model.state_shape())

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state (0 without recurrent layers)."""
        if not self.recurrent:
            return 0
        spec = self.model.spec  # the count memory planning uses (engine.launch.memory_need)
        return spec.n_linear * spec.deltanet.state_bytes()

    def _recurrent_rows(self, entries: list[StepEntry]) -> RecurrentRows:
        bounds, at = [], 0
        for e in entries:
            if e.state is None:
                raise ValueError("a hybrid model's step entry needs its sequence's recurrent state")
            bounds.append((at, at + len(e.tokens)))
            at += len(e.tokens)
        return RecurrentRows(bounds, [e.start for e in entries], [e.state for e in entries],
                             [e.prompt for e in entries], [e.snap if e.prompt else () for e in entries])

    def _hand_snapshots(self, entries: list[StepEntry], rec: RecurrentRows) -> None:
        """A snapshot is kept only when every recurrent layer took it (a chunk ended there)."""
        whole = 2 * self.model.state_shape()[0]
        for (i, pos), data in rec.taken.items():
            if len(data) == whole:
                entries[i].snapshots[pos] = data

    def _graphable(self, entries: list[StepEntry]) -> bool:
        """Decode rows and speculative verify rows (logits for every token) fit the decode graphs."""
        g = self.graphs
        if self.recurrent and any(e.prompt or len(e.tokens) != 1 for e in entries):
            return False  # a recurrent state takes prompt pieces and several tokens uncaptured
        return (g is not None and sum(len(e.tokens) for e in entries) <= g.max_batch
                and all((e.logits == "all" or len(e.tokens) == 1 and e.logits == "last") and len(e.pages) <= g.width
                        for e in entries))

    def _graph_step(self, entries: list[StepEntry], ids_from=None):
        # Each row gets its own copy of its sequence's page table, so a verify row sees the rows
        # before it in the same step exactly as a decode row would see them in later steps.
        n = sum(len(e.tokens) for e in entries)
        tables = np.zeros((n, max(len(e.pages) for e in entries)), np.int32)
        tokens, positions, slots, spans = [], [], [], []
        for e in entries:
            spans.append((len(tokens), len(tokens) + len(e.tokens)))
            for j, tok in enumerate(e.tokens):
                p = e.start + j
                tables[len(tokens), : len(e.pages)] = e.pages
                tokens.append(tok)
                positions.append(p)
                slots.append(e.pages[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE)
        more = {"states": [e.state for e in entries]} if self.recurrent else {}
        logits = self.graphs(tokens, positions, tables, slots, ids_from=ids_from, **more)
        return self._outputs(entries, logits, spans, getattr(self.graphs, "last_argmax", None))

    def _outputs(self, entries: list[StepEntry], logits, spans, argmax=None):
        """One device argmax for all rows (the replay's own when it made one) and host copies of
        only the rows whose entries need them, both started now (the next step may overwrite the
        device buffers); the returned function waits for them. Also returns the device argmax."""
        ops = self.ops
        argmax = ops.argmax(logits) if argmax is None else argmax
        wanted = [r for e, (a, b) in zip(entries, spans, strict=True) if e.full_rows for r in range(a, b)]
        picked = ops.to_host_async(logits[ops.tensor(np.asarray(wanted, dtype=np.int64))]) if wanted else None
        am = ops.to_host_async(argmax)
        return (lambda: self._read(entries, spans, am(), None if picked is None else picked())), argmax

    @staticmethod
    def _read(entries: list[StepEntry], spans, am: np.ndarray, host: np.ndarray | None) -> list[RowsOut | None]:
        out, at = [], 0
        for e, (a, b) in zip(entries, spans, strict=True):
            if b == a:
                out.append(None)
                continue
            rows = None
            if e.full_rows:
                rows, at = host[at : at + b - a], at + b - a
            out.append(RowsOut(am[a:b], rows))
        return out


def make_ops(device: str, exact: bool, threads: int = 1) -> Ops:
    if device == "cpu":
        from lockstep_kernels.cpu.ops import CpuOps

        return CpuOps(exact=exact, threads=threads)
    from lockstep_kernels.cuda.ops import CudaOps  # imported only here: CuPy is optional

    return CudaOps(exact=exact)


def prompt_logits(loaded: LoadedModel, tokens: list[int], exact: bool = False, kv_type: str = "f32",
                  chunk: int | None = None) -> np.ndarray:
    """Float32 logits of every prompt position, computed on the CPU (the numerical reference)."""
    n_pages = max(1, pages_for(len(tokens)))
    runner = Runner(loaded, make_ops("cpu", exact), n_pages, kv_type)
    pages = runner.pool.alloc(n_pages)
    state = runner.new_state() if runner.recurrent else None
    step = chunk or len(tokens)
    out = [runner.step([StepEntry(pages, tokens[i : i + step], i, "all", state=state, prompt=True)])[0].logits
           for i in range(0, len(tokens), step)]
    return np.concatenate(out)
