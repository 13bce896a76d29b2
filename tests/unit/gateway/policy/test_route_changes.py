"""Route changes (gateway/policy/route_changes.py): which classes changed, the store's history,
and how a change is made visible (log line, span event, callback)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.policy.derive import DerivedChain
from gateway.policy.route_changes import (
    SPAN_EVENT,
    RouteChange,
    RouteHistory,
    report,
    route_changes,
)
from gateway.policy.store import PolicyStore
from gateway.telemetry import build_tracer_provider

ROUTES = (
    "tiers: [fp16, int4]\n"
    "routes: {{tolerant: [{first}], code: [fp16], math: [fp16], long: [fp16]}}\n"
)


def test_only_classes_whose_tiers_differ_change() -> None:
    old = {"tolerant": ("fp16", "int4"), "code": ("fp16",)}
    new = {"tolerant": ("int4", "fp16"), "code": ("fp16",)}
    derived = {"tolerant": DerivedChain("tolerant", ("int4", "fp16"), {"int4": "gain 0.4"})}
    changes = route_changes(old, new, derived, "abcdef0123456789", 10.0)
    assert [(c.cls, c.old, c.new) for c in changes] == [
        ("tolerant", ("fp16", "int4"), ("int4", "fp16"))
    ]
    assert changes[0].reason.startswith("policy sha256 abcdef012345 applied: tolerant -> int4")
    assert "gain 0.4" in changes[0].reason


def test_a_first_load_is_history_for_every_class() -> None:
    changes = route_changes(None, {"code": ("fp16",)}, {}, "ab", 0.0)
    assert changes == [RouteChange(0.0, "code", None, ("fp16",), "policy sha256 ab loaded: "
                                   "the route as written")]  # fmt: skip


def test_the_history_is_bounded_and_knows_each_class_last_change() -> None:
    history = RouteHistory(size=2)
    history.extend(RouteChange(float(i), "code", None, ("t",), str(i)) for i in range(3))
    assert [c.reason for c in history.changes()] == ["1", "2"]
    assert history.last("code") is not None and history.last("code").reason == "2"  # type: ignore[union-attr]
    assert history.last("math") is None


def test_a_change_is_logged_traced_and_counted_a_first_load_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = InMemorySpanExporter()
    tracer = build_tracer_provider(exporter).get_tracer("test")
    seen: list[Sequence[RouteChange]] = []
    moved = RouteChange(1.0, "tolerant", ("fp16",), ("int4", "fp16"), "why")
    with caplog.at_level(logging.INFO, logger="gateway.policy.route_changes"):
        with tracer.start_as_current_span("reload"):
            report([RouteChange(0.0, "code", None, ("fp16",), "loaded"), moved], seen.append)
        report([RouteChange(0.0, "code", None, ("fp16",), "loaded")], seen.append)
    assert seen == [[moved]]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["route for tolerant changed: fp16 -> int4,fp16 (why)"]
    (span,) = exporter.get_finished_spans()
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        (SPAN_EVENT, {"class": "tolerant", "from": "fp16", "to": "int4,fp16", "reason": "why"})
    ]


def test_a_failing_callback_does_not_undo_the_change(caplog: pytest.LogCaptureFixture) -> None:
    def broken(changes: Sequence[RouteChange]) -> None:
        raise RuntimeError("boom")

    report([RouteChange(1.0, "code", ("a",), ("b",), "why")], broken)
    assert "route change callback failed" in caplog.text


def test_the_store_keeps_the_history_and_tells_its_callback(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(ROUTES.format(first="fp16, int4"))
    clock = iter([100.0, 200.0, 300.0])
    store = PolicyStore(path, clock=lambda: next(clock))
    seen: list[Sequence[RouteChange]] = []
    store.on_change = seen.append
    store.load()
    assert not seen and store.history.last("tolerant") is not None
    path.write_text(ROUTES.format(first="int4, fp16"))
    assert store.reload() == "applied"
    (changes,) = seen
    assert [(c.cls, c.old, c.new, c.at) for c in changes] == [
        ("tolerant", ("fp16", "int4"), ("int4", "fp16"), 200.0)
    ]
    last = store.history.last("tolerant")
    assert last is not None and last.as_dict()["at"].startswith("1970-01-01T00:03:20")
    path.write_text(ROUTES.format(first="int4, fp16") + "# a comment\n")
    assert store.reload() == "applied" and len(seen) == 1  # same routes: no change
