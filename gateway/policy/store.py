"""The routing policy the gateway serves, and its hot reload: a bad edit never replaces a good one.

``PolicyStore(path, known_tiers)`` owns one policy file:

- ``load()`` reads it the first time; a bad policy raises ``PolicyError`` (one line,
  ``file:line: field: message``) and the gateway refuses to start.
- ``reload()`` reads it again and returns what happened:
  ``"applied"``: the new policy is validated and compiled in full, then swapped in with one
  assignment (a request sees the old policy or the new one, never half of each); ``last_error``
  is cleared; one info line names the new digest.
  ``"rejected"``: the file is unreadable, missing, empty, not YAML, fails the schema, names a
  tier the gateway does not have, or building it fails in any other way (an unexpected
  exception is a refused edit, never a crash of the watch); the last good policy keeps
  serving, ``last_error`` and ``last_error_at`` say why and when, one warning line names the
  file and the problem.
  ``"unchanged"``: the bytes are those being served; nothing to do, except that an error left
  by a bad edit is cleared (the file on disk is again what serves).
- ``reload_in_thread()`` is ``reload()`` with the reading, parsing and compiling in a worker
  thread, so the event loop serves on meanwhile; only the outcome is settled on the loop.
  The watch and ``POST /admin/policy/reload`` use it. The file is read no further than
  ``common.operator_yaml.MAX_BYTES`` (1 MiB) and YAML aliases are refused: a bigger file or
  an alias is a rejected edit, so the work is bounded whatever the file holds.
- ``watch()`` watches the file's parent directory (editors and ConfigMap updates replace files
  by rename or symlink swap, which a watch on the file itself would lose) and reloads after
  each change to the file, debounced; it ends when ``stop_event`` is set or it is cancelled.
- ``status()`` is what ``GET /admin/policy`` shows.
- ``history`` keeps each applied policy's route changes (gateway/policy/route_changes.py:
  logged, a span event, ``on_change`` for the metrics), shown by ``GET /admin/routes``.

``known_tiers`` is checked by ``gateway.policy.schema.parse_policy``, the code path of
``model-optimizer policy check`` too.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from watchfiles import Change, awatch

from common.operator_yaml import read_bytes
from gateway.policy.derive import DerivedChain, TierFigures, apply_factors, derive_routes
from gateway.policy.route_changes import (
    RouteChange,
    RouteHistory,
    iso,
    report,
    route_changes,
    served_routes,
)
from gateway.policy.schema import PolicyError, RoutingPolicy, parse_policy
from gateway.request.classify.classes import CompiledClasses

Outcome = Literal["applied", "rejected", "unchanged"]
# Kubernetes' AtomicWriter updates a mounted ConfigMap by swapping this symlink; the policy
# file itself (a symlink through it) shows no event of its own.
_CONFIGMAP_LINK = "..data"
# awatch waits for changes in a worker thread that anyio cancellation cannot interrupt; the
# thread returns at least this often (awatch's default is 5 s), so a watch() cancelled by a
# task group ends within about this long. A set stop_event is seen within 50 ms anyway.
_WAKE_MS = 200

logger = logging.getLogger(__name__)


class StopEvent(Protocol):
    """What ``watch`` needs of a stop event (``asyncio.Event``, ``anyio.Event``, ...)."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class ActivePolicy:
    """A validated policy, its compiled classifier rules and where it came from."""

    policy: RoutingPolicy
    rules: CompiledClasses
    digest: str  # sha256 hex of the file's bytes
    loaded_at: float  # the store's clock() when it was applied
    source: str  # the file's path
    # Routes derived from measurements (gateway/policy/derive.py); ``policy`` already holds
    # the derived chains, these say why.
    derived: Mapping[str, DerivedChain] = field(default_factory=dict)
    source_bytes: bytes = field(default=b"", repr=False)  # the file as read: re-derived from


