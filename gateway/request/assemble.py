"""A whole answer assembled from a stream. Pure: no I/O.

With the routing policy's ``failover.whole_answers: continue`` a non-streamed request is asked
of its tier as a stream (``as_stream``), relayed as a streamed one is (so a tier failing midway
is continued on the next one from where it stopped, gateway/request/resumable.py), and the
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
choices) or that could not be continued anyway (gateway/request/continuation.py
``unresumable``) is asked as a whole, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.request.continuation import event_data, unresumable

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
# Message fields vLLM's whole chat answer carries even when empty.
_MESSAGE_DEFAULTS: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "tool_calls": [],
    "reasoning_content": None,
}


def assemblable(body: Mapping[str, Any], path: str) -> bool:
    """Whether a non-streamed request can be asked as a stream and its answer assembled."""
    if body.get("stream") is not None and body.get("stream") is not False:
        return False
    if any(body.get(field) is not None for field in _WHOLE_ONLY):
        return False
    return unresumable(body, path) is None


def as_stream(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` asked as a stream that ends with its usage."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


@dataclass(frozen=True)
class Assembled:
    """The whole answer: its HTTP status and JSON body."""

    status: int
    body: bytes


def assemble(events: bytes, chat: bool, failure: int | None = None) -> Assembled:
    """The whole answer made of a relayed stream's ``events`` (see the module docstring).
    ``failure``: the status the relay recorded when the stream ended with an error event."""
    answer: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for data in event_data(events):
        if data == b"[DONE]":
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if "error" in event:
            return Assembled(failure or 502, _dumps({"error": event["error"]}))
        _fold_top(answer, event)
        for choice in event.get("choices") or []:
            if isinstance(choice, dict):
                index = choice.get("index", 0)
                _fold_choice(choices.setdefault(index, {"index": index}), choice, chat)
    if not answer:
        return Assembled(failure or 502, _dumps({"error": _empty_error()}))
    answer["object"] = "chat.completion" if chat else "text_completion"
    answer["choices"] = [_finish_choice(choices[i], chat) for i in sorted(choices)]
    return Assembled(200, _dumps(answer))


def _fold_top(answer: dict[str, Any], event: Mapping[str, Any]) -> None:
    """The answer's own fields: the first event's id, created and model; the last non-null
    value of any other field (usage)."""
    for key, value in event.items():
        if key in ("choices", "object"):
            continue
        if key in ("id", "created", "model"):
            answer.setdefault(key, value)
        elif value is not None or key not in answer:
            answer[key] = value


def _fold_choice(folded: dict[str, Any], choice: Mapping[str, Any], chat: bool) -> None:
    if chat:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            message = folded.setdefault("message", {})
            for key, value in delta.items():
                _join(message, key, value)
    else:
        _join(folded, "text", choice.get("text"))
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        joined = folded.setdefault("logprobs", {})
        for key, value in logprobs.items():
            _join(joined, key, value)
    for key, value in choice.items():
        if key in ("delta", "text", "logprobs", "index"):
            continue
        if value is not None or key not in folded:
            folded[key] = value


def _join(into: dict[str, Any], key: str, value: Any) -> None:
    """Strings and lists are joined; other values are replaced by the last non-null one."""
    held = into.get(key)
    if isinstance(value, str) and isinstance(held, str) and key != "role":
        into[key] = held + value
    elif isinstance(value, list) and isinstance(held, list):
        into[key] = [*held, *value]
    elif value is not None or key not in into:
        into[key] = value


def _finish_choice(folded: dict[str, Any], chat: bool) -> dict[str, Any]:
    """A folded choice in a whole answer's shape (the fields a whole answer always has)."""
    choice: dict[str, Any] = {"index": folded["index"]}
    if chat:
        message = {**_MESSAGE_DEFAULTS, **folded.get("message", {})}
        if message.get("tool_calls") is None:
            message["tool_calls"] = []
        choice["message"] = message
    else:
        choice["text"] = folded.get("text") or ""
    choice["logprobs"] = folded.get("logprobs")
    choice["finish_reason"] = folded.get("finish_reason")
    choice["stop_reason"] = folded.get("stop_reason")
    for key, value in folded.items():
        if key not in choice and key != "message":
            choice[key] = value
    return choice


def _empty_error() -> dict[str, Any]:
    return {"message": "the model server's answer was empty", "type": "server_error",
            "param": None, "code": None}  # fmt: skip


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
