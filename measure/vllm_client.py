"""The few vLLM / OpenAI calls the evaluations make, over one ``httpx.AsyncClient``.

Every request is greedy (temperature 0) with a fixed ``seed``. ``/tokenize`` is vLLM's own
endpoint (tiers only: the gateway forwards no other path than the OpenAI ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from measure.logprobs import Scored, parse_continuation


class EndpointError(RuntimeError):
    """A tier or the gateway answered something unusable: one line, naming the URL."""


@dataclass(frozen=True)
class Answer:
    text: str
    token_ids: tuple[int, ...]  # the generated tokens, when the server returned them
    prompt_tokens: int
    completion_tokens: int
    headers: dict[str, str]
    pieces: tuple[str, ...] = ()  # each generated token's text, when asked for


async def post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> httpx.Response:
    try:
        response = await client.post(url, json=body)
    except httpx.HTTPError as exc:
        raise EndpointError(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise EndpointError(f"{url}: HTTP {response.status_code}: {response.text[:200]!r}")
    return response


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        raise EndpointError(f"{response.request.url}: the answer is not JSON") from None
    if not isinstance(data, dict):
        raise EndpointError(f"{response.request.url}: the answer is not a JSON object")
    return data


async def served_model(client: httpx.AsyncClient, base: str) -> str:
    try:
        response = await client.get(f"{base}/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise EndpointError(f"{base}/v1/models: no served model ({exc})") from None


async def tokenize(
    client: httpx.AsyncClient, base: str, model: str, text: str | None = None, chat: str = ""
) -> list[int]:
    """``text``'s token ids (no special tokens added), or with ``chat`` the ids of a one-message
    chat rendered by the model's template with the assistant's turn opened."""
    body: dict[str, Any] = {"model": model}
    if chat:
        body |= {"messages": [{"role": "user", "content": chat}], "add_generation_prompt": True}
    else:
        body |= {"prompt": text or "", "add_special_tokens": False}
    data = _json(await post(client, f"{base}/tokenize", body))
    tokens = data.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise EndpointError(f"{base}/tokenize: no token list in the answer")
    return tokens


async def score(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    prompt_ids: Sequence[int],
    continuation_ids: Sequence[int],
    seed: int,
) -> Scored:
    """Log-probabilities and top-1 tokens of ``continuation_ids`` after ``prompt_ids``."""
    ids = [*prompt_ids, *continuation_ids]
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0,
        "seed": seed,
        "prompt_logprobs": 1,
    }
    data = _json(await post(client, f"{base}/v1/completions", body))
    try:
        return parse_continuation(data["choices"][0], ids, max(len(prompt_ids), 1))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EndpointError(f"{base}/v1/completions: prompt_logprobs: {exc}") from None


async def complete(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    prompt: str | Sequence[int],
    max_tokens: int,
    seed: int,
    stop: Sequence[str] = (),
    pieces: bool = False,
) -> Answer:
    """A greedy completion of a text or token-id prompt (generated token ids included; with
    ``pieces`` each token's text too, from the completions API's ``logprobs``)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "return_token_ids": True,
    }
    if stop:
        body["stop"] = list(stop)
    if pieces:
        body["logprobs"] = 1
    response = await post(client, f"{base}/v1/completions", body)
    answer = _answer(response, "text")
    if not pieces:
        return answer
    try:
        tokens = response.json()["choices"][0]["logprobs"]["tokens"]
    except (KeyError, IndexError, TypeError, ValueError):
        return answer
    if not isinstance(tokens, list):
        return answer
    return dataclasses.replace(answer, pieces=tuple(str(t) for t in tokens))


async def chat(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    question: str,
    max_tokens: int,
    seed: int,
) -> Answer:
    """A greedy one-message chat answer, with the response headers (``x-route-*``)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "return_token_ids": True,
    }
    response = await post(client, f"{base}/v1/chat/completions", body)
    return _answer(response, "message")


def _answer(response: httpx.Response, kind: str) -> Answer:
    data = _json(response)
    try:
        choice = data["choices"][0]
        text = choice["text"] if kind == "text" else choice["message"]["content"]
        usage = data["usage"]
        ids = choice.get("token_ids") or ()
        return Answer(
            str(text or ""),
            tuple(int(i) for i in ids),
            int(usage["prompt_tokens"]),
            int(usage["completion_tokens"]),
            {k.lower(): v for k, v in response.headers.items()},
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EndpointError(f"{response.request.url}: unexpected answer ({exc})") from None
