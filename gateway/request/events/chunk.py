"""Reading one OpenAI streaming chunk: the gateway's one reader of what an SSE event says.
Pure: no I/O.

``read_chunk`` decodes one event's data (gateway/request/events/sse.py ``payload``) into a frozen
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

from gateway.request.events.sse import is_done


@dataclass(frozen=True)
class ChunkError:
    """The error object of a tier's error event."""

    message: str
    status: int | None  # its ``code`` when that is an HTTP status
    body: Any  # the ``error`` value as sent


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of a chunk (see the module docstring), read as it is asked (a stream's
    events are many: nothing is read that its reader does not ask for)."""

    body: Mapping[str, Any] | None  # as sent; None when it is not a JSON object
    chat: bool = True

    @property
    def index(self) -> int | None:
        """Its index (0 when left out); None when not an int (or the choice not an object)."""
        return _int(self.body.get("index", 0)) if self.body is not None else None

    @property
    def text(self) -> str:
        """``delta.content`` (chat) or ``text`` (completions); "" for none."""
        if self.body is None:
            return ""
        if not self.chat:
            return _text(self.body.get("text"))
        delta = self.body.get("delta")
        return _text(delta.get("content")) if isinstance(delta, dict) else ""

    @property
    def calls(self) -> bool:
        """Whether a chat delta carries more than text (tool or function calls)."""
        if self.body is None or not self.chat:
            return False
        delta = self.body.get("delta") or {}
        if not isinstance(delta, dict):
            return True
        return bool(delta.get("tool_calls") or delta.get("function_call"))

    @property
    def opening(self) -> bool:
        """Whether it is a chat delta with a role: the answer's opening."""
        delta = self.body.get("delta") if self.body is not None and self.chat else None
        return isinstance(delta, dict) and "role" in delta

    @property
    def finish_reason(self) -> Any:
        """As sent (vLLM: null until the last token)."""
        return self.body.get("finish_reason") if self.body is not None else None

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


@dataclass(frozen=True, slots=True)
class Chunk:
    """One event's data, read (see the module docstring)."""

    body: Mapping[str, Any] | None = None  # the JSON object; None for [DONE] or no object
    chat: bool = True
    done: bool = False  # OpenAI's [DONE]
    problem: str | None = None  # "not JSON" or "not a JSON object": what it is instead

    @property
    def error(self) -> ChunkError | None:
        """The error object, when the event is an error event."""
        if self.body is None or "error" not in self.body:
            return None
        return _error(self.body["error"])

    @property
    def id(self) -> str | None:
        return _str(self.body.get("id")) if self.body is not None else None

    @property
    def created(self) -> int | None:
        return _int(self.body.get("created")) if self.body is not None else None

    @property
    def choices(self) -> tuple[Choice, ...]:
        """Its choices (none for an error event, ``[DONE]`` or a usage-only event)."""
        if self.body is None or "error" in self.body:
            return ()
        choices = self.body.get("choices")
        if not isinstance(choices, list):
            return ()
        chat = self.chat
        return tuple([Choice(c if isinstance(c, dict) else None, chat) for c in choices])

    @property
    def usage(self) -> Mapping[str, Any] | None:
        """Its usage, when that is an object."""
        usage = self.body.get("usage") if self.body is not None else None
        return usage if isinstance(usage, dict) else None

    @property
    def usage_tokens(self) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens of its usage (None for each it does not give)."""
        usage = self.usage
        if usage is None:
            return None, None
        return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))


DONE_CHUNK = Chunk(done=True)


def read_chunk(data: bytes, chat: bool) -> Chunk:
    """One event's data read as a chat (``chat``) or completions chunk."""
    if is_done(data):
        return DONE_CHUNK
    try:
        event = json.loads(data)
    except ValueError:
        return Chunk(chat=chat, problem="not JSON")
    if not isinstance(event, dict):
        return Chunk(chat=chat, problem="not a JSON object")
    return Chunk(event, chat)


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
