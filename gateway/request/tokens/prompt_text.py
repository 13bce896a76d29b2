"""What the classifier reads of a request body: the texts of a chat or of a completions prompt,
within bounds that do not grow with the request (gateway/request/classify/classes.py uses them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Parts:
    """What the classifier reads of a request (``request_parts``)."""

    system: tuple[str, ...] = ()  # chat: system and developer messages
    turns: tuple[str, ...] = ()  # chat: user messages, oldest first
    prompts: Sequence[object] = ()  # completions: the prompt, or the list (non-strings skipped)
    chat: bool = False


def request_parts(body: Mapping[str, Any], max_turns: int | None = None) -> Parts:
    """The texts of a chat (system and user messages, and messages of a role no template
    knows, with that role's text: vLLM renders it; assistant and tool messages are the
    model's own words and do not count) or of a completions request (each prompt string).
    With ``max_turns``, a chat is read from its end up to that many user messages (and its
    leading system messages, as many), so a long conversation costs no more than a short one."""
    messages = body.get("messages")
    if isinstance(messages, list):
        limit = len(messages) if max_turns is None else max_turns
        system: list[str] = []
        for message in messages[:limit]:
            if not isinstance(message, Mapping) or message.get("role") not in _SYSTEM:
                break
            text = "\n\n".join(content_texts(message.get("content")))
            if text:
                system.append(text)
        turns: list[str] = []
        for message in reversed(messages):
            if len(turns) >= limit:
                break
            if not isinstance(message, Mapping):
                continue
            other = role_text(message)
            if other or message.get("role") == "user":
                text = "\n\n".join(t for t in (other, *content_texts(message.get("content"))) if t)
                if text:
                    turns.append(text)
        return Parts(tuple(system), tuple(reversed(turns)), (), chat=True)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return Parts(prompts=(prompt,))
    if isinstance(prompt, list):
        return Parts(prompts=prompt)  # read within bounds by _read (a list may be huge)
    return Parts()


_SYSTEM = ("system", "developer")


def read_texts(parts: Parts, max_turns: int, max_prompts: int, head: int, tail: int) -> list[str]:
    """The texts read (not yet windowed): system messages and the last user turns of a chat,
    or the prompts of a list: the first ``max_prompts - 1`` distinct ones on their own, the rest
    as one text, of which only what its window can show is gathered (the work stays bounded
    for a list of any length)."""
    if parts.chat:
        return [*parts.system, *parts.turns[-max_turns:]]
    most = max_prompts
    first: list[str] = []
    seen: set[str] = set()
    index = 0
    for index, prompt in enumerate(parts.prompts):
        if len(first) == most - 1 or index >= 4 * most:  # duplicates count toward the bound
            break
        if isinstance(prompt, str) and prompt not in seen:
            seen.add(prompt)
            first.append(prompt)
    else:
        return first
    rest = _gather(parts.prompts, index, head, tail)
    return [*first, rest] if rest else first


def _gather(items: Sequence[object], start: int, head: int, tail: int) -> str:
    """``items[start:]`` (strings only) joined by blank lines, cut to what a window of ``head``
    + ``tail`` characters reads: a bounded number of items from each end."""
    front: list[str] = []
    size, i = 0, start
    while i < len(items) and size < head:
        item = items[i]
        if isinstance(item, str):
            front.append(item)
            size += len(item) + 2
        i += 1
    back: list[str] = []
    size, j = 0, len(items) - 1
    while j >= i and size < tail:
        item = items[j]
        if isinstance(item, str):
            back.append(item)
            size += len(item) + 2
        j -= 1
    gap = ["..."] if j >= i else []
    return "\n\n".join([*front, *gap, *reversed(back)])


def content_texts(content: object) -> list[str]:
    """The text pieces of one message's ``content``, as vLLM's chat renderer reads them
    (vllm/renderers/chat_utils.py, 0.32: ``MM_PARSER_MAP``): a string, or a list of parts
    whose text parts (``TEXT_PARTS``: ``text``, ``input_text``, ``output_text``, ``thinking``,
    ``refusal``, and a ``tool_reference``'s name) it renders verbatim; a part without a
    ``type`` counts as text (vLLM refuses it: counting it cannot let a long prompt through)."""
    if isinstance(content, str):
        return [content] if content else []
    texts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str) and part:
                texts.append(part)
            elif isinstance(part, Mapping):
                field = TEXT_PARTS.get(part.get("type", "text"))
                text = part.get(field) if field is not None else None
                if isinstance(text, str) and text:
                    texts.append(text)
    return texts


# A content part's type -> the field holding the text vLLM renders into the prompt.
TEXT_PARTS: Mapping[object, str] = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "thinking": "thinking",
    "refusal": "refusal",
    "tool_reference": "name",
}
# The roles chat templates know: any other role string is rendered verbatim into the prompt
# (counted as text) and its message is the client's words (classified as a user turn).
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def role_text(message: Mapping[str, Any]) -> str:
    """A message's role when it is not one of ``KNOWN_ROLES`` (its text is in the prompt);
    ``""`` otherwise."""
    role = message.get("role")
    return role if isinstance(role, str) and role not in KNOWN_ROLES else ""
