"""Token counts of texts seen lately, so a conversation's history is not tokenized again.

A chat client sends the whole conversation with every turn; the gateway counts each message's
tokens (gateway/request/tokens/limits.py), so without a cache the work per request grows with the
conversation and a conversation's total with its square (this model's tokenizer takes about
1 ms per 1,000 tokens here). ``CountCache`` keeps the exact counts of recent texts, least
recently used first out, bounded by the characters it holds plus ``ENTRY`` for each entry (what
an entry costs beyond its text, so a flood of short texts is bounded too; a text longer than a
sixteenth of the budget is not kept, so one request cannot flush it). Keys are the text
itself, compared in full on a hit: a count is never taken for another text's.

An ``OrderedDict`` rather than a library LRU: the bound is the characters kept, two methods.
"""

from __future__ import annotations

from collections import OrderedDict

ENTRY = 200  # an entry's own memory (key tuple, dict slot, links), counted as characters


class CountCache:
    """Exact token counts by (text, special tokens added); see the module docstring."""

    def __init__(self, max_chars: int = 4_000_000) -> None:
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, not {max_chars}")
        self.max_chars = max_chars
        self.chars = 0  # characters of the texts kept, plus ENTRY per entry
        self._counts: OrderedDict[tuple[str, bool], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    def get(self, text: str, special: bool) -> int | None:
        key = (text, special)
        found = self._counts.get(key)
        if found is not None:
            self._counts.move_to_end(key)
        return found

    def put(self, text: str, special: bool, count: int) -> None:
        if len(text) + ENTRY > self.max_chars // 16:
            return
        key = (text, special)
        if key in self._counts:
            self._counts.move_to_end(key)
            return
        self._counts[key] = count
        self.chars += len(text) + ENTRY
        while self.chars > self.max_chars:
            (old, _), _ = self._counts.popitem(last=False)
            self.chars -= len(old) + ENTRY
