"""Load progress on the log, as contract.progress lines the studio reads back while it waits for /health.

The model classes take each tensor by name from the weights mapping and store it for the backend
(a float32 copy on the CPU, an upload on CUDA) before they take the next: counting those takes
follows the slow part of a load without touching the model code or the backends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from contract.progress import LoadStep
from lockstep_kernels.weights import Weight

log = logging.getLogger("engine.load")

EVERY_S = 0.5  # the most one line per half second: a big load writes tens of lines, not thousands


def phase(name: str) -> None:
    log.info(LoadStep(name).line())


class CountedWeights(dict[str, Weight]):
    """The model's weights, logging the tensors and bytes taken so far (each name counted once).

    Only `weights[name]` counts: `in`, `.get()` and `.values()` are how the models check and plan,
    not how they take a tensor to store it."""

    def __init__(self, weights: dict[str, Weight], clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(weights)
        self._taken: set[str] = set()
        self._bytes = 0
        self._n_bytes = sum(w.nbytes for w in weights.values())
        self._clock = clock
        self._last = clock()
        self._report()

    def __getitem__(self, name: str) -> Weight:
        w = super().__getitem__(name)
        if name not in self._taken:
            self._taken.add(name)
            self._bytes += w.nbytes
            if self._clock() - self._last >= EVERY_S:
                self._report()
        return w

    def finish(self) -> None:
        """Every tensor is stored (a file's tensors the model does not use count as done)."""
        self._report(done=True)

    def _report(self, done: bool = False) -> None:
        self._last = self._clock()
        n = len(self)
        step = LoadStep("weights", n if done else len(self._taken), n, self._n_bytes if done else self._bytes,
                        self._n_bytes)
        log.info(step.line())
