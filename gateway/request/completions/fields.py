"""What each top-level request field may do on its way to a tier (pure; the policy's ``fields``).

The fields of vLLM 0.32's ``ChatCompletionRequest`` and ``CompletionRequest`` (the request
schemas of vLLM's OpenAI chat and completion entry points) are each decided:

- OpenAI's own fields and vLLM's sampling and output extensions pass (those that multiply a
  request's cost are bounded by the policy's ``limits``: gateway/request/tokens/costs.py);
- bounded here: ``logprob_token_ids`` (logprobs of chosen tokens at every position) at most
  ``limits.max_logprobs`` ids; ``chat_template_kwargs`` only the keys ``fields.
  chat_template_kwargs`` lists;
- refused with a 400 naming the field, unless the operator lists it in ``fields.allow``: those
  that reach past the client's own request (``cache_salt``, ``kv_transfer_params``,
  ``ec_transfer_params``, ``vllm_xargs``, ``priority``, ``request_id``), text the gateway
  neither counts nor classifies (``documents``, ``chat_template``, ``prompt_embeds``) and the
  multimodal processor's knobs (``mm_processor_kwargs``, ``media_io_kwargs``);
- any other field is dropped, as vLLM ignores fields it does not know (with a warning): no
  extension the gateway has not decided on reaches a tier (``fields.allow`` lets one through).

With ``fields.cache_salt: per_key`` each request sent with an API key carries ``cache_salt``: a
keyed hash (HMAC-SHA256) of the key's digest, so vLLM's prefix cache is never shared between
keys (a timing side channel between tenants). A client's own ``cache_salt``, where the operator
allows it, is folded into its key's. One pass over the top-level keys; the body is changed in
place (it is this request's own).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping
from enum import Enum
from typing import Any

from gateway.errors import INVALID_REQUEST, APIError
from gateway.policy.fields import FieldsPolicy
from gateway.policy.schema import LimitsPolicy
from gateway.request.kind import Kind

SALT_FIELD = "cache_salt"
_SALT_KEY = b"model-optimizer gateway cache_salt v1"


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


class Rule(Enum):
    PASS = "pass"
    REFUSE = "refuse"
    TOKEN_IDS = "token_ids"  # a list of token ids, at most limits.max_logprobs
    TEMPLATE_KWARGS = "template_kwargs"  # an object whose keys the policy lists
    SALT = "salt"  # the client's cache_salt (allowed by the operator): folded into the key's


# OpenAI's request fields (chat and legacy completions), including those vLLM ignores.
_OPENAI_CHAT = _names(
    "messages model frequency_penalty logit_bias logprobs top_logprobs max_tokens "
    "max_completion_tokens n presence_penalty response_format seed stop stream stream_options "
    "temperature top_p tools tool_choice parallel_tool_calls user reasoning_effort functions "
    "function_call metadata store service_tier modalities audio prediction web_search_options "
    "verbosity prompt_cache_key safety_identifier"
)
_OPENAI_COMPLETIONS = _names(
    "model prompt best_of echo frequency_penalty logit_bias logprobs max_tokens n "
    "presence_penalty seed stop stream stream_options suffix temperature top_p user"
)
# vLLM's extensions that act on this request's own sampling and output only.
_VLLM_BOTH = _names(
    "use_beam_search top_k min_p repetition_penalty length_penalty stop_token_ids "
    "include_stop_str_in_output ignore_eos min_tokens skip_special_tokens "
    "spaces_between_special_tokens truncate_prompt_tokens truncation_side prompt_logprobs "
    "allowed_token_ids bad_words structured_outputs response_format add_special_tokens "
    "return_tokens_as_token_ids return_token_ids return_token_offsets repetition_detection "
    "stream_interval thinking_token_budget watermarking session_id routed_experts_prompt_start "
    "mm_payload return_mm_kwargs"
)
_VLLM_CHAT = _names(
    "echo add_generation_prompt continue_final_message include_reasoning return_prompt_text"
)
_REFUSED = _names(
    "cache_salt kv_transfer_params ec_transfer_params vllm_xargs priority request_id documents "
    "chat_template prompt_embeds mm_processor_kwargs media_io_kwargs"
)


def field_rules(fields: FieldsPolicy, chat: bool) -> Mapping[str, Rule]:
    """Each known field's rule for one endpoint under ``fields`` (a field absent: dropped)."""
    return _rules(tuple(fields.allow), fields.cache_salt, chat)


