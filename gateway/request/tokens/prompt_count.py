"""A request's prompt tokens: counted with the model's tokenizer, or bounded without it.

``count_prompt`` counts a chat's messages (chat template applied, gateway/request/tokens/limits.py)
or a completions prompt (the longest of a list; token ids as they are), and refuses a
malformed prompt (400). ``bound_prompt`` gives at least that count without tokenizing, where
the tokenizer allows it (gateway/request/tokens/prompt_bound.py): the plan
(gateway/request/route/plan.py) takes it when it decides every limit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gateway.errors import INVALID_REQUEST, APIError
from gateway.request.kind import Kind
from gateway.request.tokens.prompt_bound import message_texts


class PromptCounter(Protocol):
    """What counting needs (gateway/request/tokens/limits.py ``TokenCounter`` or ``ByteCounter``).

    With ``limit`` a count is exact up to ``limit`` and some number above it past it (the
    counter may stop early: bounded work whatever the prompt's length)."""

    def count_text(self, text: str, *, limit: int | None = None) -> int: ...

    def count_chat(
        self, messages: Sequence[Mapping[str, Any]], *, limit: int | None = None
    ) -> int: ...

    # At least the count, without tokenizing; None: no such bound (gateway/request/
    # prompt_bound.py).
    def bound_text(self, text: str) -> int | None: ...

    def bound_chat(self, messages: Sequence[Mapping[str, Any]]) -> int | None: ...


class ByteCounter:
    """Without a tokenizer: UTF-8 bytes bound the tokens of a byte-level BPE from above (its
    counts are that bound already: it offers no other)."""

    def bound_text(self, text: str) -> int | None:
        return None

    def bound_chat(self, messages: Sequence[Mapping[str, Any]]) -> int | None:
        return None

    def count_text(self, text: str, *, limit: int | None = None) -> int:
        return len(text.encode("utf-8", "surrogatepass")) + 1

    def count_chat(self, messages: Sequence[Mapping[str, Any]], *, limit: int | None = None) -> int:
        total = 0
        for message in messages:
            texts = message_texts(message)
            total += sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) + 16
            if limit is not None and total > limit:
                break
        return total


def count_prompt(
    body: Mapping[str, Any], kind: Kind, counter: PromptCounter, limit: int | None = None
) -> int:
    """Prompt tokens of a chat or completions body (the longest prompt of a list; a chat's
    ``tools`` counted as their JSON); 400 for a malformed prompt. With ``limit``: exact up to
    it, some number above it past it."""
    if kind is Kind.CHAT:
        messages = _checked_messages(body)
        tokens = counter.count_chat(messages, limit=limit)
        tools = _tools_json(body)
        if tools is not None and (limit is None or tokens <= limit):
            # The chat template writes the tools' schemas into the prompt, about as JSON.
            tokens += counter.count_text(tools, limit=None if limit is None else limit - tokens)
        return tokens
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return counter.count_text(prompt, limit=limit)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return max(counter.count_text(p, limit=limit) for p in prompt)
        if all(_token_ids(p) for p in prompt):
            return len(prompt)
        if all(isinstance(p, list) and all(_token_ids(t) for t in p) for p in prompt):
            return max(len(p) for p in prompt)
    raise _bad_prompt()


def bound_prompt(body: Mapping[str, Any], kind: Kind, counter: PromptCounter) -> int | None:
    """At least what ``count_prompt`` finds, without tokenizing (gateway/request/
    prompt_bound.py); ``None`` when there is no such bound (then count). 400 as it does."""
    if kind is Kind.CHAT:
        bound = counter.bound_chat(_checked_messages(body))
        tools = _tools_json(body)
        if bound is None or tools is None:
            return bound
        more = counter.bound_text(tools)
        return None if more is None else bound + more
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return counter.bound_text(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        bounds = [counter.bound_text(p) for p in prompt]
        return None if None in bounds else max(b for b in bounds if b is not None)
    return None  # token ids are counted as they are; anything else is refused by the count


def _checked_messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(f"messages[{i}] must be an object with a string 'role'", "messages")
        if not isinstance(message.get("content"), str | list | None):
            what = "a string, an array of content parts or null"
            raise _invalid(f"messages[{i}].content must be {what}", "messages")
    return messages


def _tools_json(body: Mapping[str, Any]) -> str | None:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    return json.dumps(tools, ensure_ascii=False, separators=(", ", ": "))


def _bad_prompt() -> APIError:
    return _invalid(
        "'prompt' must be a string, an array of strings or an array of token ids", "prompt"
    )


def _token_ids(value: object) -> bool:
    """A token id: an int, not a bool (Python's bools are ints)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid(message: str, param: str) -> APIError:
    return APIError(400, message, INVALID_REQUEST, param=param, code="invalid_value")
