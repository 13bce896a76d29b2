"""The gateway's OpenAPI 3.0 document (``GET /openapi.json``): the routed endpoints, the subset
of OpenAI's request fields the gateway itself reads, and OpenAI's error shape.

The document is the gateway's contract: a body it calls invalid is refused by the gateway itself
(a 4xx, never forwarded), and a valid one is answered or refused only over a limit (the prompt's
length, the body's size). Request bodies allow other fields (``additionalProperties``): vLLM's
extensions travel to vLLM, which checks them, unless the policy's ``fields`` refuses one (a 400
naming it); a field no tier knows is dropped, as vLLM ignores it
(gateway/request/completions/fields.py). Schemathesis fuzzes the gateway as shipped from this
document (tests/shipped_fuzz.py).
"""

from __future__ import annotations

from typing import Any

from gateway.policy.fields import FieldsPolicy
from gateway.policy.schema import LimitsPolicy
from gateway.request.completions.fields import Rule, field_rules

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}
# A message: its role is the tier's chat template's business (vLLM takes any string); content is
# a string, OpenAI's content parts, or absent / null (an assistant turn with tool calls).
MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, {"type": "array"}], "nullable": True},
    },
}
# null is the same as absent for each of these. max_tokens has no maximum: past what fits, the
# policy's on_max_tokens_too_large clamps it (or refuses it: 400 context_length_exceeded).
COMMON = {
    "model": {"type": "string", "nullable": True},
    "max_tokens": {"type": "integer", "minimum": 1, "nullable": True},
    "temperature": {"type": "number", "minimum": 0, "nullable": True},
    "stream": {"type": "boolean", "nullable": True},
}


def _count(least: int, most: int | None) -> dict[str, Any]:
    """An integer field in [least, most] (no maximum where the policy is unknown)."""
    bounds = {"minimum": least} | ({"maximum": most} if most is not None else {})
    return {"type": "integer", "nullable": True, **bounds}


def _bounded(limits: LimitsPolicy | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields the gateway bounds by the policy's ``limits`` (gateway/request/tokens/costs.py),
    for chat and for completions. Left out: ``best_of`` (it must be >= ``n``) and ``echo`` (it
    counts ``logprobs`` as prompt logprobs): bounds across two fields, which JSON Schema cannot
    state; the gateway checks them all the same."""
    top = limits.max_logprobs if limits else None
    common = {
        "n": _count(1, limits.max_n if limits else None),
        "prompt_logprobs": _count(0, limits.max_prompt_logprobs if limits else None),
    }
    tools: dict[str, Any] = {"type": "array", "nullable": True}
    if limits is not None:
        tools["maxItems"] = limits.max_tools
    chat = {
        **common,
        "max_completion_tokens": _count(1, None),
        "logprobs": {"type": "boolean", "nullable": True},
        "top_logprobs": _count(0, top),
        "tools": tools,
    }
    return chat, {**common, "logprobs": _count(0, top)}


def _screened(fields: FieldsPolicy, limits: LimitsPolicy | None, chat: bool) -> dict[str, Any]:
    """The fields the policy's ``fields`` screens (gateway/request/completions/fields.py): a refused
    one may take no value at all (``not: {}``: a client must leave it out), ``logprob_token_ids``
    at most ``max_logprobs`` ids, ``chat_template_kwargs`` only the keys the policy lists."""
    out: dict[str, Any] = {}
    for name, rule in sorted(field_rules(fields, chat).items()):
        if rule is Rule.REFUSE:
            out[name] = {"not": {}, "description": "refused by this gateway's policy (fields)"}
        elif rule is Rule.TOKEN_IDS:
            ids: dict[str, Any] = {"type": "integer", "minimum": 0}
            out[name] = {"type": "array", "items": ids, "nullable": True}
            if limits is not None:
                out[name]["maxItems"] = limits.max_logprobs
        elif rule is Rule.TEMPLATE_KWARGS and name not in fields.allow:
            keys: dict[str, Any] = {key: {} for key in fields.chat_template_kwargs}
            out[name] = {
                "type": "object",
                "properties": keys,
                "additionalProperties": False,
                "nullable": True,
            }
    return out


def _bodies(
    model_name: str | None, limits: LimitsPolicy | None, fields: FieldsPolicy
) -> tuple[dict[str, Any], ...]:
    """The chat and completions request schemas."""
    common = dict(COMMON)
    if model_name is not None:
        common["model"] = {"type": "string", "enum": [model_name], "nullable": True}
    chat_bounded, completion_bounded = _bounded(limits)
    chat_bounded |= _screened(fields, limits, chat=True)
    completion_bounded |= _screened(fields, limits, chat=False)
    chat = {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
            **common,
            **chat_bounded,
        },
    }
    many: dict[str, Any] = {"type": "array", "minItems": 1}
    if limits is not None:
        many["maxItems"] = limits.max_prompts
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer"}}
    prompt = {
        "oneOf": [
            {"type": "string"},
            {**many, "items": {"type": "string"}},
            token_ids,  # one prompt as token ids
            {**many, "items": {"type": "array", "items": {"type": "integer"}}},
        ]
    }
    completion = {
        "type": "object",
        "required": ["prompt"],
        "properties": {"prompt": prompt, **common, **completion_bounded},
    }
    return chat, completion


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": "an error in OpenAI's shape",
            "content": {"application/json": {"schema": ERROR}},
        }
        for status in statuses
    }


def _completion(body: dict[str, Any], summary: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {"description": "the tier's answer (JSON, or SSE when streaming)"},
                **_errors(400, 401, 404, 413, 429, 503, 504),
            },
        }
    }


def openapi_document(
    model_name: str | None = None,
    limits: LimitsPolicy | None = None,
    fields: FieldsPolicy | None = None,
) -> dict[str, Any]:
    """The document (built on each call; it is small). With ``model_name``, ``model`` must be
    it (absent means it too); ``limits``: the policy's bounds (a list ``prompt``'s length,
    ``n``, logprobs, tools), absent ones unbounded; ``fields``: what the policy refuses or
    bounds (absent: the defaults)."""
    plain = {"200": {"description": "ok"}, **_errors(503)}
    chat, completion = _bodies(model_name, limits, fields or FieldsPolicy())
    return {
        "openapi": "3.0.3",
        "info": {"title": "Model-Optimizer gateway", "version": "1"},
        "paths": {
            "/v1/chat/completions": _completion(chat, "Chat completion, routed by class"),
            "/v1/completions": _completion(completion, "Text completion, routed by class"),
            "/v1/models": {"get": {"summary": "The served model", "responses": plain}},
            "/healthz": {"get": {"summary": "Liveness", "responses": plain}},
            "/readyz": {"get": {"summary": "Readiness: some tier answers", "responses": plain}},
        },
    }
