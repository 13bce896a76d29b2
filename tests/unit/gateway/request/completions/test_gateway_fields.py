"""Request fields on their way to a tier: passed, bounded, refused naming the field, or dropped;
the prefix cache salted per API key (gateway/request/completions/fields.py, the policy's
``fields``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.config import hash_key
from gateway.errors import APIError
from gateway.policy.fields import FieldsPolicy
from gateway.policy.schema import LimitsPolicy, parse_policy
from gateway.request.completions.fields import key_salt, screen_fields
from gateway.request.kind import Kind
from model_optimizer.envs import ROOT

MESSAGES = [{"role": "user", "content": "Hi"}]
LIMITS = LimitsPolicy()  # max_logprobs 20
DIGEST_A, DIGEST_B = hash_key("sk-a"), hash_key("sk-b")


def _screen(body: dict[str, Any], fields: FieldsPolicy | None = None, **kw: Any) -> dict[str, Any]:
    kind = kw.pop("kind", Kind.CHAT)
    screen_fields(body, kind, fields or FieldsPolicy(), LIMITS, kw.pop("digest", None))
    return body


def _refusal(body: dict[str, Any], fields: FieldsPolicy | None = None, **kw: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        _screen(body, fields, **kw)
    assert caught.value.status == 400
    return caught.value


def test_openai_fields_and_vllm_sampling_extensions_pass() -> None:
    body = {
        "messages": MESSAGES, "model": "m", "temperature": 0.2, "top_p": 0.9, "tools": [],
        "stream_options": {"include_usage": True}, "top_k": 40, "min_p": 0.1,
        "repetition_penalty": 1.1, "min_tokens": 2, "ignore_eos": False, "stop_token_ids": [2],
        "structured_outputs": {"json": {}}, "add_generation_prompt": True,
    }  # fmt: skip
    assert _screen(dict(body)) == body
    completion = {"prompt": "Hi", "best_of": 2, "echo": False, "suffix": "x", "top_k": 3}
    assert _screen(dict(completion), kind=Kind.COMPLETIONS) == completion


def test_logprob_token_ids_are_bounded_by_max_logprobs() -> None:
    assert _screen({"messages": MESSAGES, "logprob_token_ids": list(range(20))})
    error = _refusal({"messages": MESSAGES, "logprob_token_ids": list(range(128))})
    assert error.param == "logprob_token_ids" and error.code == "invalid_value"
    assert "128" in error.message and "20" in error.message
    wrong = _refusal({"prompt": "x", "logprob_token_ids": "1,2"}, kind=Kind.COMPLETIONS)
    assert wrong.param == "logprob_token_ids" and wrong.code == "invalid_type"


@pytest.mark.parametrize(
    "field",
    ["cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "priority",
     "request_id", "documents", "chat_template", "mm_processor_kwargs"],
)  # fmt: skip
def test_extensions_reaching_past_the_request_are_refused_naming_the_field(field: str) -> None:
    error = _refusal({"messages": MESSAGES, field: {"a": 1}})
    assert error.param == field and error.code == "unsupported_parameter"
    assert f"'{field}'" in error.message and "\n" not in error.message


def test_prompt_embeds_are_refused_on_completions() -> None:
    assert _refusal({"prompt": "", "prompt_embeds": "AAAA"}, kind=Kind.COMPLETIONS).param == (
        "prompt_embeds"
    )


def test_the_operator_may_allow_a_refused_field_or_an_unknown_one() -> None:
    fields = FieldsPolicy(allow=["priority", "request_id", "cache_prompt"])
    body = {"messages": MESSAGES, "priority": -5, "request_id": "r", "cache_prompt": True}
    assert _screen(dict(body), fields) == body
    assert _refusal({"messages": MESSAGES, "vllm_xargs": {}}, fields).param == "vllm_xargs"


def test_chat_template_kwargs_pass_only_the_keys_the_policy_lists() -> None:
    fields = FieldsPolicy(chat_template_kwargs=["enable_thinking"])
    ok = {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    assert _screen(dict(ok), fields) == ok
    error = _refusal({"messages": MESSAGES, "chat_template_kwargs": {"tools": "x"}}, fields)
    assert error.param == "chat_template_kwargs.tools"
    assert _refusal({"messages": MESSAGES, "chat_template_kwargs": {"a": 1}}).param == (
        "chat_template_kwargs.a"  # none by default
    )
    everything = FieldsPolicy(allow=["chat_template_kwargs"])
    assert _screen({"messages": MESSAGES, "chat_template_kwargs": {"a": 1}}, everything)


def test_unknown_fields_are_dropped_as_vllm_ignores_them() -> None:
    body = _screen({"messages": MESSAGES, "guided_json": {}, "foo": 1, "id_slot": 0})
    assert body == {"messages": MESSAGES}
    # a chat-only extension is unknown to completions
    assert _screen({"prompt": "x", "chat_template_kwargs": {}}, kind=Kind.COMPLETIONS) == {
        "prompt": "x"
    }


def test_cache_salt_is_a_keyed_hash_per_key_stable_and_not_the_key() -> None:
    a1 = _screen({"messages": MESSAGES}, digest=DIGEST_A)["cache_salt"]
    a2 = _screen({"messages": MESSAGES}, digest=DIGEST_A)["cache_salt"]
    b = _screen({"messages": MESSAGES}, digest=DIGEST_B)["cache_salt"]
    assert a1 == a2 == key_salt(DIGEST_A) and a1 != b
    assert "sk-a" not in a1 and DIGEST_A[:16] not in a1
    assert "cache_salt" not in _screen({"messages": MESSAGES})  # no key: one tenant
    off = FieldsPolicy(cache_salt="off")
    assert "cache_salt" not in _screen({"messages": MESSAGES}, off, digest=DIGEST_A)


def test_a_client_salt_the_operator_allows_is_folded_into_its_keys() -> None:
    allowed = FieldsPolicy(allow=["cache_salt"])
    one = _screen({"messages": MESSAGES, "cache_salt": "s1"}, allowed, digest=DIGEST_A)
    other = _screen({"messages": MESSAGES, "cache_salt": "s1"}, allowed, digest=DIGEST_B)
    assert one["cache_salt"] not in ("s1", other["cache_salt"], key_salt(DIGEST_A))
    passed = FieldsPolicy(allow=["cache_salt"], cache_salt="off")
    assert _screen({"messages": MESSAGES, "cache_salt": "s1"}, passed)["cache_salt"] == "s1"


def test_the_shipped_policy_salts_per_key_and_lets_no_extension_through() -> None:
    policy = parse_policy((ROOT / "policies" / "routing.yaml").read_text())
    assert policy.fields == FieldsPolicy()
    routes = "{tolerant: [a], code: [a], math: [a], long: [a]}"
    assert parse_policy(f"tiers: [a]\nroutes: {routes}\n").fields.cache_salt == "per_key"


def test_the_tier_sees_the_keys_salt_never_the_clients(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, api_key_hashes=[hash_key("sk-a"), hash_key("sk-b")])
    url = f"{gateway}/v1/chat/completions"
    seen = []
    for key in ("sk-a", "sk-a", "sk-b"):
        auth = {"Authorization": f"Bearer {key}", "X-Request-Id": "chosen"}
        answer = client.post(url, json={"messages": MESSAGES, "top_k": 5}, headers=auth)
        assert answer.status_code == 200
        seen.append(stub.last_request["body"]["cache_salt"])
        assert stub.last_request["body"]["top_k"] == 5
        assert "x-request-id" not in stub.last_request["headers"]
    assert seen[0] == seen[1] != seen[2]
    auth = {"Authorization": "Bearer sk-a"}
    refused = client.post(url, json={"messages": MESSAGES, "cache_salt": "x"}, headers=auth)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "cache_salt" and error["type"] == "invalid_request_error"
    assert len(stub.requests) == 3
