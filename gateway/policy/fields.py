"""The policy's ``fields`` section: which request fields a client may send a tier, and the
prefix cache's salt per API key (what each field does: gateway/request/completions/fields.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.operator_yaml import Section


class FieldsPolicy(Section):
    """Request fields past OpenAI's own (see policies/routing.yaml)."""

    # per_key: each upstream request carries vLLM's cache_salt, a keyed hash of its API key, so
    # prefix caching is never shared between keys; off: none added (one cache for everyone).
    cache_salt: Literal["per_key", "off"] = "per_key"
    # Field names let through as the client wrote them: vLLM extensions refused by default
    # (priority, request_id, ...) or fields no tier of this gateway's knows (llama.cpp's own).
    allow: list[str] = Field(default_factory=list)
    # Keys a client may put in chat_template_kwargs (e.g. enable_thinking); any other: 400.
    chat_template_kwargs: list[str] = Field(default_factory=list)
