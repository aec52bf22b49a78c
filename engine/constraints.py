"""Constrained decoding: a request's grammar masks the logits to the tokens its text may continue with.

The mask is a function of the grammar and the tokens this sequence generated so far, nothing else, so a
constrained request stays exact. Tokens are walked as a trie of their texts, so one step tries each text
prefix once; end-of-generation tokens are allowed exactly when the grammar is complete.
"""

from __future__ import annotations

import weakref

import numpy as np

from engine.grammar import compile_grammar

_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Seq -> its grammar stacks


class _Trie:
    __slots__ = ("ids", "kids")

    def __init__(self):
        self.ids: list[int] = []
        self.kids: dict[str, _Trie] = {}


_tries: dict[int, _Trie] = {}  # id(tokenizer) -> its tokens' trie (one tokenizer per engine)


def _trie(tokenizer) -> _Trie:
    if id(tokenizer) in _tries:
        return _tries[id(tokenizer)]
    root = _tries[id(tokenizer)] = _Trie()
    special = set(tokenizer.tok.get_added_tokens_decoder()) if hasattr(tokenizer.tok, "get_added_tokens_decoder") \
        else set()
    for i in range(tokenizer.vocab_size):
        if i in special or tokenizer.is_eog(i):
            continue
        text = tokenizer.piece(i)
        if not text or "\ufffd" in text:  # part of a character: the grammar works on whole characters
            continue
        node = root
        for ch in text:
            node = node.kids.setdefault(ch, _Trie())
        node.ids.append(i)
    return root


def _stacks(seq, grammar) -> frozenset:
    state = _states.get(seq)
    if state is None:
        state = _states[seq] = grammar.start()
    return state


def allowed(seq, tokenizer) -> list[int]:
    """Token ids the grammar lets this sequence write next (EOG ids when it is complete)."""
    grammar = compile_grammar(seq.params.grammar)
    stacks = _stacks(seq, grammar)
    out: list[int] = []
    memo: dict = {}

    def walk(node: _Trie, st: frozenset) -> None:
        for ch, kid in node.kids.items():
            key = (st, ch)
            nxt = memo.get(key)
            if nxt is None:
                nxt = memo[key] = grammar.step(st, ch)
            if nxt:
                out.extend(kid.ids)
                walk(kid, nxt)

    walk(_trie(tokenizer), stacks)
    if () in stacks:
        out.extend(sorted(tokenizer.eos_ids | tokenizer.extra_stop_ids))
    return out


def mask(seq, tokenizer, logits: np.ndarray) -> np.ndarray | None:
    """The logits with every disallowed token at -inf; None when the grammar allows nothing (the sequence
    must end)."""
    ids = allowed(seq, tokenizer)
    if not ids:
        return None
    row = np.asarray(logits, dtype=np.float64)
    out = np.full_like(row, -np.inf)
    sel = np.asarray(ids, dtype=np.int64)
    out[sel] = row[sel]
    return out


def advance(seq, tokenizer, token: int) -> None:
    grammar = compile_grammar(seq.params.grammar)
    st = _stacks(seq, grammar)
    for ch in tokenizer.piece(token):
        st = grammar.step(st, ch)
    _states[seq] = st
