"""Watching a streamed answer for degeneration, holding back the text not yet checked.

A ``StreamWatch`` sits in the relay (gateway/request/stream/relay.py) between a watched tier and the
client. It is fed complete SSE events; it keeps the answer's text, runs the policy's detectors
(gateway/request/stream/degeneration.py) each time the text grows, and lets an event go to the
client only once ``holdback`` more characters have followed it unflagged (or the answer ends:
its finish, usage and ``[DONE]`` events release everything). So a loop or a run of garbage
found within the held text is never sent: on a verdict the watch releases the events up to the
verdict's cut (the one the cut falls in shortened to it), drops the rest and sets ``verdict``;
the relay then continues the answer on the next tier from the text sent
(gateway/request/stream/resume.py). A verdict whose cut falls in text already sent cuts where the
sent text ends: nothing the client has is taken back or sent twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import SERVER_ERROR, APIError
from gateway.policy.escalation import EscalationPolicy
from gateway.request.events.chunk import read_chunk
from gateway.request.events.sse import encode, payloads
from gateway.request.stream.degeneration import (
    LOOKBACK,
    ConfidenceCheck,
    Degeneration,
    LoopCheck,
    LowConfidence,
    ScriptCheck,
    find_loop,
    find_script_mix,
)

KEEP = 2 * LOOKBACK  # characters of the answer's tail kept for the checks (plus the holdback)


@dataclass
class _Held:
    raw: bytes  # the event as it came
    event: Mapping[str, Any] | None  # parsed, when it carries text
    start: int  # its text's span in the answer's text
    end: int


class StreamWatch:
    """One streamed answer's watch (see the module docstring)."""

    def __init__(
        self,
        loop: LoopCheck | None,
        scripts: ScriptCheck | None,
        holdback: int,
        chat: bool,
        confidence: ConfidenceCheck | None = None,
    ) -> None:
        self.loop, self.scripts, self.holdback, self.chat = loop, scripts, holdback, chat
        # Only an answer that carries its tokens' logprobs (the client asked) is checked.
        self._confidence = LowConfidence(confidence) if confidence is not None else None
        # The answer's text (sent, then held) is kept as its tail: ``text`` starts at character
        # ``_base`` of the answer. Positions (``sent``, the held spans, cuts) count from the
        # answer's start.
        self.text = ""
        self._base = 0
        self.sent = 0  # characters of the answer the client has
        self._held: list[_Held] = []
        self.verdict: Degeneration | None = None
        self._keep = KEEP + holdback

    @property
    def end(self) -> int:
        """Characters of the answer so far."""
        return self._base + len(self.text)

    def feed(self, events: bytes) -> bytes:
        """Complete events in, the events that may go to the client now out."""
        ending = False
        for data in payloads(events):
            event, text, last, logprobs = self._read(data)
            start = self.end
            self.text += text
            self._held.append(_Held(encode(data), event, start, self.end))
            ending = ending or last
            verdict = self._check() if text else None
            if verdict is None and logprobs and self._confidence is not None:
                verdict = self._confidence.add(logprobs, start)
            if verdict is not None:
                return self._cut(verdict)
        out = self._release(self.end if ending else self.end - self.holdback)
        if len(self.text) > 2 * self._keep:  # a bounded tail: the checks read no further back
            drop = min(len(self.text) - self._keep, self.sent - self._base)
            self.text, self._base = self.text[drop:], self._base + drop
        return out

    def flush(self) -> bytes:
        """The stream ended without a finish: everything held may go."""
        return self._release(self.end)

    def resume(self) -> None:
        """The answer goes on on another tier from the text sent: what was held is dropped
        (never sent), the verdict forgotten."""
        self._held = []
        self.text = self.text[: self.sent - self._base]
        self.verdict = None
        if self._confidence is not None:
            self._confidence.clear()

    def _read(self, data: bytes) -> tuple[Mapping[str, Any] | None, str, bool, list[float]]:
        """(the event, when it carries text; its text, whether it ends the answer, its tokens'
        logprobs)."""
        chunk = read_chunk(data, self.chat)
        if chunk.done:
            return None, "", True, []
        if chunk.body is None:
            return None, "", False, []
        choices = chunk.choices
        if not choices or choices[0].body is None:
            return None, "", bool(chunk.body.get("usage")), []
        choice = choices[0]
        logprobs = choice.logprobs if self._confidence is not None else []
        text = choice.text
        return (chunk.body if text else None), text, choice.finished, logprobs

    def _check(self) -> Degeneration | None:
        """A verdict on the text kept, its cut counted from the answer's start."""
        found = find_loop(self.text, self.loop) if self.loop is not None else None
        if found is None and self.scripts is not None:
            found = find_script_mix(self.text, self.scripts)
        if found is None:
            return None
        return Degeneration(found.kind, self._base + found.cut, found.detail)

    def _release(self, upto: int) -> bytes:
        out = []
        while self._held and self._held[0].end <= upto:
            held = self._held.pop(0)
            out.append(held.raw)
            self.sent = held.end
        return b"".join(out)

    def _cut(self, verdict: Degeneration) -> bytes:
        cut = max(verdict.cut, self.sent)
        out = []
        for held in self._held:
            if held.end <= cut:
                out.append(held.raw)
            elif held.start < cut and held.event is not None:
                out.append(self._shortened(held, cut))
        self._held = []
        self.text = self.text[: cut - self._base]
        self.sent = cut
        self.verdict = Degeneration(verdict.kind, cut, verdict.detail)
        return b"".join(out)

    def _shortened(self, held: _Held, cut: int) -> bytes:
        assert held.event is not None
        event = dict(held.event)
        choice = dict(event["choices"][0])
        kept = self.text[held.start - self._base : cut - self._base]
        if self.chat:
            choice["delta"] = {**choice.get("delta", {}), "content": kept}
        else:
            choice["text"] = kept
        if isinstance(choice.get("logprobs"), dict):  # only the tokens of the text kept
            choice["logprobs"] = _logprobs_within(choice["logprobs"], len(kept), self.chat)
        choice["finish_reason"] = None
        event["choices"] = [choice, *event["choices"][1:]]
        return encode(json.dumps(event, ensure_ascii=False).encode())


