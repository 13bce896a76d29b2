"""``model-optimizer eval`` end to end on the real stack's tiers, at a tiny size.

fp16 is evaluated against itself (a second entry, ``self``, naming the fp16 tier's URL) and
against int4: the JSON has every field, and fp16 against itself agrees exactly (agreement 1.0
in every run, the same perplexity).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure.evaluate import CATEGORIES
from tests.integration.conftest import Stack, cli

pytestmark = pytest.mark.integration
SPREAD = {"mean", "min", "max", "std", "runs"}
RUNS = 2


def test_eval_end_to_end_and_fp16_against_itself(stack: Stack, tmp_path: Path) -> None:
    fp16, int4 = stack.tier_urls["fp16"], stack.tier_urls["int4"]
    out = tmp_path / "eval"
    done = cli(
        "eval",
        "--tiers",
        f"fp16={fp16},self={fp16},int4={int4}",
        "--limit",
        "1",
        "--runs",
        str(RUNS),
        "--max-tokens",
        "8",
        "--output",
        str(out),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["eval.json", "eval.md"]
    data = json.loads((out / "eval.json").read_text())
    assert set(data) == {
        "model", "reference", "tiers", "runs", "seed", "limit", "max_tokens", "items",
        "results", "per_item",
    }  # fmt: skip
    assert data["reference"] == "fp16" and data["runs"] == RUNS
    assert data["items"] == {"code": 1, "math": 1, "general": 1, "gsm8k": 1, "humaneval": 1}
    rows = {(r["tier"], r["category"]): r for r in data["results"]}
    assert set(rows) == {(t, c) for t in ("fp16", "self", "int4") for c in CATEGORIES}
    for row in rows.values():
        assert row["items"] == 1 and row["tokens"] > 0
        for figure in ("perplexity", "agreement"):
            assert set(row[figure]) == SPREAD and len(row[figure]["runs"]) == RUNS
            assert row[figure]["min"] <= row[figure]["mean"] <= row[figure]["max"]
        assert row["perplexity"]["min"] >= 1.0
        assert 0.0 <= row["agreement"]["min"] <= row["agreement"]["max"] <= 1.0
        if row["category"] == "general":
            assert row["task"] is None and row["task_score"] is None
        else:
            assert row["task"] in ("gsm8k_exact_match", "humaneval_pass_at_1")
            assert set(row["task_score"]) == SPREAD
    for category in CATEGORIES:
        ref, same = rows["fp16", category], rows["self", category]
        assert same["agreement"]["runs"] == [1.0] * RUNS
        assert same["perplexity"]["runs"] == pytest.approx(ref["perplexity"]["runs"], rel=1e-6)
    assert len(data["per_item"]) == 3 * RUNS
    md = (out / "eval.md").read_text()
    assert md.count("\n| self |") == len(CATEGORIES) and md in done.stdout
