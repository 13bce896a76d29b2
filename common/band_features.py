"""The second stage's features (gateway/request/classify/second_stage.py, classifier/train_band.py):
richer than the first stage's (common/prompt_features.py) and dearer, so they are computed
only for the prompts the first stage is unsure of.

Standard library only. Binary features of a bounded window, hashed (``zlib.crc32``) into
``2 ** bits`` buckets so the weights file holds no vocabulary:

- the first stage's own features (words, five-letter stems, non-letter bytes);
- adjacent word pairs (``how many``, ``write a``, ``a poem``): the voice of a request;
- the character 4-grams of the lowercased words joined by one space (``def``, ``x^2``, ``=0.5``).

The cost is linear in the window (a few thousand hashes for 2,048 characters).
"""

from __future__ import annotations

import itertools
import zlib

from common.prompt_features import _WORD_TABLE, features, window

__all__ = ["band_buckets"]


def band_buckets(text: str, head: int, tail: int, bits: int) -> list[int]:
    """The distinct buckets of the features of ``text``'s window, sorted."""
    found = features(text, head, tail)
    mask = (1 << bits) - 1
    crc = zlib.crc32
    raw = window(text, head, tail).encode("utf-8", "surrogatepass").lower()
    words = raw.translate(_WORD_TABLE).split()
    out = {crc(b"w" + w) & mask for w in found.words}
    out.update(crc(b"c" + bytes((m,))) & mask for m in found.marks)
    out.update(crc(b"p" + a + b" " + b) & mask for a, b in itertools.pairwise(words))
    spaced = b" " + b" ".join(words) + b" "
    out.update(crc(b"g" + spaced[i : i + 4]) & mask for i in range(len(spaced) - 3))
    return sorted(out)
