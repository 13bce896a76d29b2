"""``model-optimizer eval routing FILE`` through the real stack's gateway, at a tiny size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.measured import measured_path, read_measured
from tests.integration.conftest import Stack, cli

pytestmark = pytest.mark.integration
PROMPTS = [
    {"prompt": "What are some tips for a good night's sleep?", "label": "tolerant"},
    {"prompt": "Write a Python function that reverses a linked list.", "label": "code"},
    {"prompt": "Solve for x: 3x + 7 = 22. How much is x?", "label": "math"},
]


def test_routing_eval_end_to_end(stack: Stack, tmp_path: Path) -> None:
    labeled = tmp_path / "set.jsonl"
    labeled.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    tiers = ",".join(f"{name}={url}" for name, url in stack.tier_urls.items())
    out = tmp_path / "routing"
    done = cli(
        "eval", "routing", str(labeled), "--gateway", stack.gateway_url, "--tiers", tiers,
        "--max-tokens", "8", "--output", str(out), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["frontier.png", "routing.json", "routing.md"]
    assert (out / "frontier.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    data = json.loads((out / "routing.json").read_text())
    assert data["prompts"] == len(PROMPTS)
    matrix = data["confusion"]
    assert sum(sum(row.values()) for row in matrix.values()) == len(PROMPTS)
    for prompt in PROMPTS:
        assert sum(matrix[prompt["label"]].values()) >= 1
    shares = data["shares"]
    assert set(shares) >= set(stack.tier_urls)
    assert sum(s["requests"] for s in shares.values()) == pytest.approx(1.0)
    assert sum(s["tokens"] for s in shares.values()) == pytest.approx(1.0)
    classes = {o["route_class"] for o in data["outcomes"]}
    assert len(data["points"]) == len(stack.tier_urls) ** len(classes)
    all_fp16 = [p for p in data["points"] if set(p["assignment"].values()) == {"fp16"}]
    assert [(p["off_reference"], p["quality"]) for p in all_fp16] == [(0.0, 1.0)]
    front = data["frontier"]
    assert front and max(p["quality"] for p in front) == 1.0
    # the cost axis is what up measured on this machine (its file for this gateway's port)
    measured = read_measured(measured_path(int(stack.gateway_url.rsplit(":", 1)[1])))
    assert measured is not None
    for name, speed in data["speeds"].items():
        assert speed == {
            "ttft_s": measured.tiers[name].ttft_s,
            "tpot_s": measured.tiers[name].tpot_s,
        }
    gw = data["gateway_point"]
    assert gw["seconds"] > 0 and 0.0 <= gw["off_reference"] <= 1.0 and 0.0 <= gw["quality"] <= 1.0
    gap = data["gateway_gap"]
    assert gap["on_frontier"] is (gap["by"] is None)
    md = (out / "routing.md").read_text()
    routed = data["gateway_routed_point"]
    assert routed["seconds"] > 0 and 0.0 <= routed["quality"] <= 1.0
    assert "| **gateway's routing** (its tiers' direct answers) |" in md
    assert "gateway routing: " in md
