"""The engine's exit codes and one-line verdicts; the studio classifies a failed child by these."""

from __future__ import annotations

BAD_FLAGS = 2
EXACT_REFUSED = 3
MODEL_LOAD = 4
OUT_OF_MEMORY = 5
NO_CUDA = 6
CANNOT_BIND = 8


class Fatal(Exception):
    """Ends the engine with `code` after printing `line` (already in the studio's exact wording)."""

    def __init__(self, code: int, line: str):
        super().__init__(line)
        self.code, self.line = code, line


def bad_flag(message: str) -> Fatal:
    return Fatal(BAD_FLAGS, f"error: {message}")


def out_of_memory(need_bytes: int, free_bytes: int) -> Fatal:
    gib = 1 << 30
    return Fatal(OUT_OF_MEMORY, f"error: out of memory: needs {need_bytes / gib:.2f} GiB, "
                                f"{free_bytes / gib:.2f} GiB free")
