"""Token ids -> text as they arrive, with text-level stop strings.

Text is released only when it is final: a token that ends inside a multi-byte UTF-8 character waits
for the rest of it, and text that could be the start of a stop string waits until it is known not to
be one. Each token is released together with the text it completed, so streamed logprobs line up with
streamed text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.tokenizer import TextTokenizer

REPLACEMENT = "\ufffd"


@dataclass
class Released:
    text: str = ""
    tokens: list[int] = field(default_factory=list)  # indices into TextStream.ids
    stop: str | None = None  # the stop string that matched; the stream has ended


class TextStream:
    def __init__(self, tokenizer: TextTokenizer, stops: list[str] | None = None):
        self.tok = tokenizer
        self.stops = [s for s in stops or [] if s]
        self.ids: list[int] = []
        self.text = ""  # decoded so far; may run past what was released
        self.starts: list[int] = []  # per decoded token: where its text starts in self.text
        self.sent = 0  # characters of self.text released
        self.sent_tokens = 0
        self.stopped: str | None = None
        # Decoding a window (prefix context + new ids) rather than everything keeps each step O(1);
        # the prefix is kept so decoders that drop a leading space at the start of a text stay right.
        self._prefix = 0
        self._read = 0

    def push(self, token: int) -> Released:
        if self.stopped is not None:
            return Released(stop=self.stopped)
        self.ids.append(token)
        delta = self._decode_new(final=False)
        if delta is None:
            return Released()
        return self._release(final=False)

    def finish(self) -> Released:
        """The sequence ended: release what was held back (an unfinished character becomes U+FFFD)."""
        if self.stopped is not None:
            return Released(stop=self.stopped)
        if self._read < len(self.ids):
            self._decode_new(final=True)
        return self._release(final=True)

    @property
    def released_text(self) -> str:
        return self.text[: self.sent]

    def _decode_new(self, final: bool) -> str | None:
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read], skip_special=False)
        full = self.tok.decode(self.ids[self._prefix :], skip_special=False)
        if not final and (len(full) <= len(prefix_text) or full.endswith(REPLACEMENT)):
            return None  # inside a multi-byte character (or no visible text yet)
        delta = full[len(prefix_text) :]
        new_tokens = len(self.ids) - self._read
        # tokens decoded together share the delta; the first one carries its start
        self.starts.extend([len(self.text)] * new_tokens)
        self.text += delta
        self._prefix, self._read = self._read, len(self.ids)
        return delta

    def _release(self, final: bool) -> Released:
        end = len(self.text)
        hit = self._find_stop()
        if hit is not None:
            end, self.stopped = hit
        elif not final:
            end -= self._held_back()
        out = Released(text=self.text[self.sent : end], stop=self.stopped)
        self.sent = max(self.sent, end)
        # A token goes out with the text it completed; at a stop, every token that starts before it.
        while self.sent_tokens < len(self.starts):
            i = self.sent_tokens
            token_end = self.starts[i + 1] if i + 1 < len(self.starts) else len(self.text)
            if self.stopped is not None and self.starts[i] >= end:
                break
            if self.stopped is None and not final and token_end > end:
                break
            out.tokens.append(i)
            self.sent_tokens += 1
        return out

    def _find_stop(self) -> tuple[int, str] | None:
        best = None
        for s in self.stops:
            pos = self.text.find(s, max(0, self.sent - len(s) + 1))
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        return best

    def _held_back(self) -> int:
        """Length of the longest unreleased tail that is a proper prefix of a stop string."""
        tail = self.text[self.sent :]
        held = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(tail)), held, -1):
                if tail.endswith(s[:k]):
                    held = k
                    break
        return held
