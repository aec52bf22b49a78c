"""Prompt-lookup drafts and their adaptive length and backoff (pure functions; the scheduler tests
check that drafts never change the output)."""

from engine.speculative import MAX_BACKOFF, DraftState, lookup


def test_lookup_continues_the_latest_earlier_match_longest_ngram_first():
    tokens = [1, 2, 3, 4, 9, 9, 1, 2, 3, 4, 7, 8, 5, 1, 2, 3, 4]
    assert lookup(tokens, 2) == [7, 8]  # the most recent earlier "1 2 3 4" is followed by 7 8
    assert lookup([5, 6, 5], 3) == []  # the only match of "5" would be followed by the tail itself
    assert lookup([1, 2, 1, 2], 4) == [1, 2]
    assert lookup([1, 2, 3], 0) == [] and lookup([1, 2, 3], 3) == []


def test_length_grows_on_full_acceptance_and_shrinks_to_what_was_accepted():
    s = DraftState(4)
    s.record(4, 4)
    assert s.length == 4
    s.record(4, 1)
    assert s.length == 2
    s.record(2, 2)
    assert s.length == 3
    assert (s.drafted, s.accepted) == (10, 7)


def test_failed_drafts_back_off_exponentially_until_one_is_accepted():
    s = DraftState(1)
    skipped = []
    for _ in range(6):
        assert s.wants_draft()
        s.record(1, 0)
        n = 0
        while not s.wants_draft():
            n += 1
        skipped.append(n)
    assert skipped == [1, 3, 7, 15, MAX_BACKOFF, MAX_BACKOFF]
    s.record(1, 1)  # an accepted draft ends the backoff
    assert s.wants_draft() and s.backoff == 0
    s.record(0, 0)  # no draft proposed (no match): nothing to back off from
    assert s.wants_draft()
