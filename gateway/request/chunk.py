"""Reading one OpenAI streaming chunk: the gateway's one reader of what an SSE event says.
Pure: no I/O.

``read_chunk`` decodes one event's data (gateway/request/sse.py ``payload``) into a frozen
``Chunk``: ``[DONE]``, an error event (vLLM sends ``{"error": {...}}`` when its engine fails
mid-stream), or a chunk of the answer with its id, creation time, usage and choices. A
``Choice`` reads a chat chunk's ``delta`` and a completion chunk's ``text`` alike: its text
(``delta.content`` or ``text``), whether it carries more than text (tool or function calls),
whether it is the role-only delta that opens a chat answer, its finish reason and its sampled
tokens' logprobs (chat ``logprobs.content[].logprob``, completions
``logprobs.token_logprobs``). What a reader needs that a chunk does not name (the answer's
other fields, to fold or rewrite them) it reads from ``body``, the JSON object as decoded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.request.sse import is_done


@dataclass(frozen=True)
class ChunkError:
    """The error object of a tier's error event."""

    message: str
    status: int | None  # its ``code`` when that is an HTTP status
    body: Any  # the ``error`` value as sent


@dataclass(frozen=True)
class Choice:
    """One choice of a chunk (see the module docstring)."""

    body: Mapping[str, Any] | None  # as sent; None when it is not a JSON object
    index: int | None  # 0 when left out; None when not an int (or the choice not an object)
    text: str = ""  # delta.content (chat) or text (completions); "" for none
    calls: bool = False  # a chat delta that carries more than text (tool or function calls)
    opening: bool = False  # a chat delta with a role: the answer's opening
    finish_reason: Any = None  # as sent (vLLM: null until the last token)
    chat: bool = True

    @property
    def finished(self) -> bool:
        """Whether this choice says its answer ended."""
        return bool(self.finish_reason)

    @property
    def logprobs(self) -> list[float]:
        """The sampled tokens' logprobs this chunk carries (none unless the client asked)."""
        logprobs = self.body.get("logprobs") if self.body is not None else None
        if not isinstance(logprobs, dict):
            return []
        if self.chat:
            content = logprobs.get("content")
            entries = content if isinstance(content, list) else []
            values = [e.get("logprob") for e in entries if isinstance(e, dict)]
        else:
            listed = logprobs.get("token_logprobs")
            values = listed if isinstance(listed, list) else []
        return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


@dataclass(frozen=True)
class Chunk:
    """One event's data, read (see the module docstring)."""

    body: Mapping[str, Any] | None = None  # the JSON object; None for [DONE] or no object
    done: bool = False  # OpenAI's [DONE]
    problem: str | None = None  # "not JSON" or "not a JSON object": what it is instead
    error: ChunkError | None = None  # the event is an error event
    id: str | None = None
    created: int | None = None
    choices: tuple[Choice, ...] = ()
    usage: Mapping[str, Any] | None = None  # its usage, when that is an object

    @property
    def usage_tokens(self) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens of its usage (None for each it does not give)."""
        if self.usage is None:
            return None, None
        return _int(self.usage.get("prompt_tokens")), _int(self.usage.get("completion_tokens"))


DONE_CHUNK = Chunk(done=True)


def read_chunk(data: bytes, chat: bool) -> Chunk:
    """One event's data read as a chat (``chat``) or completions chunk."""
    if is_done(data):
        return DONE_CHUNK
    try:
        event = json.loads(data)
    except ValueError:
        return Chunk(problem="not JSON")
    if not isinstance(event, dict):
        return Chunk(problem="not a JSON object")
    if "error" in event:
        return Chunk(event, error=_error(event["error"]))
    choices = event.get("choices")
    usage = event.get("usage")
    return Chunk(
        event,
        id=_str(event.get("id")),
        created=_int(event.get("created")),
        choices=tuple(_choice(c, chat) for c in choices) if isinstance(choices, list) else (),
        usage=usage if isinstance(usage, dict) else None,
    )


def _choice(choice: Any, chat: bool) -> Choice:
    if not isinstance(choice, dict):
        return Choice(None, None, chat=chat)
    index = choice.get("index", 0)
    index = _int(index)
    finish = choice.get("finish_reason")
    if not chat:
        text = choice.get("text")
        return Choice(choice, index, _text(text), finish_reason=finish, chat=False)
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        return Choice(choice, index, calls=True, finish_reason=finish)
    calls = bool(delta.get("tool_calls") or delta.get("function_call"))
    text = _text(delta.get("content"))
    return Choice(choice, index, text, calls, "role" in delta, finish)


def _error(error: Any) -> ChunkError:
    message = error.get("message") if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 100 <= code < 600 else None
    return ChunkError(str(message)[:200], status, error)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
