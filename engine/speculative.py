"""N-gram drafts by prompt lookup: the sequence's latest n-gram matched against its own earlier tokens.

Drafts only change speed: the scheduler accepts a draft token only when it equals the token the
target model samples at that position with that position's random number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NGRAM_SIZES = (4, 3, 2)  # longest first: a longer match predicts the continuation better
MAX_BACKOFF = 16  # tokens decoded without drafts after drafts that kept failing


def lookup(tokens: list[int], k: int, window: int = 4096) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the latest n-gram."""
    if k <= 0 or len(tokens) < 2:
        return []
    hist = np.asarray(tokens[-window:], dtype=np.int64)
    for n in NGRAM_SIZES:
        if len(hist) <= n:
            continue
        tail = hist[-n:]
        # candidate starts whose n-gram equals the tail, excluding the tail itself
        starts = np.flatnonzero(hist[: len(hist) - n] == tail[0])
        for s in starts[::-1]:
            if np.array_equal(hist[s : s + n], tail):
                follow = hist[s + n : s + n + k]
                if follow.size:
                    return [int(t) for t in follow]
    return []


@dataclass
class DraftState:
    """Per sequence: the draft length adapts to the acceptance it sees, and drafts that fail
    outright back off (1, 3, 7, 15 tokens without drafts) until one is accepted again, so text the
    lookup cannot predict (sampled answers) pays little for the verify rows."""

    n_max: int
    length: int = 0
    drafted: int = 0
    accepted: int = 0
    backoff: int = 0
    skip: int = 0

    def __post_init__(self) -> None:
        self.length = self.n_max

    def wants_draft(self) -> bool:
        """Called once per decode step of the sequence."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def record(self, proposed: int, accepted: int) -> None:
        self.drafted += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.length = min(self.n_max, self.length + 1)
        else:
            self.length = max(1, accepted + 1)
        if accepted:
            self.backoff = 0
        elif proposed:
            self.backoff = min(MAX_BACKOFF, 2 * self.backoff + 1)
            self.skip = self.backoff
