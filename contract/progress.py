"""The engine's load-progress lines, written on its log and read back by the studio.

One line per step, `load progress: phase=weights tensors=12/50 bytes=1048576/4194304`: the phase
(`read` the model file; `kernels` compiled or loaded for the backend, which a first load compiles;
`weights` read and stored tensor by tensor; `warmup` before serving), and for `weights` the tensors
and bytes done out of the model's total. The studio finds the latest such line in the running
attempt's log; a line it cannot read is not progress (never an error).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "load progress:"
PHASES = ("read", "kernels", "weights", "warmup")
_LINE = re.compile(re.escape(PREFIX) + r" phase=(\w+)(?: tensors=(\d+)/(\d+) bytes=(\d+)/(\d+))?\s*$")


@dataclass(frozen=True)
class LoadStep:
    phase: str
    tensors: int = 0
    n_tensors: int = 0
    bytes: int = 0
    n_bytes: int = 0

    def line(self) -> str:
        if self.phase != "weights":
            return f"{PREFIX} phase={self.phase}"
        return f"{PREFIX} phase=weights tensors={self.tensors}/{self.n_tensors} bytes={self.bytes}/{self.n_bytes}"

    def as_dict(self) -> dict[str, int | str]:
        return {"phase": self.phase, "tensors": self.tensors, "n_tensors": self.n_tensors, "bytes": self.bytes,
                "n_bytes": self.n_bytes}


def parse(line: str) -> LoadStep | None:
    """The step a log line reports (the logger's timestamp and name before it allowed), else None."""
    at = line.find(PREFIX)
    match = _LINE.match(line[at:].rstrip()) if at >= 0 else None
    if match is None or match[1] not in PHASES:
        return None
    if match[1] != "weights":
        return LoadStep(match[1])
    if match[2] is None:
        return None
    return LoadStep("weights", *(int(g) for g in match.groups()[1:]))


def latest(text: str) -> LoadStep | None:
    """The last step in a log's text."""
    for line in reversed(text.splitlines()):
        if PREFIX in line and (step := parse(line)) is not None:
            return step
    return None
