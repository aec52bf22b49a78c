"""GBNF grammars (llama.cpp's format): parsed into rules, then run as a set of parse stacks over characters.

A stack is a tuple of frames (alternative id, position of its next element), the top frame last; an empty
stack means the grammar is complete. Repetitions and groups become rules of their own, as llama.cpp
expands them.
"""

from __future__ import annotations

import re
from functools import lru_cache

MAX_RULES = 4096
MAX_REPEAT = 256


class GrammarError(ValueError):
    pass


_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+|\#[^\n]*)
  | (?P<define>::=)
  | (?P<name>[A-Za-z][A-Za-z0-9_-]*)
  | (?P<lit>"(?:[^"\\]|\\.)*")
  | (?P<cls>\[(?:[^\]\\]|\\.)*\])
  | (?P<rep>\{\s*\d+\s*(?:,\s*\d*\s*)?\})
  | (?P<op>[()|*+?.])
""", re.VERBOSE)
_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "]": "]", "[": "[", "-": "-", "/": "/", "^": "^"}


def _unescape(text: str) -> list[str]:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1: i + 2]
        if nxt in ("x", "u", "U"):
            n = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = text[i + 2: i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise GrammarError(f"bad escape \\{nxt}{digits}")
            out.append(chr(int(digits, 16)))
            i += 2 + n
        elif nxt in _ESC:
            out.append(_ESC[nxt])
            i += 2
        else:
            raise GrammarError(f"unknown escape \\{nxt}")
    return out


def _char_class(text: str) -> tuple:
    body = text[1:-1]
    negate = body.startswith("^")
    chars = _unescape(body[1:] if negate else body)
    ranges, i = [], 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == "-":
            ranges.append((chars[i], chars[i + 2]))
            i += 3
        else:
            ranges.append((chars[i], chars[i]))
            i += 1
    return ("char", tuple(ranges), negate)


ANY = ("char", (("\x00", "\U0010ffff"),), False)


class Grammar:
    def __init__(self, source: str, root: str = "root"):
        self.alts: list[tuple] = []  # alternative id -> tuple of elements
        self.rules: dict[str, list[int]] = {}  # rule name -> its alternatives' ids
        self._n_gen = 0
        toks = self._lex(source)
        self._pos = 0
        self._toks = toks
        while self._pos < len(toks):
            kind, name = toks[self._pos]
            if kind != "name" or self._peek(1) != ("define", "::="):
                raise GrammarError(f"expected a rule 'name ::= ...' at {name!r}")
            self._pos += 2
            self._define(name, self._alternatives())
        if root not in self.rules:
            raise GrammarError(f"the grammar has no '{root}' rule")
        for alt in self.alts:
            for el in alt:
                if el[0] == "ref" and el[1] not in self.rules:
                    raise GrammarError(f"rule '{el[1]}' is used but not defined")
        self.root = root
        self._check_left_recursion()

    # --- parsing
    @staticmethod
    def _lex(source: str) -> list[tuple[str, str]]:
        out, i = [], 0
        while i < len(source):
            m = _TOKEN.match(source, i)
            if not m:
                raise GrammarError(f"cannot parse the grammar at {source[i:i + 20]!r}")
            i = m.end()
            if m.lastgroup != "ws":
                out.append((m.lastgroup, m.group()))
        return out

    def _peek(self, k: int = 0):
        j = self._pos + k
        return self._toks[j] if j < len(self._toks) else (None, None)

    def _define(self, name: str, alternatives: list[list]) -> None:
        if len(self.rules) >= MAX_RULES:
            raise GrammarError("the grammar has too many rules")
        ids = []
        for seq in alternatives:
            self.alts.append(tuple(seq))
            ids.append(len(self.alts) - 1)
        self.rules.setdefault(name, []).extend(ids)

    def _new_rule(self, alternatives: list[list]) -> tuple:
        self._n_gen += 1
        name = f"_g{self._n_gen}"
        self._define(name, alternatives)
        return ("ref", name)

    def _alternatives(self) -> list[list]:
        alts = [self._sequence()]
        while self._peek() == ("op", "|"):
            self._pos += 1
            alts.append(self._sequence())
        return alts

    def _sequence(self) -> list:
        seq: list = []
        while True:
            kind, text = self._peek()
            if kind is None or (kind == "op" and text in "|)") or (kind == "name" and self._peek(1)[0] == "define"):
                return seq
            items = self._primary()
            kind, text = self._peek()
            if kind == "op" and text in "*+?" or kind == "rep":
                self._pos += 1
                items = self._repeat(items, text)
            seq.extend(items)

    def _primary(self) -> list:
        kind, text = self._peek()
        self._pos += 1
        if kind == "lit":
            return [("char", ((c, c),), False) for c in _unescape(text[1:-1])]
        if kind == "cls":
            return [_char_class(text)]
        if kind == "name":
            return [("ref", text)]
        if (kind, text) == ("op", "."):
            return [ANY]
        if (kind, text) == ("op", "("):
            alts = self._alternatives()
            if self._peek() != ("op", ")"):
                raise GrammarError("a '(' is not closed")
            self._pos += 1
            return [self._new_rule(alts)]
        raise GrammarError(f"unexpected {text!r} in the grammar")

    def _repeat(self, items: list, op: str) -> list:
        if op == "*":
            lo, hi = 0, None
        elif op == "+":
            lo, hi = 1, None
        elif op == "?":
            lo, hi = 0, 1
        else:
            inner = op[1:-1].replace(" ", "")
            lo_s, _, hi_s = inner.partition(",")
            lo = int(lo_s)
            hi = lo if "," not in inner else (int(hi_s) if hi_s else None)
            if hi is not None and hi < lo or lo > MAX_REPEAT or (hi or 0) > MAX_REPEAT:
                raise GrammarError(f"bad repetition {op}")
        out = items * lo
        if hi is None:  # X* as R ::= X R | (nothing)
            self._n_gen += 1
            name = f"_g{self._n_gen}"
            self._define(name, [items + [("ref", name)], []])
            return out + [("ref", name)]
        tail: list = []
        for _ in range(hi - lo):  # nested optionals: (X (X ...)?)?
            tail = [self._new_rule([items + tail, []])]
        return out + tail

    def _check_left_recursion(self) -> None:
        def nullable_first(name: str, seen: tuple) -> None:
            if name in seen:
                raise GrammarError(f"rule '{name}' is left-recursive")
            for a in self.rules[name]:
                for el in self.alts[a]:
                    if el[0] == "char":
                        break
                    nullable_first(el[1], seen + (name,))
                    if not self._nullable(el[1], ()):
                        break

        for name in self.rules:
            nullable_first(name, ())

    def _nullable(self, name: str, seen: tuple) -> bool:
        if name in seen:
            return False
        return any(all(el[0] == "ref" and self._nullable(el[1], seen + (name,)) for el in self.alts[a])
                   for a in self.rules[name])

    # --- running
    def start(self) -> frozenset:
        out: set = set()
        for a in self.rules[self.root]:
            self._expand(((a, 0),), out)
        return frozenset(out)

    def _expand(self, stack: tuple, out: set) -> None:
        while stack:
            alt_id, pos = stack[-1]
            alt = self.alts[alt_id]
            if pos == len(alt):
                stack = stack[:-1]
                continue
            el = alt[pos]
            if el[0] == "char":
                out.add(stack)
                return
            parent = stack[:-1] + ((alt_id, pos + 1),)
            for child in self.rules[el[1]]:
                self._expand(parent + ((child, 0),), out)
            return
        out.add(())

    def step(self, stacks: frozenset, ch: str) -> frozenset:
        out: set = set()
        for stack in stacks:
            if not stack:
                continue
            alt_id, pos = stack[-1]
            _, ranges, negate = self.alts[alt_id][pos]
            if any(lo <= ch <= hi for lo, hi in ranges) != negate:
                self._expand(stack[:-1] + ((alt_id, pos + 1),), out)
        return frozenset(out)


@lru_cache(maxsize=32)
def compile_grammar(source: str) -> Grammar:
    return Grammar(source)
