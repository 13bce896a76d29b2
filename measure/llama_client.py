"""The few llama-server calls the admission check makes (the vLLM ones: measure/vllm_client.py).

llama-server (llama.cpp 0c1e570) has no prompt log-probabilities, so a continuation is scored
teacher-forced one position at a time: ``/completion`` with the prompt plus the first ``k``
tokens of the continuation, one greedy token (``n_predict: 1``, temperature 0: llama.cpp takes
the argmax), which is the model's top-1 at position ``k``. ``cache_prompt`` keeps the slot's KV
cache, so each step evaluates one new token. Chat prompts are rendered by the server's own
template (``/apply-template``) and tokenized by it (``/tokenize``, special tokens parsed, BOS as
the model asks). Every call carries the tier's key (llama-server wants it on every route but
``/health``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from measure.vllm_client import Answer, EndpointError, post

_TOKENS = "tokens"


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        raise EndpointError(f"{response.request.url}: the answer is not JSON") from None
    if not isinstance(data, dict):
        raise EndpointError(f"{response.request.url}: the answer is not a JSON object")
    return data


def _ids(data: dict[str, Any], where: str) -> list[int]:
    tokens = data.get(_TOKENS)
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise EndpointError(f"{where}: no token list in the answer")
    return tokens


async def chat_prompt_ids(client: httpx.AsyncClient, base: str, text: str) -> list[int]:
    """A one-message chat rendered by the server's template, assistant turn opened, as ids."""
    body = {"messages": [{"role": "user", "content": text}]}
    prompt = _json(await post(client, f"{base}/apply-template", body)).get("prompt")
    if not isinstance(prompt, str):
        raise EndpointError(f"{base}/apply-template: no prompt in the answer")
    tokenized = {"content": prompt, "add_special": True, "parse_special": True}
    return _ids(_json(await post(client, f"{base}/tokenize", tokenized)), f"{base}/tokenize")


async def complete(
    client: httpx.AsyncClient,
    base: str,
    prompt_ids: Sequence[int],
    max_tokens: int,
    seed: int,
    *,
    slot: int | None = None,
    pieces: bool = False,
) -> Answer:
    """A greedy completion of a token-id prompt, its token ids included (with ``pieces`` each
    token's text too). ``slot`` pins the request to one of the server's slots, so a sequence
    of requests extending one prompt finds it in that slot's cache."""
    body: dict[str, Any] = {
        "prompt": list(prompt_ids),
        "n_predict": max_tokens,
        "temperature": 0,
        "seed": seed,
        "return_tokens": True,
        "cache_prompt": True,
    }
    if slot is not None:
        body["id_slot"] = slot
    if pieces:
        body["n_probs"] = 1
    url = f"{base}/completion"
    data = _json(await post(client, url, body))
    ids = _ids(data, url)
    probs = data.get("completion_probabilities")
    texts: tuple[str, ...] = ()
    if pieces and isinstance(probs, list) and len(probs) == len(ids):
        texts = tuple(str(p.get("token", "")) if isinstance(p, dict) else "" for p in probs)
    return Answer(
        text=str(data.get("content") or ""),
        token_ids=tuple(ids),
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(ids),
        headers={},
        pieces=texts,
    )


async def top1_along(
    client: httpx.AsyncClient,
    base: str,
    prompt_ids: Sequence[int],
    continuation: Sequence[int],
    seed: int,
    slot: int | None = None,
) -> tuple[int, ...]:
    """The model's top-1 token at each position of ``continuation`` after ``prompt_ids`` (one
    request a position, in order, on one slot: each evaluates one new token)."""
    out = []
    for k in range(len(continuation)):
        prefix = [*prompt_ids, *continuation[:k]]
        answer = await complete(client, base, prefix, 1, seed, slot=slot)
        if len(answer.token_ids) != 1:
            # An end-of-generation token is not returned as a token: it is the top-1 here,
            # and it differs from the continuation's (which goes on).
            out.append(-1)
            continue
        out.append(answer.token_ids[0])
    return tuple(out)