@functools.lru_cache(maxsize=16)
def _rules(allow: tuple[str, ...], cache_salt: str, chat: bool) -> Mapping[str, Rule]:
    rules = dict.fromkeys(_OPENAI_CHAT | _VLLM_CHAT if chat else _OPENAI_COMPLETIONS, Rule.PASS)
    rules.update(dict.fromkeys(_VLLM_BOTH, Rule.PASS))
    rules.update(dict.fromkeys(_REFUSED, Rule.REFUSE))
    rules["logprob_token_ids"] = Rule.TOKEN_IDS
    if chat:
        rules["chat_template_kwargs"] = Rule.TEMPLATE_KWARGS
    else:
        rules.pop("documents")
        rules.pop("chat_template")
    for name in allow:
        if rules.get(name) in (None, Rule.REFUSE):
            rules[name] = Rule.SALT if name == SALT_FIELD else Rule.PASS
    if SALT_FIELD in allow and cache_salt == "off":
        rules[SALT_FIELD] = Rule.PASS
    return rules


def screen_fields(
    body: dict[str, Any],
    kind: Kind,
    fields: FieldsPolicy,
    limits: LimitsPolicy,
    key_digest: str | None,
) -> None:
    """Refuse, bound or drop ``body``'s fields as the module docstring says (in place), and set
    its ``cache_salt`` for the key whose digest is ``key_digest``; ``APIError`` (400) naming a
    refused field."""
    rules = field_rules(fields, kind is Kind.CHAT)
    dropped: list[str] = []
    for name, value in body.items():
        rule = rules.get(name)
        if rule is Rule.PASS:
            continue
        if rule is None:
            dropped.append(name)
        elif rule is Rule.REFUSE:
            raise _refused(name)
        elif rule is Rule.TOKEN_IDS:
            _check_token_ids(name, value, limits.max_logprobs)
        elif rule is Rule.TEMPLATE_KWARGS:
            _check_template_kwargs(value, fields)
        elif rule is Rule.SALT and value is not None and not isinstance(value, str):
            raise APIError(
                400, f"'{name}' must be a string", INVALID_REQUEST, param=name, code="invalid_type"
            )
    for name in dropped:
        del body[name]
    if fields.cache_salt == "per_key" and key_digest is not None:
        salt = key_salt(key_digest)
        own = body.get(SALT_FIELD)
        body[SALT_FIELD] = salt if not own else _keyed(salt.encode(), own)


@functools.lru_cache(maxsize=4096)
def key_salt(key_digest: str) -> str:
    """The ``cache_salt`` of the API key whose sha256 digest is ``key_digest``: stable for one
    key, different between keys, and telling a tier nothing about the key."""
    return _keyed(_SALT_KEY, key_digest)


def _keyed(secret: bytes, text: str) -> str:
    data = text.encode("utf-8", "surrogateescape")
    return hmac.new(secret, data, hashlib.sha256).hexdigest()[:32]


def _check_token_ids(name: str, value: Any, most: int) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise APIError(
            400,
            f"'{name}' must be an array of token ids",
            INVALID_REQUEST,
            param=name,
            code="invalid_type",
        )
    if len(value) > most:
        raise APIError(
            400,
            f"'{name}' asks for {len(value)} token ids per position; at most {most} here",
            INVALID_REQUEST,
            param=name,
            code="invalid_value",
        )


def _check_template_kwargs(value: Any, fields: FieldsPolicy) -> None:
    name = "chat_template_kwargs"
    if value is None or name in fields.allow:
        return
    if not isinstance(value, dict):
        raise APIError(
            400, f"'{name}' must be an object", INVALID_REQUEST, param=name, code="invalid_type"
        )
    for key in value:
        if key not in fields.chat_template_kwargs:
            allowed = ", ".join(fields.chat_template_kwargs) or "none"
            raise APIError(
                400,
                f"'{name}.{key}' is not accepted here (allowed keys: {allowed})",
                INVALID_REQUEST,
                param=f"{name}.{key}",
                code="unsupported_parameter",
            )


def _refused(name: str) -> APIError:
    return APIError(
        400,
        f"'{name}' is not accepted by this gateway",
        INVALID_REQUEST,
        param=name,
        code="unsupported_parameter",
    )
