"""A whole answer assembled from a stream. Pure: no I/O.

With the routing policy's ``failover.whole_answers: continue`` a non-streamed request is asked
of its tier as a stream (``as_stream``), relayed as a streamed one is (so a tier failing midway
is continued on the next one from where it stopped, gateway/request/stream/resumable.py), and the
events are folded back into the whole answer the client asked for (``assemble``):

- the answer's ``id``, ``created`` and ``model`` come from its first event, ``usage`` from the
  last one that has it (the tier is asked for it with ``stream_options.include_usage``);
- a chat choice's ``message`` joins its deltas' text fields (``content``, reasoning), a
  completion choice joins its ``text``; ``logprobs`` join their lists; ``finish_reason`` and
  ``stop_reason`` are the last ones sent;
- an error event (the stream ended with one: nothing could continue it) becomes the error
  answer, with the status the relay recorded.

``assemblable`` says which requests are asked this way: a request whose whole answer holds
what a stream cannot carry back exactly (tool calls, prompt logprobs, token ids, several
choices) or that could not be continued anyway (gateway/request/stream/continuation.py
``unresumable``) is asked as a whole, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.request.events.chunk import read_chunk
from gateway.request.events.sse import EventBuffer, payloads
from gateway.request.kind import Kind
from gateway.request.stream.continuation import unresumable

# Request fields whose whole answer a stream does not give back as it is.
_WHOLE_ONLY = (
    "tools",
    "functions",
    "tool_choice",
    "prompt_logprobs",
    "return_token_ids",
    "return_tokens_as_token_ids",
    "stream_options",  # vLLM refuses it on a non-streamed request: keep its answer
    "kv_transfer_params",
)
# The fields vLLM's (0.32) whole answers carry even when empty; an empty ``tool_calls`` is left
# out, as vLLM leaves it out.
_MESSAGE = {"role": "assistant", "content": None, "refusal": None, "annotations": None,
            "audio": None, "function_call": None, "reasoning": None}  # fmt: skip
_CHOICE = {"logprobs": None, "finish_reason": None, "stop_reason": None, "token_ids": None,
           "routed_experts": None}  # fmt: skip
_COMPLETION_CHOICE = {"prompt_logprobs": None, "prompt_token_ids": None}
_ANSWER = {"service_tier": None, "system_fingerprint": None, "usage": None,
           "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}  # fmt: skip
_CHAT_ANSWER = {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
_USAGE = {"prompt_tokens_details": None, "completion_tokens_details": None}


def assemblable(body: Mapping[str, Any], kind: Kind) -> bool:
    """Whether a non-streamed request can be asked as a stream and its answer assembled."""
    if body.get("stream") is not None and body.get("stream") is not False:
        return False
    if any(body.get(field) is not None for field in _WHOLE_ONLY):
        return False
    return unresumable(body, kind) is None


def as_stream(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` asked as a stream that ends with its usage."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


@dataclass(frozen=True)
class Assembled:
    """The whole answer: its HTTP status and JSON body."""

    status: int
    body: bytes


class _Choice:
    """One choice being folded: text pieces and lists are gathered, joined once at the end
    (an answer's cost stays linear in its length)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.texts: dict[str, list[str]] = {}  # the message's (or completion's) text fields
        self.fields: dict[str, Any] = {}  # the message's other fields: the last non-null
        self.logprobs: dict[str, Any] | None = None  # lists extended in place
        self.rest: dict[str, Any] = {}  # finish_reason, stop_reason, ...: the last non-null

    def fold(self, choice: Mapping[str, Any], chat: bool) -> None:
        if chat:
            delta = choice.get("delta")
            for key, value in delta.items() if isinstance(delta, dict) else ():
                if isinstance(value, str) and key != "role":
                    self.texts.setdefault(key, []).append(value)
                elif value is not None or key not in self.fields:
                    self.fields[key] = value
        elif isinstance(choice.get("text"), str):
            self.texts.setdefault("text", []).append(choice["text"])
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            held = self.logprobs if self.logprobs is not None else {}
            self.logprobs = held
            for key, value in logprobs.items():
                if isinstance(value, list) and isinstance(held.get(key), list):
                    held[key].extend(value)
                else:
                    held[key] = list(value) if isinstance(value, list) else value
        for key, value in choice.items():
            if key not in ("delta", "text", "logprobs", "index") and (
                value is not None or key not in self.rest
            ):
                self.rest[key] = value

    def whole(self, chat: bool) -> dict[str, Any]:
        """The choice in a whole answer's shape."""
        texts = {key: "".join(pieces) for key, pieces in self.texts.items()}
        choice: dict[str, Any] = {"index": self.index}
        if chat:
            message = {**_MESSAGE, **self.fields, **texts}
            if not message.get("tool_calls"):
                message.pop("tool_calls", None)
            choice["message"] = message
        else:
            choice["text"] = texts.get("text", "")
        defaults = _CHOICE if chat else {**_CHOICE, **_COMPLETION_CHOICE}
        return {**choice, **defaults, **self.rest, "logprobs": self.logprobs}


class Assembler:
    """Folds a relayed stream's events, as they come, into the whole answer (see the module
    docstring)."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.answer: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.error: Any = None
        self._buffer = EventBuffer()  # an event not yet complete, never joined per chunk

    def feed(self, data: bytes) -> None:
        """Bytes of the relayed stream, cut anywhere."""
        events = self._buffer.feed(data)
        for payload in payloads(events):
            if self.error is not None:
                continue
            chunk = read_chunk(payload, self.chat)
            if chunk.body is None:  # [DONE], or not a JSON object
                continue
            if chunk.error is not None:
                self.error = chunk.error.body
                continue
            self._fold_top(chunk.body)
            for choice in chunk.body.get("choices") or []:  # folded whole: every field read
                if isinstance(choice, dict):
                    index = choice.get("index", 0)
                    index = index if isinstance(index, int) else 0
                    self.choices.setdefault(index, _Choice(index)).fold(choice, self.chat)

    def result(self, failure: int | None = None) -> Assembled:
        """The whole answer; ``failure``: the status the relay recorded when the stream ended
        with an error event."""
        if self.error is not None:
            return Assembled(failure or 502, _dumps({"error": self.error}))
        if not self.answer:
            return Assembled(failure or 502, _dumps({"error": _empty_error()}))
        defaults = {**_ANSWER, **_CHAT_ANSWER} if self.chat else _ANSWER
        answer = {**defaults, **self.answer}
        usage = answer["usage"]
        if isinstance(usage, dict):  # a stream's usage leaves its null fields out
            answer["usage"] = {**usage, **{k: v for k, v in _USAGE.items() if k not in usage}}
        answer["object"] = "chat.completion" if self.chat else "text_completion"
        answer["choices"] = [self.choices[i].whole(self.chat) for i in sorted(self.choices)]
        return Assembled(200, _dumps(answer))

    def _fold_top(self, event: Mapping[str, Any]) -> None:
        """The answer's own fields: the first event's id, created and model; the last non-null
        value of any other field (usage)."""
        for key, value in event.items():
            if key in ("choices", "object"):
                continue
            if key in ("id", "created", "model"):
                self.answer.setdefault(key, value)
            elif value is not None or key not in self.answer:
                self.answer[key] = value


def _empty_error() -> dict[str, Any]:
    return {"message": "the model server's answer was empty", "type": "server_error",
            "param": None, "code": None}  # fmt: skip


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
