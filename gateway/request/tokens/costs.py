"""Client fields that multiply what a request costs a tier, checked against the policy (pure).

``request_cost(body, kind, limits)`` checks the fields below against the routing policy's
``limits`` section and returns the request's cost: the sequences the tier will generate,
``prompts x max(n, best_of)``, which the per-key rate limit counts (gateway/auth.py).
A field out of bounds is a 400 in OpenAI's shape naming it (``param``), code ``invalid_type``
for a wrong type and ``invalid_value`` for a value past a limit:

- ``stream``: a boolean (or absent or null), so that the gateway (which streams only for
  ``true``) and vLLM (which would stream for ``1``) never disagree;
- ``temperature``: a number, at least 0 (or absent or null), as the gateway reads it to tell a
  greedy request for shadow sampling (vLLM refuses a negative one too);
- ``n``: 1 to ``max_n`` completions per prompt; ``best_of`` (completions): ``n`` to
  ``max_best_of`` candidates per prompt;
- a list ``prompt`` (completions): at most ``max_prompts`` prompts, each generated for (its
  tokens are counted as the longest prompt's for the context limits);
- ``logprobs`` (completions: a count; chat: a boolean) and ``top_logprobs`` (chat): 0 to
  ``max_logprobs``;
- ``prompt_logprobs`` (vLLM's extension), and completions' ``echo`` with ``logprobs`` (which vLLM
  turns into prompt logprobs): at most ``max_prompt_logprobs``; 0 turns them off (a tier then
  computes logprobs over the whole vocabulary for every prompt token);
- ``tools``: an array of at most ``max_tools`` (their schemas count as prompt tokens:
  gateway/request/route/plan.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import INVALID_REQUEST, APIError
from gateway.policy.schema import LimitsPolicy
from gateway.request.kind import Kind


def request_cost(body: Mapping[str, Any], kind: Kind, limits: LimitsPolicy) -> int:
    """The sequences ``body`` asks a tier to generate; ``APIError`` (400) for a field out of
    bounds (see the module docstring)."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid_type("stream", "a boolean")
    temperature = body.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, int | float) or isinstance(temperature, bool):
            raise _invalid_type("temperature", "a number")
        if not temperature >= 0:
            raise _invalid_value("temperature", f"'temperature' is {temperature}; it must be >= 0")
    n = count_field(body, "n", 1, limits.max_n, default=1)
    sequences = n
    if kind is not Kind.CHAT:
        best_of = count_field(body, "best_of", n, limits.max_best_of, default=n)
        sequences = max(n, best_of)
    if kind is Kind.CHAT:
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _invalid_type("logprobs", "a boolean")
        count_field(body, "top_logprobs", 0, limits.max_logprobs, default=0)
        echoed = 0
    else:
        logprobs_count = count_field(body, "logprobs", 0, limits.max_logprobs, default=0)
        echoed = logprobs_count if body.get("echo") is True else 0
    prompt_logprobs = count_field(body, "prompt_logprobs", 0, None, default=0)
    if max(prompt_logprobs, echoed) > limits.max_prompt_logprobs:
        field = "prompt_logprobs" if prompt_logprobs >= echoed else "echo"
        allowed = limits.max_prompt_logprobs
        what = "prompt logprobs are off" if not allowed else f"at most {allowed} are allowed"
        asked = max(prompt_logprobs, echoed)
        raise _invalid_value(
            field, f"'{field}' asks for {asked} logprobs per prompt token; {what} here"
        )
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _invalid_type("tools", "an array")
        if len(tools) > limits.max_tools:
            raise _invalid_value(
                "tools", f"'tools' has {len(tools)} entries; at most {limits.max_tools} here"
            )
    return sequences * _prompts(body, kind, limits)


def _prompts(body: Mapping[str, Any], kind: Kind, limits: LimitsPolicy) -> int:
    """How many prompts the body holds (a list of strings or of token-id lists: each)."""
    prompt = body.get("prompt") if kind is not Kind.CHAT else None
    if not isinstance(prompt, list) or not prompt:
        return 1
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return 1  # one prompt given as token ids
    if len(prompt) > limits.max_prompts:
        raise _invalid_value(
            "prompt", f"'prompt' holds {len(prompt)} prompts; at most {limits.max_prompts} here"
        )
    return len(prompt)


def count_field(
    body: Mapping[str, Any], field: str, least: int, most: int | None, *, default: int
) -> int:
    """The integer ``body[field]`` (``default`` when absent or null) within [least, most];
    ``APIError`` (400 ``invalid_type`` / ``invalid_value``) naming the field otherwise."""
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid_type(field, "an integer")
    if value < least or (most is not None and value > most):
        bounds = f"from {least} to {most}" if most is not None else f"at least {least}"
        raise _invalid_value(field, f"'{field}' is {value}; it must be {bounds} here")
    return value


def _invalid_type(field: str, what: str) -> APIError:
    return APIError(
        400, f"'{field}' must be {what}", INVALID_REQUEST, param=field, code="invalid_type"
    )


def _invalid_value(field: str, message: str) -> APIError:
    return APIError(400, message, INVALID_REQUEST, param=field, code="invalid_value")