class PolicyStore:
    """The serving routing policy of one file; see the module docstring."""

    def __init__(
        self,
        path: str | Path,
        known_tiers: Sequence[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        measured: Mapping[str, TierFigures] | None = None,
        reference: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.measured = dict(measured or {})
        self.reference = reference
        # tier -> its live per-token time over the calibration's (gateway/policy/live.py)
        self.factors: dict[str, float] = {}
        self.known_tiers = tuple(known_tiers) if known_tiers is not None else None
        self._clock = clock
        self._active: ActivePolicy | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        # Each applied policy's route changes (gateway/policy/route_changes.py); ``on_change``
        # gets the changes of a policy applied after the first (the app counts them).
        self.history = RouteHistory()
        self.on_change: Callable[[Sequence[RouteChange]], None] | None = None

    @property
    def active(self) -> ActivePolicy:
        """The policy being served."""
        if self._active is None:
            raise RuntimeError(f"routing policy {self.path} is not loaded: call load() first")
        return self._active

    def load(self) -> ActivePolicy:
        """Read, validate and apply the file; ``PolicyError`` (one line) when it is not usable."""
        data = self._read()
        self._apply(self._build(data, _digest(data)))
        return self.active

    def reload(self) -> Outcome:
        """Read the file again: ``"applied"``, ``"rejected"`` or ``"unchanged"``."""
        return self._settle(self._prepare(self.active.digest))

    async def reload_in_thread(self) -> Outcome:
        """``reload()`` with the file read, parsed and compiled in a worker thread (the event
        loop keeps serving); the swap and the error fields are set back on the loop."""
        prepared = await asyncio.to_thread(self._prepare, self.active.digest)
        return self._settle(prepared)

    async def watch(
        self,
        on_reload: Callable[[str], None] | None = None,
        *,
        debounce_ms: int = 200,
        stop_event: StopEvent | None = None,
    ) -> None:
        """Reload after each change to the file until ``stop_event`` is set or cancelled.

        ``on_reload`` gets each outcome; an exception from it is logged and the watch goes on.
        """
        directory = self.path.absolute().parent
        names = {self.path.name, _CONFIGMAP_LINK}

        def relevant(change: Change, path: str) -> bool:
            return Path(path).name in names

        async for _changes in awatch(
            directory,
            watch_filter=relevant,
            debounce=debounce_ms,
            stop_event=_Stop(stop_event),
            rust_timeout=_WAKE_MS,
            recursive=False,
        ):
            outcome = await self.reload_in_thread()
            if on_reload is not None:
                _notify(on_reload, outcome)

    def status(self) -> dict[str, Any]:
        """The serving policy and the last rejected edit, JSON-ready (``GET /admin/policy``)."""
        active = self.active
        return {
            "path": str(self.path),
            "digest": active.digest,
            "loaded_at": iso(active.loaded_at),
            "last_error": self.last_error,
            "last_error_at": iso(self.last_error_at) if self.last_error_at is not None else None,
            "policy": active.policy.model_dump(mode="json"),
            "derived_routes": {
                cls: {
                    "chain": list(d.chain),
                    "overflow": list(d.overflow),
                    "reasons": dict(d.reasons),
                    "line": d.describe(),
                }
                for cls, d in active.derived.items()
            },
            "classifier_model": _model_status(active.rules),
        }

    # ----------------------------------------------------------------------- helpers

    def _read(self) -> bytes:
        return read_bytes(self.path, "routing policy", PolicyError)

    def _prepare(self, serving: str) -> ActivePolicy | PolicyError | None:
        """The file's policy built (``None``: its digest is ``serving``), or why it is not
        usable; touches nothing of the store, so it may run in a worker thread."""
        try:
            data = self._read()
            digest = _digest(data)
            return None if digest == serving else self._build(data, digest)
        except PolicyError as exc:
            return exc

    def _settle(self, prepared: ActivePolicy | PolicyError | None) -> Outcome:
        if isinstance(prepared, PolicyError):
            self._reject(str(prepared), self.active)
            return "rejected"
        if prepared is None or prepared.digest == self.active.digest:
            self._clear_error()
            return "unchanged"
        self._apply(prepared)
        return "applied"

    def _build(self, data: bytes, digest: str) -> ActivePolicy:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError(f"{self.path}: cannot read routing policy: {exc}") from None
        try:
            policy = parse_policy(text, str(self.path), self.known_tiers)
            rules = CompiledClasses.build(policy.classes, self.path.parent)
            # The routes serving now are the previous derivation: an edit re-derives with
            # hysteresis, so new figures (a re-measurement) move a route only significantly.
            previous = self._active.derived if self._active is not None else None
            figures = apply_factors(self.measured, self.factors)
            policy, derived = derive_routes(policy, figures, self.reference, previous)
        except PolicyError:
            raise
        except Exception as exc:  # any other failure is a refused edit too, never a crash
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise PolicyError(f"{self.path}: cannot use routing policy: {reason}") from None
        return ActivePolicy(policy, rules, digest, self._clock(), str(self.path), derived, data)

    async def remeasure(
        self, measured: Mapping[str, TierFigures], reference: str | None, why: str
    ) -> bool:
        """Routes derived again from new measured figures, the policy file unchanged (the
        gateway's own measurements, gateway/control/measurement.py), with the serving
        derivation as ``previous``: a route moves only on a significant difference. Built in a
        worker thread (the classifier's rules are compiled again), swapped on the loop. False
        (and the routes serving stay) when the derivation fails; logged."""
        return await self._rederive(dict(measured), reference, self.factors, why)

    async def relive(self, factors: Mapping[str, float], why: str) -> bool:
        """Routes derived again on the measured figures scaled by each tier's live factor
        (gateway/control/live_routes.py), as ``remeasure`` does."""
        return await self._rederive(self.measured, self.reference, dict(factors), why)

    async def _rederive(
        self,
        measured: dict[str, TierFigures],
        reference: str | None,
        factors: dict[str, float],
        why: str,
    ) -> bool:
        old = self.measured, self.reference, self.factors
        self.measured, self.reference, self.factors = measured, reference, factors
        active = self.active
        try:
            new = await asyncio.to_thread(self._build, active.source_bytes, active.digest)
        except PolicyError as exc:
            self.measured, self.reference, self.factors = old
            logger.warning("routes not re-derived from %s, still serving the last: %s", why, exc)
            return False
        if self._active is not active:  # the file was reloaded meanwhile: derive on that one
            return await self._rederive(measured, reference, factors, why)
        self._apply(new, cause=why)
        return True

    def _apply(self, new: ActivePolicy, cause: str | None = None) -> None:
        old = served_routes(self._active.policy) if self._active is not None else None
        self._active = new  # one assignment: the swap
        self.last_error = self.last_error_at = None
        if cause is None:
            logger.info("routing policy %s applied (sha256 %s)", self.path, new.digest[:12])
        changes = route_changes(
            old, served_routes(new.policy), new.derived, new.digest, new.loaded_at, cause
        )
        self.history.extend(changes)
        report(changes, self.on_change)

    def _reject(self, message: str, serving: ActivePolicy) -> None:
        repeated = message == self.last_error
        self.last_error, self.last_error_at = message, self._clock()
        if not repeated:
            logger.warning(
                "routing policy change rejected, still serving sha256 %s: %s",
                serving.digest[:12],
                message,
            )

    def _clear_error(self) -> None:
        if self.last_error is not None:
            logger.info("routing policy %s is back to the serving version", self.path)
        self.last_error = self.last_error_at = None


class _Stop:
    """The stop event handed to awatch: set when the caller's is, or when awatch sets it on
    cancellation (which must not set the caller's event, perhaps shared with others)."""

    def __init__(self, outer: StopEvent | None) -> None:
        self._outer = outer
        self._set = False

    def is_set(self) -> bool:
        return self._set or (self._outer is not None and self._outer.is_set())

    def set(self) -> None:
        self._set = True


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _notify(on_reload: Callable[[str], None], outcome: str) -> None:
    try:
        on_reload(outcome)
    except Exception:
        logger.exception("routing policy on_reload callback failed")


def _model_status(rules: CompiledClasses) -> dict[str, Any] | None:
    """The classifier model the policy loaded: name, version, the weights' sha256 (12 hex)."""
    model = rules.model
    if model is None:
        return None
    return {"name": model.name, "version": model.version, "digest": model.digest}