def _logprobs_within(logprobs: dict[str, Any], chars: int, chat: bool) -> dict[str, Any]:
    """An event's ``logprobs`` for its first tokens whose text ends within ``chars``
    characters (a token cut through is left out with the rest)."""
    tokens = logprobs.get("content") if chat else logprobs.get("tokens")
    if not isinstance(tokens, list):
        return logprobs
    keep, end = 0, 0
    for token in tokens:
        text = token.get("token") if chat and isinstance(token, dict) else token
        end += len(text) if isinstance(text, str) else chars + 1
        if end > chars:
            break
        keep += 1
    if chat:
        return {**logprobs, "content": tokens[:keep]}
    lists = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {**logprobs, **{k: v[:keep] for k in lists if isinstance(v := logprobs.get(k), list)}}


class Degenerated(APIError):
    """A watched tier's answer degenerated (gateway/request/stream/stream_watch.py): it is continued
    on the next tier, or, with none left that answers, ended as a failure."""

    def __init__(self, tier: str, verdict: Degeneration) -> None:
        super().__init__(
            502,
            f"tier '{tier}' degenerated ({verdict.kind}: {verdict.detail}); no tier continued it",
            SERVER_ERROR,
            code="degenerate_answer",
            public="the model server's answer degenerated and could not be continued",
        )
        self.verdict = verdict


def watch_for(escalation: EscalationPolicy, holdback_chars: int, chat: bool) -> StreamWatch:
    """The watch an escalation policy asks for: its loop, scripts and logprobs rules as the
    detectors' checks (gateway/request/stream/degeneration.py)."""
    loop, scripts, logprobs = escalation.loop, escalation.scripts, escalation.logprobs
    return StreamWatch(
        LoopCheck(loop.max_period, loop.min_repeats, loop.min_chars) if loop else None,
        ScriptCheck(scripts.window_chars, scripts.max_scripts) if scripts else None,
        holdback_chars,
        chat,
        ConfidenceCheck(logprobs.window_tokens, logprobs.min_mean) if logprobs else None,
    )
