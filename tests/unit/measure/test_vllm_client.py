"""measure/vllm_client.py against a stub transport answering in vLLM's shapes."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from measure import vllm_client as api


def handler(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    if request.url.path == "/tokenize":
        tokens = [1, 2, 3] if "messages" in body else [7] * len(body["prompt"])
        return httpx.Response(200, json={"count": len(tokens), "tokens": tokens})
    if request.url.path == "/v1/completions" and "prompt_logprobs" in body:
        ids = body["prompt"]
        entries = [None] + [
            {str(t): {"logprob": -0.5, "rank": 1, "decoded_token": "x"}} for t in ids[1:]
        ]
        return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": entries}]})
    if request.url.path == "/v1/chat/completions":
        return httpx.Response(
            200,
            headers={"x-route-class": "code", "x-route-tier": "fp16"},
            json={
                "choices": [{"message": {"content": "hi"}, "token_ids": [5, 6]}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            },
        )
    return httpx.Response(400, json={"error": {"message": "bad"}})


async def calls() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        base = "http://tier"
        assert await api.tokenize(client, base, "m", "abcd") == [7, 7, 7, 7]
        assert await api.tokenize(client, base, "m", chat="q") == [1, 2, 3]
        scored = await api.score(client, base, "m", [1, 2], [3, 4], seed=0)
        assert scored.logprobs == (-0.5, -0.5) and scored.top1 == (3, 4)
        answer = await api.chat(client, base, "m", "q", 8, 0)
        assert answer.text == "hi" and answer.token_ids == (5, 6)
        assert (answer.prompt_tokens, answer.completion_tokens) == (3, 2)
        assert answer.headers["x-route-class"] == "code"
        with pytest.raises(api.EndpointError, match="HTTP 400"):
            await api.post(client, f"{base}/other", {})


def test_calls_in_vllms_shapes() -> None:
    asyncio.run(calls())
