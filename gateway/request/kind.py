"""Which of the two OpenAI completion endpoints a request came to, decided once where it is
read (gateway/request/completions/proxy.py ``chat_completions`` / ``completions``) and carried on
the request value later steps read (``CompletionRequest``, gateway/request/route/decided.py),
so that no step re-derives it from the URL path."""

from __future__ import annotations

from enum import Enum


class Kind(Enum):
    """A chat request (``messages``; answers of ``message`` / ``delta``) or a completions
    request (``prompt``; answers of ``text``)."""

    CHAT = "chat"
    COMPLETIONS = "completions"

    @property
    def path(self) -> str:
        """The endpoint's path, as the tiers are asked it."""
        return _PATHS[self]


_PATHS = {Kind.CHAT: "/v1/chat/completions", Kind.COMPLETIONS: "/v1/completions"}
