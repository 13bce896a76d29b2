"""A prompt's tokens bounded from above without the tokenizer, and when the bound decides.

Tokenizing costs tens of microseconds for a one-line prompt on the request path (the
tokenizer's tables are cold in the CPU's caches by the time a request comes), about 1 ms per
1,000 tokens for a long one. A byte-level BPE (GPT-2's ``ByteLevel`` pre-tokenizer, no
normalizer: SmolLM2, Llama 3, Qwen) writes every input byte as one symbol of its alphabet and
every token covers at least one symbol, so a text's UTF-8 length bounds its tokens from above;
the chat template's overheads are known exactly (gateway/request/tokens/limits.py's ``ChatFormat``).

``bound_decides`` says when every decision the gateway takes from a prompt's count (the
``long`` class, ``max_input_tokens``, each tier's cap, room in its context and the
``max_tokens`` sent it, gateway/request/tokens/limits.py and router.py) comes out the same for any
count up to the bound as for the bound itself. Then the request is planned on the bound and
counted exactly later, off its path, for the metrics and the span (a whole answer's usage from
the tier makes even that unnecessary). Otherwise it is counted exactly first, as always.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer

from gateway.policy.schema import LimitsPolicy
from gateway.request.tokens.prompt_text import content_texts, role_text


def byte_level(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` is a byte-level BPE without a normalizer (see the module
    docstring): its tokens of a text are at most the text's UTF-8 bytes."""
    spec = json.loads(tokenizer.to_str())
    normalizer = spec.get("normalizer")
    if normalizer and not (normalizer.get("type") == "Sequence" and not normalizer["normalizers"]):
        return False
    if spec.get("padding") is not None:  # padded encodings are longer than their text
        return False
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    levels = [s for s in steps if s.get("type") == "ByteLevel"]
    model = spec.get("model") or {}
    # add_prefix_space writes a space no byte of the text stands for: one token more a piece
    return (
        model.get("type") == "BPE"
        and bool(levels)
        and not any(s.get("add_prefix_space") for s in levels)
    )


def message_texts(message: Mapping[str, Any]) -> list[str]:
    """The texts of a chat message that are counted: its content (parts joined with newlines,
    as vLLM joins them), a role no template knows (rendered verbatim: the known roles are in
    the template's overheads) and its tool calls' function names and arguments."""
    texts = content_texts(message.get("content"))
    if len(texts) > 1:
        texts = ["\n".join(texts)]
    if role := role_text(message):
        texts.append(role)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                texts += [v for k in ("name", "arguments") if isinstance(v := function.get(k), str)]
    return texts


def utf8_length(text: str) -> int:
    """UTF-8 bytes of ``text``; ``UnicodeEncodeError`` for a lone surrogate (JSON allows one,
    the tokenizer refuses it: such a prompt takes the exact count's path and its error)."""
    return len(text.encode("utf-8"))


def bound_decides(
    bound: int,
    max_tokens: int | None,
    tiers: Sequence[tuple[str, int]],
    limits: LimitsPolicy,
    long_min_tokens: int,
) -> bool:
    """True when a prompt of at most ``bound`` tokens, asking for ``max_tokens`` (None: not
    given), gets the same class, checks and ``max_tokens`` on every tier of ``tiers`` (name,
    ``max_model_len``) as a prompt of exactly ``bound`` would: short of ``long``, within every
    prompt limit, and with the completion length it would be sent not depending on the room
    left in any tier's context."""
    if bound >= long_min_tokens:
        return False
    if limits.max_input_tokens is not None and bound > limits.max_input_tokens:
        return False
    wanted = max_tokens
    if wanted is None:  # what is sent when the client gives none (limits.check_limits)
        given = [v for v in (limits.default_max_tokens, limits.max_output_tokens) if v is not None]
        wanted = min(given) if given else None
    elif limits.max_output_tokens is not None and wanted > limits.max_output_tokens:
        return False  # clamped or refused: the message names the count
    for name, max_model_len in tiers:
        cap = limits.tier_input_cap(name)
        if cap is not None and bound > cap:
            return False
        room = max_model_len - bound
        if room < 1 or (wanted is not None and wanted > room):
            return False
    return True
