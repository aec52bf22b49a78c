"""-md / --model-draft: a smaller model's greedy continuation as the speculative draft.

Drafts only change speed: the scheduler keeps a draft token only when it equals the token the target model
samples there (Emitter.verify), so any draft model, however poor, gives the same answers. The draft model's
KV sits in a pool of its own, one page set per slot; the tokens those pages hold are remembered, and a draft
first computes what the sequence holds beyond them (after a rejection, from the first token that differs).
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelLoadError
from engine.exits import MODEL_LOAD, Fatal, bad_flag
from engine.loader import check_regular
from engine.runner import Runner, StepEntry
from engine.sequences import common_prefix
from lockstep_kernels.base import PAGE_SIZE


def check_path(path: str) -> None:
    """Before the model loads (which may take minutes), so that a wrong -md fails at once, named as the draft's."""
    p = Path(path)
    try:
        if not p.exists():
            raise ModelLoadError(f"{p}: no such file or directory")
        check_regular(p)
    except ModelLoadError as e:
        raise Fatal(MODEL_LOAD, f"error: model load failed: -md {e}") from None


def check_vocab(target, draft, path: str) -> None:
    """The draft's token ids must mean the target's: the same vocabulary, entry for entry."""
    if target.vocab_size != draft.vocab_size or target.tok.get_vocab() != draft.tok.get_vocab():
        raise bad_flag(f"-md {path}: the draft model's vocabulary differs from the model's ({draft.vocab_size} "
                       f"vs {target.vocab_size} tokens, or other token texts); a draft model needs the same "
                       "tokenizer")


def load_draft(opts, target, backend: str, per_slot: int, threads: int) -> DraftModel:
    """The -md model with a pool of `per_slot` pages for each of the --parallel slots, on the target's backend
    (its KV types too); its arithmetic needs no exact mode, since a draft never decides a token."""
    from engine.launch import build_runner, read_model

    loaded = read_model(opts.model_draft, None)
    check_vocab(target.tokenizer, loaded.tokenizer, opts.model_draft)
    runner = build_runner(loaded, backend, False, opts.parallel * per_slot, opts.cache_type_k, 0, opts.ubatch_size,
                          opts.cache_type_v, n_seqs=opts.parallel, threads=threads, progress=False)
    return DraftModel(runner, opts.parallel, per_slot, opts.ubatch_size)


class DraftModel:
    def __init__(self, runner: Runner, n_slots: int, per_slot: int, ubatch: int):
        if runner.recurrent:
            raise bad_flag("-md: a draft model with a recurrent state is not supported (a rejected draft would "
                           "need the state rolled back)")
        self.runner, self.ubatch = runner, max(1, ubatch)
        self.pages = [runner.pool.alloc(per_slot) for _ in range(n_slots)]
        self.held: list[list[int]] = [[] for _ in range(n_slots)]  # tokens whose KV each slot's pages hold

    def propose(self, slot: int, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens the draft model writes greedily after `tokens` (the slot's sequence)."""
        pages, limit = self.pages[slot], len(self.pages[slot]) * PAGE_SIZE
        k = min(k, limit - len(tokens))
        if k <= 0:
            return []
        start = min(common_prefix(self.held[slot], tokens), len(tokens) - 1)
        self.held[slot] = tokens[:start]
        while len(tokens) - start > self.ubatch:  # what the sequence added since, in pieces of -ub
            self.runner.step([StepEntry(pages, tokens[start:start + self.ubatch], start, "none", False)])
            start += self.ubatch
        feed, out = tokens[start:], []
        for _ in range(k):
            row = self.runner.step([StepEntry(pages, feed, start, "last", False)])[0]
            start += len(feed)
            feed = [int(row.argmax[-1])]
            out.append(feed[0])
        self.held[slot] = tokens + out[:-1]  # the last draft token's KV is not computed
        return out
