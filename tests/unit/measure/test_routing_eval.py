"""measure/routing_eval.py's report, Markdown and plot from synthetic outcomes (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure.frontier import Outcome
from measure.routing_eval import RoutingOptions, markdown, plot, report

TIERS = {"fp16": "http://a:1", "int8": "http://a:2", "int4": "http://a:3"}


def outcome(label: str, cls: str, tier: str, q4: float) -> Outcome:
    quality = {"fp16": 1.0, "int8": 0.9, "int4": q4}
    return Outcome(
        label, cls, tier, 20, quality[tier], dict.fromkeys(TIERS, 20), quality, f"{cls} reason"
    )


OUTCOMES = [
    outcome("tolerant", "tolerant", "int4", 0.5),
    outcome("code", "code", "fp16", 0.25),
    outcome("math", "tolerant", "int4", 0.75),
    outcome("long", "long", "int8", 0.5),
]


def test_report_markdown_and_plot() -> None:
    opts = RoutingOptions(Path("set.jsonl"), "http://gw", TIERS, "fp16")
    data = json.loads(json.dumps(report(opts, OUTCOMES)))
    assert data["prompts"] == 4
    assert data["confusion"]["math"] == {"tolerant": 1, "code": 0, "math": 0, "long": 0}
    assert data["shares"]["int4"] == {"requests": 0.5, "tokens": 0.5}
    assert len(data["points"]) == 3**3  # tolerant, code, long seen
    assert data["gateway_point"]["cheap_share"] == 0.75
    assert data["gateway_point"]["quality"] == pytest.approx((0.5 + 1 + 0.75 + 0.9) / 4)
    assert data["outcomes"][0]["route_reason"] == "tolerant reason"
    md = markdown(data, "frontier.png")
    assert "| math | 0 | 0 | 0 | 0 | 0 |" not in md  # the math label's row counts its prompt
    assert "| math | 1 | 0 | 0 | 0 | 1 |" in md
    assert "| **gateway (actual)** | 75.0% | 0.787 |" in md
    assert md.count("| frontier: ") == len(data["frontier"])
    png = plot(data)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
