"""Deterministic benchmark prompts of exactly N tokens by the model's own tokenizer.

The text is the optimizer's calibration set (``optimizer/data/calibration.jsonl``: GSM8K,
Vicuna-style chat and code, licensed in that folder), joined into one token stream; prompt ``i``
is a window of that stream at an offset drawn from ``random.Random(seed)``. A window is decoded
and encoded again: when the round trip does not give exactly N tokens (a word split across the
window's edge), the window moves on by one token (and after ``MAX_SHIFTS`` a new offset is
drawn), so every prompt is N tokens long as the server will count it (SmolLM2's tokenizer adds
no special tokens to a completions prompt; the integration test checks the server's count).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer

from measure.loadgen import Prompt

CALIBRATION = Path(__file__).resolve().parent.parent / "optimizer" / "data" / "calibration.jsonl"
TOKENIZER_FILE = "tokenizer.json"
MAX_SHIFTS = 64
MAX_DRAWS = 100


class PromptError(ValueError):
    """No usable tokenizer or text for the prompts; the message is one line."""


def load_tokenizer(folder: Path) -> Tokenizer:
    """The ``tokenizer.json`` in ``folder`` (a variant folder) or ``folder`` itself."""
    path = folder if folder.is_file() else folder / TOKENIZER_FILE
    if not path.is_file():
        raise PromptError(f"no {TOKENIZER_FILE} in {folder}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises plain Exception subclasses
        raise PromptError(f"{path}: cannot load tokenizer: {exc}") from None


def corpus_texts(path: Path = CALIBRATION) -> list[str]:
    """The ``text`` of every JSON line of the calibration file."""
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            texts.append(str(json.loads(line)["text"]))
    return texts


def make_prompts(
    tokenizer: Tokenizer, count: int, length: int, seed: int, texts: list[str] | None = None
) -> list[Prompt]:
    """``count`` prompts of exactly ``length`` tokens each, the same for the same arguments."""
    if count < 1 or length < 1:
        raise ValueError(f"count and length must be positive, not {count} and {length}")
    stream = tokenizer.encode("\n\n".join(texts or corpus_texts()), add_special_tokens=False).ids
    if len(stream) < length + MAX_SHIFTS:
        raise PromptError(f"the prompt text has {len(stream)} tokens, too few for {length}")
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        for _ in range(MAX_DRAWS):
            offset = rng.randrange(0, len(stream) - length - MAX_SHIFTS)
            prompt = _window(tokenizer, stream, offset, length)
            if prompt is not None:
                prompts.append(prompt)
                break
        else:
            raise PromptError(f"no window of exactly {length} tokens in {MAX_DRAWS} draws")
    return prompts


def _window(tokenizer: Tokenizer, stream: list[int], offset: int, length: int) -> Prompt | None:
    for shift in range(MAX_SHIFTS):
        start = offset + shift
        # Special tokens stay in the text (the chat samples hold <|im_start|>): the server
        # reads them back as the same single tokens.
        text = tokenizer.decode(stream[start : start + length], skip_special_tokens=False)
        if len(tokenizer.encode(text, add_special_tokens=False).ids) == length:
            return Prompt(text, length)
    return None
