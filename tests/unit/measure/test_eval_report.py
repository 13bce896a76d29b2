"""measure/eval_report.py: figures from synthetic runs, Markdown, the atomic write."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from measure.eval_data import CodeItem, MathItem
from measure.eval_report import figures, json_bytes, markdown, report, write_atomically
from measure.evaluate import EvalOptions, Prepared, Text, TierRun
from measure.logprobs import Position, Scored

TEXTS = (
    Text("code", "c1", (1, 2), (3, 4)),
    Text("math", "m1", (1,), (5,)),
    Text("general", "g1", (1,), (6, 7)),
)
PREPARED = Prepared(
    "m",
    TEXTS,
    (MathItem("gsm8k:1", "q", "s", "3"), MathItem("gsm8k:2", "q", "s", "4")),
    (CodeItem("HumanEval/0", "p", "s", "t", "f"),),
)


def scored(pairs: list[tuple[float, int]]) -> Scored:
    return Scored(tuple(Position(0, lp, top) for lp, top in pairs))


def run(tier: str, n: int, shift: float, top: int, math_ok: tuple[bool, ...]) -> TierRun:
    scores = (
        scored([(-1.0 + shift, 3), (-1.0 + shift, 4)]),
        scored([(-2.0 + shift, 5)]),
        scored([(-0.5 + shift, top), (-0.5 + shift, 7)]),
    )
    return TierRun(tier, n, scores, math_ok, (n == 1,))


RUNS = [
    run("fp16", 1, 0.0, 6, (True, False)),
    run("int4", 1, -0.5, 9, (False, False)),
    run("fp16", 2, 0.0, 6, (True, False)),
    run("int4", 2, -1.0, 6, (True, True)),
]


def test_figures_per_tier_and_category() -> None:
    rows = {(r["tier"], r["category"]): r for r in figures(PREPARED, RUNS, "fp16")}
    assert len(rows) == 6
    fp16_code = rows["fp16", "code"]
    assert fp16_code["perplexity"]["mean"] == pytest.approx(math.e)
    assert fp16_code["agreement"]["runs"] == [1.0, 1.0]
    assert fp16_code["task"] == "humaneval_pass_at_1"
    assert fp16_code["task_score"]["runs"] == [1.0, 0.0]
    general = rows["int4", "general"]
    assert general["agreement"]["runs"] == [0.5, 1.0] and general["tokens"] == 2
    assert general["perplexity"]["runs"] == pytest.approx([math.exp(1.0), math.exp(1.5)])
    assert general["task"] is None and general["task_score"] is None
    assert rows["int4", "math"]["task_score"]["runs"] == [0.0, 1.0]


def test_report_json_and_markdown() -> None:
    opts = EvalOptions(tiers={"fp16": "http://a", "int4": "http://b"}, reference="fp16", runs=2)
    data = json.loads(json_bytes(report(opts, PREPARED, RUNS)))
    assert data["items"] == {"code": 1, "math": 1, "general": 1, "gsm8k": 2, "humaneval": 1}
    assert len(data["per_item"]) == 4
    md = markdown(data)
    assert md.count("\n| fp16 |") + md.count("\n| int4 |") == 6
    assert "| int4 | general | 1 (2) | 3.60 [2.72–4.48] | 0.750 [0.500–1.000] | - |" in md
    assert "2.72 (runs equal)" in md
    assert "| GSM8K EM 0.50 [0.00–1.00] |" in md and "| HumanEval pass@1 0.50 [0.00–1.00] |" in md


def test_write_atomically(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_atomically(out, {"a.json": b"{}", "b.md": b"x"})
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.md"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left
    with pytest.raises(FileExistsError):
        write_atomically(out, {"c": b""})
    empty = tmp_path / "empty"
    empty.mkdir()
    write_atomically(empty, {"c": b"1"})
    assert (empty / "c").read_bytes() == b"1"
