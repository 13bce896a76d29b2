"""CountCache (bounded by characters, least recently used out) and the TokenCounter that
counts a conversation's history once."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from gateway.request.tokens.count_cache import ENTRY, CountCache
from gateway.request.tokens.limits import TokenCounter
from tests.unit.gateway.request.tokens.test_gateway_limits import CHATML, Recording, tokenizer

__all__ = ["tokenizer"]  # the module-scoped fixture, shared


def test_the_least_recently_used_text_goes_first_and_the_characters_stay_bounded() -> None:
    each = 10 + ENTRY  # what a 10-character text costs the budget
    cache = CountCache(max_chars=16 * each)
    for text in ("a" * 10, "b" * 10, "c" * 10):
        cache.put(text, False, len(text))
    assert cache.get("a" * 10, False) == 10  # a is now used more recently than c
    for i in range(14):  # 17 entries: over the budget, the least recent goes
        cache.put(f"{i:02d}" * 5, False, 1)
    assert cache.chars == 16 * each and len(cache) == 16
    assert cache.get("b" * 10, False) is None
    cache.put("d" * 10, False, 10)  # the next goes: c, not a
    assert cache.get("c" * 10, False) is None
    assert cache.get("a" * 10, False) == 10
    assert cache.get("d" * 10, False) == 10 and cache.chars == 16 * each


def test_a_text_over_a_sixteenth_of_the_budget_is_not_kept() -> None:
    cache = CountCache(max_chars=16 * (10 + ENTRY))
    cache.put("x" * 11, False, 3)
    cache.put("y" * 10, False, 3)
    assert (cache.get("x" * 11, False), cache.get("y" * 10, False)) == (None, 3)


def test_a_flood_of_short_texts_is_bounded_by_the_entries_too() -> None:
    cache = CountCache(max_chars=100_000)
    for i in range(10_000):
        cache.put(str(i), False, 1)
    assert len(cache) <= 100_000 // ENTRY and cache.chars <= 100_000


def test_special_tokens_are_part_of_the_key() -> None:
    cache = CountCache()
    cache.put("hello", True, 2)
    assert cache.get("hello", False) is None
    assert cache.get("hello", True) == 2
    with pytest.raises(ValueError, match="max_chars"):
        CountCache(-1)


def test_a_conversation_is_tokenized_once_and_counted_the_same(tokenizer: Tokenizer) -> None:
    recording = Recording(tokenizer)
    counter = TokenCounter(recording, CHATML)  # type: ignore[arg-type]
    fresh = TokenCounter(tokenizer, CHATML, cache_chars=0)  # keeps nothing
    history = [
        {"role": "system", "content": "You are a careful assistant. " * 20},
        {"role": "user", "content": "Write a function that adds two numbers."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b\n" * 10},
    ]
    turn = {"role": "user", "content": "Now make it add three."}
    first = counter.count_chat(history, limit=2048)
    seen = recording.chars
    second = counter.count_chat([*history, turn], limit=2048)
    assert recording.chars - seen == len(turn["content"])  # only the new message
    assert first == fresh.count_chat(history, limit=2048)
    assert second == fresh.count_chat([*history, turn], limit=2048)
    assert len(fresh.cache) == 0


def test_a_count_stopped_at_the_limit_is_not_kept(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer, CHATML)
    text = "The capital of France is Paris. " * 3_000  # ~96 KB, far past the limit
    assert counter.count_text(text, limit=100) > 100
    assert counter.cache.get(text, True) is None  # not an exact count
    exact = counter.count_text(text)
    assert counter.cache.get(text, True) == exact
