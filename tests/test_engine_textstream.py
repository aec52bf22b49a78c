"""Incremental detokenization with stop strings: text is released only once it is final."""

import pytest

from engine.loader import load_model
from engine.textstream import TextStream


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_model(tiny_llama).tokenizer


def feed(tok, text, stops=None):
    stream = TextStream(tok, stops)
    ids = tok.encode(text, add_special=False)
    parts, released = [], []
    for t in ids:
        r = stream.push(t)
        parts.append(r.text)
        released += r.tokens
        if r.stop:
            return stream, parts, released, r.stop
    r = stream.finish()
    parts.append(r.text)
    released += r.tokens
    return stream, parts, released, r.stop


def test_plain_text_round_trips_token_by_token(tok):
    text = "Exact concurrency: größe, café, 東京 🙂 def fibonacci(n):"
    stream, parts, released, stop = feed(tok, text)
    assert "".join(parts) == text
    assert stop is None
    assert released == list(range(len(stream.ids)))  # every token goes out exactly once, in order


def test_multibyte_character_is_never_split(tok):
    text = "東京🙂"
    ids = tok.encode(text, add_special=False)
    assert len(ids) > 2  # the tiny vocabulary spells these characters in bytes
    _, parts, _, _ = feed(tok, text)
    assert all("\ufffd" not in p for p in parts)
    assert "".join(parts) == text


def test_stop_string_spanning_tokens_is_cut_and_not_released(tok):
    text = "The quick brown fox jumps over the lazy dog."
    stream, parts, released, stop = feed(tok, text, ["fox jumps"])
    assert stop == "fox jumps"
    assert "".join(parts) == "The quick brown "
    assert stream.released_text == "The quick brown "
    # tokens that start after the stop string's start are not released
    assert all(stream.starts[i] < len("The quick brown ") for i in released)


def test_text_that_may_start_a_stop_string_is_held_back(tok):
    stream = TextStream(tok, ["Hello world!"])
    for t in tok.encode("say Hello wor", add_special=False):
        stream.push(t)
    assert stream.released_text == "say "  # "Hello wor" could still become the stop string
    assert stream.finish().text == "Hello wor"  # at the end it was not one: released after all


def test_earliest_of_several_stop_strings_wins(tok):
    _, parts, _, stop = feed(tok, "for i in range(10):\n    print(i)", ["print", "range"])
    assert stop == "range"
    assert "".join(parts) == "for i in "


def test_incomplete_utf8_at_the_end_becomes_a_replacement_character(tok):
    ids = tok.encode("東", add_special=False)
    stream = TextStream(tok)
    for t in ids[:-1]:
        assert stream.push(t).text == ""
    out = stream.finish().text
    assert out and set(out) == {"\ufffd"}
