"""NGram's pool on small literal cases: what it keeps, what it drafts (TensorRT-LLM's NGramPoolManager
rules, tensorrt_llm/_torch/speculative/ngram.py)."""

from __future__ import annotations

import pytest

from pipeline.runtime.spec_decode.ngram import NGramPool


def pool_of(text: list[int], k: int = 3, m: int = 2, keep_all: bool = True, use_oldest: bool = True) -> NGramPool:
    pool = NGramPool(k, m, keep_all, use_oldest)
    pool.scan(text, since=0)
    return pool


def test_the_longest_tail_that_recurs_is_drafted():
    # "1 2" occurred before, followed by "3 4 5": K = 3 tokens of it
    assert pool_of([1, 2, 3, 4, 5, 1, 2]).propose([1, 2, 3, 4, 5, 1, 2], room=10) == [3, 4, 5]
    # tail "9 2": not a pattern; "2" alone is, followed by "3 4 5"
    assert pool_of([1, 2, 3, 4, 5]).propose([1, 2, 3, 4, 5, 9, 2], room=10) == [3, 4, 5]
    # no tail recurs: no drafts (a plain step)
    assert pool_of([1, 2, 3]).propose([7, 8], room=10) == []


def test_drafts_never_exceed_the_room_left():
    pool = pool_of([1, 2, 3, 4, 5, 1, 2])
    assert pool.propose([1, 2], room=1) == [3]
    assert pool.propose([1, 2], room=0) == []


def test_keep_all_keeps_every_match_and_use_oldest_picks_one():
    text = [1, 2, 3, 1, 4, 1]  # "1" is followed by "2 3 1" and later by "4 1"
    assert pool_of(text, m=1).matches[(1,)] == [(2, 3, 1), (4, 1)]
    assert pool_of(text, m=1).propose(text, room=10) == [2, 3, 1]  # the oldest
    assert pool_of(text, m=1, use_oldest=False).propose(text, room=10) == [4, 1]  # the newest
    assert pool_of(text, m=1).propose([1], room=10) == []  # a one-token text has no tail to look up


def test_a_longer_match_drops_the_shorter_ones_kept():
    pool = NGramPool(3, 1)
    pool.scan([5, 6], since=0)  # "5" -> "6"
    pool.scan([5, 6, 5, 7, 8, 9], since=0)  # "5" -> "7 8 9" is longer: "6" goes
    assert pool.matches[(5,)] == [(6, 5, 7), (7, 8, 9)]
    pool = NGramPool(3, 1, keep_all=False)
    pool.scan([5, 6], since=0)
    pool.scan([5, 6, 9], since=0)
    assert pool.matches[(5,)] == [(6, 9)]  # keep_all off: a longer match replaces the one kept
    # ... but one no longer is added beside it, as TensorRT-LLM's pool does (its docstring says one)
    pool.scan([5, 6, 9, 5, 7, 8], since=0)
    assert pool.matches[(5,)] == [(6, 9, 5), (7, 8)]


@pytest.mark.parametrize(("length", "k", "m", "since"), [(10, 3, 2, 6), (3, 3, 2, 0), (20, 4, 3, 14)])
def test_the_next_scan_starts_where_pairs_may_still_grow(length, k, m, since):
    # pairs starting within K + M - 1 tokens of the end may still get longer matches
    assert NGramPool(k, m).scan(list(range(length)), since=0) == since
