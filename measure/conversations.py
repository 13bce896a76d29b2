"""Multi-turn conversations through a gateway, and a tier pool's prefix-cache hit rate from its
replicas' own counters (vLLM's ``vllm:prefix_cache_queries_total`` / ``_hits_total``, in
prompt tokens).

A conversation (``plan``) is a system prompt of a few hundred tokens opened by a nonce of its
own (no two conversations share a cached block: vLLM hashes each block with all before it),
then ``turns`` user turns; each turn sends the whole history so far (the system prompt, every
earlier user turn and the answer it got) plus a new user turn, so turn k's prompt starts with
turn k-1's. The replica that served turn k-1 holds those blocks in its prefix cache (whole
blocks only: 128 tokens on vLLM-CPU); another replica does not.

How a conversation's turns are keyed (``MODES``):

- ``affinity``: one session key for the whole conversation (``x-session-id``): the gateway keeps
  it on its rendezvous-hashing replica (gateway/request/route/endpoint_choice.py);
- ``spread``: a fresh random session key per turn: each turn lands on a replica drawn by the
  hash, as a balancer without affinity spreads a conversation (the gateway has no switch that
  turns affinity off; this is its baseline);
- ``none``: no session key: the gateway's least-loaded choice.

I/O is plain sync httpx; the arithmetic (``pool_cache``, ``Phase``) is pure.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from backends.metrics import TierMetrics, delta, parse_metrics

QUESTIONS = Path(__file__).resolve().parent / "data" / "vicuna_bench_questions.jsonl"
SESSION_HEADER = "x-session-id"  # gateway/request/route/endpoint_choice.py's
MODES = ("affinity", "spread", "none")
SYSTEM_QUESTIONS = 24  # ~450 tokens of system prompt
TURN_QUESTIONS = 6  # ~110 tokens per user turn


def questions(path: Path = QUESTIONS) -> list[str]:
    """The Vicuna questions' first turns, in file order (measure/data, Apache-2.0)."""
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line]


@dataclass(frozen=True)
class Plan:
    """One conversation: its system prompt and its user turns, in order."""

    system: str
    users: tuple[str, ...]


def plan(index: int, nonce: str, texts: Sequence[str], turns: int) -> Plan:
    """Conversation ``index``: a system prompt opened by ``nonce``, then ``turns`` user turns,
    all cut from ``texts`` (cyclically, from an offset of the index's own)."""
    start = index * 7

    def take(offset: int, count: int) -> list[str]:
        return [texts[(start + offset + i) % len(texts)] for i in range(count)]

    system = (
        f"Conversation {nonce}. You are a helpful assistant. Earlier in this session the user "
        "asked about the following topics; keep them in mind:\n- "
        + "\n- ".join(take(0, SYSTEM_QUESTIONS))
    )
    users = tuple(
        "Answer the first of these in one short sentence: "
        + " ".join(take(SYSTEM_QUESTIONS + k * TURN_QUESTIONS, TURN_QUESTIONS))
        for k in range(turns)
    )
    return Plan(system, users)


def session_headers(mode: str, conversation_key: str, new_key: Callable[[], str]) -> dict[str, str]:
    """The session header one turn of a conversation in ``mode`` sends."""
    if mode == "affinity":
        return {SESSION_HEADER: conversation_key}
    if mode == "spread":
        return {SESSION_HEADER: new_key()}
    if mode == "none":
        return {}
    raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")


@dataclass(frozen=True)
class Turn:
    """One answered (or failed) turn: HTTP status (-1: no answer), the ``x-route-tier`` and
    ``x-route-endpoint`` headers, the prompt's tokens (usage), seconds to the whole answer."""

    status: int
    tier: str
    endpoint: str
    prompt_tokens: int
    seconds: float


