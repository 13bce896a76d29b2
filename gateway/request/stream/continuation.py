"""Continuing a streamed answer on another tier: what the client has, what to ask next, and
how the next tier's events are rewritten into the same stream. Pure: no I/O.

Every tier serves the same model with the same tokenizer and chat template, so an answer cut
short on one tier can go on from where it stopped on another:

- ``read_sent`` reads the SSE events the client was sent (complete events only: the relay
  forwards nothing past the last event boundary it has; each read by gateway/request/events/sse.py
  and gateway/request/events/chunk.py) into a ``Sent``: the answer's id and creation time, its text
  so far, how many content events it had, whether it already ended.
- ``unresumable`` says why a request cannot be continued (several choices, echo, structured
  output whose grammar would restart, a prompt that is not one text), or None.
- ``continuation_body`` is the body for the next tier: a chat's messages plus the partial
  assistant message with vLLM's ``continue_final_message: true`` and
  ``add_generation_prompt: false``; a completion's prompt plus the partial text; ``max_tokens``
  (and ``min_tokens``) reduced by what was already generated.
- ``Rewriter`` makes the next tier's events continue the first answer's: the same ``id`` and
  ``created``, no second ``role`` delta, usage summed over both tiers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.request.events.chunk import read_chunk
from gateway.request.events.sse import DONE, encode, ends_event, payload, payloads, split_events
from gateway.request.kind import Kind

CUT = "its stream ended before its answer did (no finish_reason, no [DONE])"
# What says an answer ended: a choice's finish_reason (a string, not null) or [DONE].
_ENDED = re.compile(rb'"finish_reason":\s*"|\[DONE\]')
# Request fields whose meaning does not survive a continuation: the grammar of structured
# output starts again at the continuation's first token, echo would repeat the prompt.
_STRUCTURED = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)


def ends_answer(events: bytes) -> bool:
    """Whether ``events`` say the answer ended: a finish_reason or ``[DONE]``. A tier stream
    that closes without either was cut (issue 35, item 7): not a whole answer."""
    if b"[DONE]" in events:
        return True
    keys = events.count(b'"finish_reason"')
    if not keys or keys == events.count(b'"finish_reason":null'):  # vLLM's, token by token
        return False
    return _ENDED.search(events) is not None


@dataclass(frozen=True)
class TierError:
    """An error event a tier sent in its stream."""

    message: str
    status: int | None  # its ``code`` when that is an HTTP status
    event: bytes  # the event as it came

    @property
    def request_error(self) -> bool:
        """Whether the tier said the request itself is wrong (4xx): another tier would too."""
        return self.status is not None and 400 <= self.status < 500


def split_error(events: bytes) -> tuple[bytes, TierError | None]:
    """``events`` up to a tier's own error event (vLLM sends one, then ``[DONE]``, when its
    engine fails mid-stream or the request turns out wrong), and that error; (``events``,
    None) without one. The events before it are kept as sent, in any framing."""
    if b'"error":' not in events:  # in a JSON string a quote is escaped: only a key matches
        return events, None
    kept: list[bytes] = []
    for block, end in split_events(events):
        data = payload(block)
        error = read_chunk(data, chat=True).error if data is not None else None
        if data is not None and error is not None:
            return b"".join(kept), TierError(error.message, error.status, encode(data))
        if block:
            kept.append(block + end)
    return events, None


@dataclass(frozen=True)
class Sent:
    """What the client has been sent of the answer."""

    id: str | None = None
    created: int | None = None
    text: str = ""
    events: int = 0  # token events (one token or more each: not the role or finish events)
    finished: bool = False  # a finish_reason (or [DONE]) was sent: nothing to continue
    why_not: str | None = None  # set when the answer so far cannot be continued


def read_sent(events: Iterable[bytes], chat: bool, before: Sent | None = None) -> Sent:
    """Read the events forwarded to the client (see the module docstring); ``before``: what
    the events sent before these said (``SentEvents`` folds a long stream as it goes)."""
    if before is not None and before.why_not is not None:
        return before
    before = before or Sent()
    answer_id, created = before.id, before.created
    parts: list[str] = [before.text] if before.text else []
    count, finished = before.events, before.finished
    for data in payloads(b"".join(events)):
        chunk = read_chunk(data, chat)
        if chunk.done:
            finished = True
            continue
        if chunk.problem is not None:
            return Sent(why_not=f"an event the tier sent is {chunk.problem}")
        if chunk.error is not None:
            return Sent(why_not="the tier sent an error event")
        answer_id = answer_id or chunk.id
        created = created if created is not None else chunk.created
        for choice in chunk.choices:
            if choice.index != 0:
                return Sent(why_not="the answer has several choices")
            if choice.calls:
                return Sent(why_not="the answer holds more than text (tool calls)")
            text = choice.text
            parts.append(text)
            if choice.finished:
                finished = True
            elif text or not choice.opening:
                count += 1  # a token event (an empty one: a character still incomplete)
    return Sent(answer_id, created, "".join(parts), count, finished)


FOLD_BYTES = 65_536  # sent events kept as bytes before they are folded into what they said


class SentEvents:
    """The events a client was sent of one stream, as a continuation reads them: the latest
    as they were sent, older ones (past ``fold_bytes``) folded into what they said
    (``read_sent``: the text and the counts, ~10x smaller than the events, far more with
    logprobs). Nothing is parsed while a short answer streams; a long one's memory stays
    bounded by its text."""

    def __init__(self, chat: bool, fold_bytes: int = FOLD_BYTES) -> None:
        self.chat, self.fold_bytes = chat, fold_bytes
        self._blocks: list[bytes] = []
        self._size = 0
        self._folded: Sent | None = None
        self.done = False  # the tier's [DONE] was sent
        self.clean_end = True  # what was sent ends at an event boundary (or nothing was)

    def add(self, block: bytes) -> None:
        """Keep ``block`` (complete events) as sent."""
        self._blocks.append(block)
        self._size += len(block)
        self.done = self.done or b"[DONE]" in block
        self.clean_end = ends_event(block)
        if self._size > self.fold_bytes:
            self._folded = read_sent(self._blocks, self.chat, self._folded)
            self._blocks, self._size = [], 0

    def read(self) -> Sent:
        """Everything the client was sent, read."""
        return read_sent(self._blocks, self.chat, self._folded)


def unresumable(body: Mapping[str, Any], kind: Kind) -> str | None:
    """Why an answer to ``body`` could not be continued on another tier, or None."""
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return "several choices"
    if body.get("echo"):
        return "echo"
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return "structured output"
    if any(body.get(field) is not None for field in _STRUCTURED):
        return "structured output"
    if kind is Kind.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "no messages"
        if body.get("continue_final_message") and not _assistant_text(messages[-1]):
            return "a final message that is not text"
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return None
    return None if isinstance(prompt, str) else "a prompt that is not one text"


def _assistant_text(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and isinstance(message.get("content"), str)
    )


def used_up(body: Mapping[str, Any], generated: int, max_tokens_field: str) -> bool:
    """Whether ``generated`` tokens already reach the length ``body`` asked for."""
    limit = body.get(max_tokens_field)
    return isinstance(limit, int) and not isinstance(limit, bool) and generated >= limit


def continuation_body(
    body: Mapping[str, Any], kind: Kind, sent: Sent, generated: int, max_tokens_field: str
) -> dict[str, Any]:
    """The body asking the next tier to go on from ``sent`` (``generated`` tokens so far).
    ``body`` is the one planned for that tier (its ``max_tokens`` fits its context with the
    prompt); ``unresumable`` passed and the length is not ``used_up``."""
    follow = dict(body)
    limit = body.get(max_tokens_field)
    if isinstance(limit, int) and not isinstance(limit, bool):
        follow[max_tokens_field] = max(limit - generated, 1)
    least = body.get("min_tokens")
    if isinstance(least, int) and not isinstance(least, bool) and least:
        follow["min_tokens"] = max(least - generated, 0)
    if kind is Kind.CHAT:
        messages = list(body["messages"])
        if body.get("continue_final_message"):  # the client's own prefix, already going on
            last = messages[-1]
            messages[-1] = {**last, "content": last["content"] + sent.text}
        else:
            messages.append({"role": "assistant", "content": sent.text})
        follow["messages"] = messages
        follow["continue_final_message"] = True
        follow["add_generation_prompt"] = False
        return follow
    prompt = body["prompt"]
    follow["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + sent.text
    return follow


def length_ending(
    sent: Sent, chat: bool, model: str, usage: Mapping[str, int] | None = None
) -> bytes:
    """The events ending an answer whose length was used up when its tier failed (with a
    usage event when the request asked for one)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat:
        choice["delta"] = {}
    else:
        choice["text"] = ""
    event = {
        "id": sent.id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": sent.created,
        "model": model,
        "choices": [choice],
    }
    events = [event] if usage is None else [event, {**event, "choices": [], "usage": dict(usage)}]
    encoded = (b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events)
    return b"".join(encoded) + DONE


