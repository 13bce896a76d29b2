"""measure/llama_client.py against a fake llama-server (httpx.MockTransport): the calls the
admission check makes, their bodies, and what is read back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from measure import llama_client as llama
from measure.vllm_client import EndpointError

BASE = "http://tier"
NEXT = {(1, 2, 3): 7, (1, 2, 3, 7): 8, (1, 2, 3, 7, 9): 9}  # prefix -> the model's greedy token


def _server(seen: list[dict[str, Any]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        seen.append({"path": request.url.path, **body})
        if request.url.path == "/apply-template":
            return httpx.Response(200, json={"prompt": "<|im_start|>user\\nhi<|im_end|>\\n"})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [1, 2, 3]})
        prompt = tuple(body["prompt"])
        if body["n_predict"] == 1:
            token = NEXT.get(prompt)
            return httpx.Response(200, json={"content": "x", "tokens": [token] if token else []})
        probs = [{"id": 7, "token": " Par"}, {"id": 8, "token": "is"}]
        return httpx.Response(
            200,
            json={"content": " Paris", "tokens": [7, 8], "completion_probabilities": probs},
        )

    return httpx.MockTransport(handle)


def _run(coro_of: Any) -> tuple[Any, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def main() -> Any:
        async with httpx.AsyncClient(transport=_server(seen)) as client:
            return await coro_of(client)

    return asyncio.run(main()), seen


def test_a_chat_prompt_is_rendered_and_tokenized_by_the_server() -> None:
    ids, seen = _run(lambda c: llama.chat_prompt_ids(c, BASE, "hi"))
    assert ids == [1, 2, 3]
    assert [s["path"] for s in seen] == ["/apply-template", "/tokenize"]
    assert seen[1]["parse_special"] is True and seen[1]["add_special"] is True


def test_a_greedy_answer_comes_with_its_ids_and_pieces() -> None:
    answer, seen = _run(lambda c: llama.complete(c, BASE, [1, 2, 3], 8, 0, pieces=True))
    assert answer.token_ids == (7, 8) and answer.pieces == (" Par", "is")
    assert seen[0]["temperature"] == 0 and seen[0]["n_probs"] == 1
    assert seen[0]["return_tokens"] is True and seen[0]["cache_prompt"] is True


def test_teacher_forcing_asks_one_token_after_each_prefix_on_one_slot() -> None:
    tops, seen = _run(lambda c: llama.top1_along(c, BASE, [1, 2, 3], [7, 9, 9], 0, slot=2))
    # after [1,2,3]: 7 (agrees); after [..,7]: 8 (the reference says 9); after [..,7,9]: 9
    assert tops == (7, 8, 9)
    assert [s["prompt"] for s in seen] == [[1, 2, 3], [1, 2, 3, 7], [1, 2, 3, 7, 9]]
    assert {s["id_slot"] for s in seen} == {2}


def test_an_end_of_generation_top_token_differs_from_any_continuation() -> None:
    tops, _ = _run(lambda c: llama.top1_along(c, BASE, [5], [1], 0))
    assert tops == (-1,)


def test_a_server_error_is_one_line() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": "Invalid API Key"}})

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(broken)) as client:
            await llama.complete(client, BASE, [1], 1, 0)

    with pytest.raises(EndpointError, match="HTTP 401"):
        asyncio.run(main())