def converse(
    client: httpx.Client,
    url: str,
    conversation: Plan,
    mode: str,
    *,
    model: str,
    max_tokens: int = 16,
    headers: Mapping[str, str] | None = None,
    new_key: Callable[[], str] = lambda: secrets.token_hex(8),
) -> list[Turn]:
    """Send ``conversation``'s turns to the gateway at ``url`` one after the other (greedy, so
    no shadow copy goes to the tier); stops at the first turn without a 200 (its history would
    be missing an answer)."""
    key = f"conversation-{secrets.token_hex(8)}"
    messages: list[dict[str, str]] = [{"role": "system", "content": conversation.system}]
    turns: list[Turn] = []
    for user in conversation.users:
        messages.append({"role": "user", "content": user})
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        sent = {**(headers or {}), **session_headers(mode, key, new_key)}
        started = time.monotonic()
        try:
            answer = client.post(f"{url}/v1/chat/completions", json=body, headers=sent)
        except httpx.HTTPError:
            turns.append(Turn(-1, "", "", 0, time.monotonic() - started))
            return turns
        seconds = time.monotonic() - started
        route = (answer.headers.get("x-route-tier", ""), answer.headers.get("x-route-endpoint", ""))
        if answer.status_code != 200:
            turns.append(Turn(answer.status_code, *route, 0, seconds))
            return turns
        data = answer.json()
        turns.append(Turn(200, *route, int(data["usage"]["prompt_tokens"]), seconds))
        messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
    return turns


# --------------------------------------------------------------------------- the counters


def scrape(client: httpx.Client, urls: Sequence[str], model: str) -> dict[str, TierMetrics]:
    """Each replica's ``/metrics``, parsed (the model's samples only)."""
    return {url: parse_metrics(client.get(f"{url}/metrics").text, model) for url in urls}


def settled(
    read: Callable[[], dict[str, TierMetrics]],
    before: Mapping[str, TierMetrics],
    requests: int,
    timeout: float = 60.0,
    pause: float = 0.5,
) -> dict[str, TierMetrics]:
    """The replicas' counters once ``requests`` more requests finished across them and two
    reads in a row agree (vLLM records its stats asynchronously); ``TimeoutError`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: dict[str, TierMetrics] | None = None
    while True:
        now = read()
        finished = sum(delta(before[url], now[url]).requests_finished for url in now)
        if finished >= requests and last is not None and _same(last, now):
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"{finished:g} of {requests} requests counted in {timeout:g} s")
        last = now
        time.sleep(pause)


def _same(a: Mapping[str, TierMetrics], b: Mapping[str, TierMetrics]) -> bool:
    keys = ("prefix_cache_queries", "prefix_cache_hits", "requests_finished")
    return all(getattr(a[url], k) == getattr(b[url], k) for url in b for k in keys)


@dataclass(frozen=True)
class PoolCache:
    """Prefix-cache tokens between two reads of a pool's replicas: queried and hit, in all and
    per replica; requests finished per replica."""

    queries: float
    hits: float
    per_replica: dict[str, tuple[float, float]]  # url -> (queries, hits)
    finished: dict[str, float]  # url -> requests finished

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None


def pool_cache(before: Mapping[str, TierMetrics], after: Mapping[str, TierMetrics]) -> PoolCache:
    """The pool's prefix-cache deltas (a replica that restarted counts from zero)."""
    deltas = {url: delta(before[url], after[url]) for url in after}
    return PoolCache(
        queries=sum(d.prefix_cache_queries for d in deltas.values()),
        hits=sum(d.prefix_cache_hits for d in deltas.values()),
        per_replica={u: (d.prefix_cache_queries, d.prefix_cache_hits) for u, d in deltas.items()},
        finished={u: d.requests_finished for u, d in deltas.items()},
    )


@dataclass
class Phase:
    """What one mode's conversations did: their turns, and the pool's counters around them."""

    mode: str
    conversations: list[list[Turn]] = field(default_factory=list)
    cache: list[PoolCache] = field(default_factory=list)  # one per round of this mode

    @property
    def turns(self) -> list[Turn]:
        return [t for c in self.conversations for t in c]

    @property
    def hit_rate(self) -> float | None:
        queries = sum(c.queries for c in self.cache)
        return sum(c.hits for c in self.cache) / queries if queries > 0 else None

    def endpoint_split(self) -> Counter[str]:
        """Answered turns per ``x-route-endpoint``."""
        return Counter(t.endpoint for t in self.turns if t.status == 200)

    def kept(self) -> int:
        """Conversations whose answered turns all came from one endpoint."""
        return sum(
            1 for c in self.conversations if len({t.endpoint for t in c if t.status == 200}) == 1
        )