class Rewriter:
    """Rewrites the next tier's events to continue the answer the client has (see the module
    docstring). ``generated``: completion tokens the first tiers produced; ``resent``: tokens
    of the sent text the next tier read as part of its prompt."""

    def __init__(self, sent: Sent, chat: bool, generated: int, resent: int) -> None:
        self.sent, self.chat = sent, chat
        self.generated, self.resent = generated, resent

    def __call__(self, events: bytes) -> bytes:
        """Complete events in, the events to forward out (possibly none)."""
        out = []
        for data in payloads(events):
            rewritten = self._event(data)
            if rewritten is not None:
                out.append(encode(rewritten))
        return b"".join(out)

    def _event(self, data: bytes) -> bytes | None:
        chunk = read_chunk(data, self.chat)
        if chunk.body is None or chunk.error is not None:  # [DONE], an error, not an object
            return data
        event = dict(chunk.body)
        if self.sent.id is not None:
            event["id"] = self.sent.id
        if self.sent.created is not None:
            event["created"] = self.sent.created
        choices = event.get("choices")
        if self.chat and isinstance(choices, list) and choices:
            kept = [c for c in map(_without_role, choices) if c is not None]
            if not kept and not event.get("usage"):
                return None
            event["choices"] = kept
        elif not self.chat and isinstance(choices, list):
            event["choices"] = [self._offsets(choice) for choice in choices]
        usage = event.get("usage")
        if isinstance(usage, dict):
            event["usage"] = self._usage(usage)
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()

    def _offsets(self, choice: Any) -> Any:
        """A completion choice's ``logprobs.text_offset`` counted from the answer's start (the
        next tier counts from where it took over)."""
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        if not isinstance(logprobs, dict) or not isinstance(logprobs.get("text_offset"), list):
            return choice
        offsets = logprobs["text_offset"]
        shift = len(self.sent.text)
        moved = [o + shift if isinstance(o, int) else o for o in offsets]
        return {**choice, "logprobs": {**logprobs, "text_offset": moved}}

    def _usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return usage
        prompt = max(prompt - self.resent, 0)
        completion += self.generated
        return {**usage, "prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}  # fmt: skip


def _without_role(choice: Any) -> Any:
    """A chat choice without its ``role`` (the client has had one); None when nothing is left."""
    if not isinstance(choice, dict) or not isinstance(choice.get("delta"), dict):
        return choice
    delta = {k: v for k, v in choice["delta"].items() if k != "role"}
    if not any(delta.values()) and not choice.get("finish_reason") and not choice.get("logprobs"):
        return None
    return {**choice, "delta": delta}
