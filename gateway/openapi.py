"""The gateway's OpenAPI 3.0 document (``GET /openapi.json``): the routed endpoints, the subset
of OpenAI's request fields the gateway itself reads, and OpenAI's error shape.

Request bodies allow other fields (``additionalProperties``): they travel to vLLM, which
checks them. Schemathesis fuzzes the gateway from this document (tests/unit/gateway).
"""

from __future__ import annotations

from typing import Any

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
MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant"]},
        "content": {"type": "string"},
    },
}
COMMON = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4096},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "stream": {"type": "boolean"},
}
CHAT = {
    "type": "object",
    "required": ["messages"],
    "properties": {"messages": {"type": "array", "minItems": 1, "items": MESSAGE}, **COMMON},
}
COMPLETION = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        **COMMON,
    },
}


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


def openapi_document() -> dict[str, Any]:
    """The document (built on each call; it is small)."""
    plain = {"200": {"description": "ok"}, **_errors(503)}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Model-Optimizer gateway", "version": "1"},
        "paths": {
            "/v1/chat/completions": _completion(CHAT, "Chat completion, routed by class"),
            "/v1/completions": _completion(COMPLETION, "Text completion, routed by class"),
            "/v1/models": {"get": {"summary": "The served model", "responses": plain}},
            "/healthz": {"get": {"summary": "Liveness", "responses": plain}},
            "/readyz": {"get": {"summary": "Readiness: some tier answers", "responses": plain}},
        },
    }
