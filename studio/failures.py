"""Classify why an engine child failed, from its output and exit status.

The engine prints one line naming the failure; that line decides. The exit code only decides when
no such line is found (output lost or truncated).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "exact_refusal", "out_of_memory", "no_cuda", "bad_model", "port_in_use", "bad_flags", "crash",
    "timeout",
]

EXIT_CODES: dict[int, Kind] = {
    2: "bad_flags",
    3: "exact_refusal",
    4: "bad_model",
    5: "out_of_memory",
    6: "no_cuda",
    8: "port_in_use",
}

_PATTERNS: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    ("exact_refusal", re.compile(r"^exact concurrency: (?P<detail>.+)$")),
    ("out_of_memory", re.compile(r"^error: out of memory: (?P<detail>.+)$")),
    ("no_cuda", re.compile(r"^error: no usable CUDA device: (?P<detail>.+)$")),
    ("bad_model", re.compile(r"^error: model load failed: (?P<detail>.+)$")),
    ("port_in_use", re.compile(r"^error: cannot bind (?P<detail>.+)$")),
)
# The engine refuses a command line it cannot honour with exit 2 and `error: <why>` (argparse's convention).
_BAD_FLAGS = re.compile(r"^error: (?P<detail>.+)$")
# A line must be short to be the engine's one-line verdict rather than, say, a traceback's repr.
_MAX_VERDICT_CHARS = 2000


@dataclass(frozen=True)
class Failure:
    kind: Kind
    exit_code: int | None
    line: str | None  # the engine's own line, when found
    detail: str

    @property
    def fix(self) -> str | None:
        """For an exact refusal, the flag the engine says fixes it ("-ctk f16 (or bf16)")."""
        if self.kind != "exact_refusal" or self.line is None:
            return None
        m = re.search(r"; use (.+)$", self.line)
        return m.group(1) if m else None

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "exit_code": self.exit_code, "line": self.line, "detail": self.detail}


def classify(output: str, exit_code: int | None) -> Failure:
    """`output`: what the child wrote (stderr, or stdout and stderr together); `exit_code`: as Popen reports it."""
    for raw in reversed(output.splitlines()):
        line = raw.strip()
        if not line or len(line) > _MAX_VERDICT_CHARS:
            continue
        for kind, pattern in _PATTERNS:
            m = pattern.match(line)
            if m:
                return Failure(kind, exit_code, line, m.group("detail"))
    if exit_code == 2:
        for raw in reversed(output.splitlines()):
            m = _BAD_FLAGS.match(raw.strip())
            if m:
                return Failure("bad_flags", exit_code, raw.strip(), m.group("detail"))
    if exit_code in EXIT_CODES:
        kind = EXIT_CODES[exit_code]
        return Failure(kind, exit_code, None, f"exit code {exit_code} ({kind}) without the engine's message")
    return Failure("crash", exit_code, _last_line(output), _describe_exit(exit_code, output))


def _last_line(output: str) -> str | None:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1][:_MAX_VERDICT_CHARS] if lines else None


def _describe_exit(exit_code: int | None, output: str) -> str:
    if exit_code is None:
        what = "the engine is still running"
    elif exit_code < 0:
        try:
            what = f"the engine was killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            what = f"the engine was killed by signal {-exit_code}"
    else:
        what = f"the engine exited with code {exit_code}"
    last = _last_line(output)
    return f"{what}: {last}" if last else what
