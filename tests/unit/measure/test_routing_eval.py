"""measure/routing_eval.py's report, Markdown and plot from synthetic outcomes (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.config import MeasuredTier
from gateway.measured import MeasuredStack
from measure.frontier import Outcome, Speed
from measure.routing_eval import RoutingOptions, gap_line, markdown, plot, report, speeds_from

TIERS = {"fp16": "http://a:1", "int8": "http://a:2", "int4": "http://a:3"}
SPEEDS = {"fp16": Speed(0.1, 0.02), "int8": Speed(0.1, 0.018), "int4": Speed(0.1, 0.01)}


def outcome(label: str, cls: str, tier: str, q4: float) -> Outcome:
    quality = {"fp16": 1.0, "int8": 0.9, "int4": q4}
    return Outcome(
        label, cls, tier, 5, 15, quality[tier], dict.fromkeys(TIERS, 15), quality, f"{cls} reason"
    )


OUTCOMES = [
    outcome("tolerant", "tolerant", "int4", 0.5),
    outcome("code", "code", "fp16", 0.25),
    outcome("math", "tolerant", "int4", 0.75),
    outcome("long", "long", "int8", 0.5),
]


def _data(speeds: dict[str, Speed]) -> dict:  # type: ignore[type-arg]
    opts = RoutingOptions(Path("set.jsonl"), "http://gw", TIERS, "fp16", speeds, "a file")
    return json.loads(json.dumps(report(opts, OUTCOMES)))  # type: ignore[no-any-return]


def test_report_markdown_and_plot() -> None:
    data = _data(SPEEDS)
    assert data["prompts"] == 4
    assert data["confusion"]["math"] == {"tolerant": 1, "code": 0, "math": 0, "long": 0}
    assert data["shares"]["int4"] == {"requests": 0.5, "tokens": 0.5}
    assert len(data["points"]) == 3**3  # tolerant, code, long seen
    gw = data["gateway_point"]
    seconds = (2 * (0.1 + 15 * 0.01) + (0.1 + 15 * 0.02) + (0.1 + 15 * 0.018)) / 4
    assert gw["seconds"] == pytest.approx(seconds) and gw["off_reference"] == 0.75
    assert gw["quality"] == pytest.approx((0.5 + 1 + 0.75 + 0.9) / 4)
    assert data["speeds"]["int8"] == {"ttft_s": 0.1, "tpot_s": 0.018}
    assert data["outcomes"][0]["route_reason"] == "tolerant reason"
    md = markdown(data, "frontier.png")
    assert "| math | 0 | 0 | 0 | 0 | 0 |" not in md  # the math label's row counts its prompt
    assert "| math | 1 | 0 | 0 | 0 | 1 |" in md
    own = "| gateway (its own answers: the routing plus the engine's run-to-run differences) |"
    assert f"{own} {seconds:.3f} | 0.787 | 75.0% |" in md
    routed = data["gateway_routed_point"]
    assert f"| **gateway's routing** (its tiers' direct answers) | {routed['seconds']:.3f} |" in md
    assert "| int8 | 100 ms | 18.0 ms |" in md and "Measured speeds (a file)" in md
    assert md.count("| frontier: ") == len(data["frontier"])
    assert gap_line(data) in md
    png = plot(data)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_the_gap_line_follows_the_measured_speeds() -> None:
    """The same answers: on the frontier where int4 is fastest, dominated where it is slowest
    (then all-fp16 is cheaper and better than what the gateway did)."""
    fast = _data(SPEEDS)
    assert fast["gateway_gap"]["on_frontier"] is True
    assert gap_line(fast).startswith("gateway routing: on the frontier (")
    slow = {"fp16": Speed(0.1, 0.01), "int8": Speed(0.1, 0.015), "int4": Speed(0.1, 0.02)}
    data = _data(slow)
    g = data["gateway_gap"]
    assert g["on_frontier"] is False
    assert set(g["by"]["assignment"].values()) == {"fp16"}
    assert data["frontier"] == [g["by"]]
    line = gap_line(data)
    assert line.startswith("gateway routing: dominated (") and "long→fp16" in line
    assert f"{g['quality_gain']:+.3f} quality" in line


def _measured(**urls: str) -> MeasuredStack:
    tiers = {
        n: MeasuredTier(quality={"chat": 1.0}, ttft_s=0.1, tpot_s=t, throughput_tok_s=1 / t)
        for n, t in (("fp16", 0.02), ("int8", 0.015))
    }
    return MeasuredStack(
        written_at="2026-12-03T10:00:00+00:00",
        gateway_port=18000,
        reference="fp16",
        tiers=tiers,
        tier_urls=urls,
    )


def test_speeds_come_from_the_measurement_file() -> None:
    measured = _measured(fp16="http://a:1", int8="http://b:2")
    tiers = {"fp16": "http://a:1", "int8": "http://a:2"}
    speeds, source, notes = speeds_from(measured, tiers, Path("m.json"))
    assert speeds == {"fp16": Speed(0.1, 0.02), "int8": Speed(0.1, 0.015)}
    assert "port 18000" in source and "m.json" in source and "2026-12-03T10:00" in source
    assert notes == ["tier int8 was measured at http://b:2, evaluated at http://a:2"]
    with pytest.raises(ValueError, match=r"no measured speed for tier\(s\) int4"):
        speeds_from(measured, TIERS, Path("m.json"))
