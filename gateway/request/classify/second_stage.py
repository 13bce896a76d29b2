"""The cascade's second stage: the prompts the first stage is unsure of, decided off the event loop.

The first stage (gateway/request/classify/classes.py, the prompt model) is sure of a prompt whose
P(precise) is below ``sure_tolerant`` or at least ``sure_precise`` (``classes.model.second_stage``
in the policy); it decides those at once. Between them, the band, ``classify_request`` returns
its cautious answer (precise) with a ``BandQuery``; the request's handler then awaits
``settle``, which asks the second-stage model (gateway/request/classify/band_model.py) in a
one-thread executor. The queue is bounded: at most ``max_pending`` prompts are queued or running,
and each waits at most ``budget_ms``; a prompt past either keeps the cautious answer, and its reason
says so. A second-stage model that cannot be read leaves the first stage serving at its own
threshold, with one log line (``load``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from common.class_categories import CODE, MATH, TOLERANT
from gateway.policy.classes import SecondStageRule
from gateway.request.classify.band_model import BandModel
from gateway.request.classify.classification import Classification, ascii_text
from gateway.request.classify.encoder_model import EncoderModel
from gateway.request.classify.prompt_model import ModelError, sigmoid

logger = logging.getLogger(__name__)


class StageModel(Protocol):
    """What a second-stage model offers: band_model.BandModel, encoder_model.EncoderModel."""

    @property
    def label(self) -> str: ...

    def p_precise(self, text: str) -> float: ...


@dataclass(eq=False)
class SecondStage:
    """A loaded second-stage model, its thresholds and its bounded executor (one thread, made
    on first use; its thread ends when the stage is dropped with its policy)."""

    model: StageModel
    rule: SecondStageRule
    _slots: threading.BoundedSemaphore = field(init=False, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._slots = threading.BoundedSemaphore(self.rule.max_pending)

    @classmethod
    def load(cls, rule: SecondStageRule, path: Path) -> SecondStage | None:
        """The stage, or None (one log line) when its weights cannot be used."""
        try:
            kind = BandModel if rule.kind == "band" else EncoderModel
            return cls(kind.load(path), rule)
        except ModelError as exc:
            logger.warning("classes.model.second_stage: %s; the first stage serves alone", exc)
            return None

    def in_band(self, p: float) -> bool:
        return self.rule.sure_tolerant <= p < self.rule.sure_precise

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="second-stage")
            return self._pool

    def submit(self, text: str) -> Future[float] | None:
        """The model's P(precise) for ``text`` as a future, or None when ``max_pending`` prompts
        are already queued or running."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            future = self._executor().submit(self.model.p_precise, text)
        except RuntimeError:  # the executor was shut down
            self._slots.release()
            return None
        future.add_done_callback(lambda _: self._slots.release())
        return future

    async def p_precise(self, text: str) -> float | None:
        """P(precise) from the second stage, or None when it is full, late or failed."""
        future = self.submit(text)
        if future is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.rule.budget_ms / 1000)
        except TimeoutError:
            return None
        except Exception:
            logger.exception("second stage failed; the first stage's answer stands")
            return None


@dataclass(frozen=True, slots=True)
class BandQuery:
    """A prompt in the first stage's band: what the second stage reads and what the verdict
    needs (the code-vs-math log-odds and the first stage's part of the reason)."""

    stage: SecondStage
    text: str
    p_first: float
    code_logit: float
    first: str  # "p(precise) 0.300 in band [0.035, 0.876) (prompt-model v3: +...)"
    note: str


def band_reason(p: float, rule: SecondStageRule, why: str) -> str:
    return (
        f"stage 1 p(precise) {p:.3f} in band [{rule.sure_tolerant:g}, {rule.sure_precise:g}){why}"
    )


def precise_class(code_logit: float) -> str:
    return CODE if code_logit >= 0 else MATH


async def settle(query: BandQuery) -> Classification:
    """The second stage's verdict on a prompt in the band; precise when it cannot answer."""
    return verdict(query, await query.stage.p_precise(query.text))


def verdict(query: BandQuery, p: float | None) -> Classification:
    """The class for a prompt in the band given the second stage's P(precise) (None: it did
    not answer, the first stage's cautious answer stands)."""
    code = f"; p(code) {sigmoid(query.code_logit):.2f}"
    if p is None:
        cls = precise_class(query.code_logit)
        reason = f"{cls}: {query.first}; stage 2 busy: precise stands{code}{query.note}"
        return Classification(cls, ascii_text(reason), p_precise=query.p_first)
    label, threshold = query.stage.model.label, query.stage.rule.threshold
    if p < threshold:
        reason = f"{TOLERANT}: stage 2 p(precise) {p:.3f} < {threshold:g} ({label}); {query.first}"
        return Classification(TOLERANT, ascii_text(reason + query.note), p_precise=p)
    cls = precise_class(query.code_logit)
    reason = f"{cls}: stage 2 p(precise) {p:.3f} >= {threshold:g} ({label}); {query.first}{code}"
    return Classification(cls, ascii_text(reason + query.note), p_precise=p)
