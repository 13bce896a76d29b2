"""The shipped weights, under the shipped policy, reproduce the figures the docs quote.

benchmarks/results/classifier.json is what ``benchmarks/bench_classifier.py --json`` wrote; its
accuracy section is recomputed here (classify_request is deterministic) and must match, and
docs/classifier.md must quote the held-out headline figures from it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from classifier import evaluate

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmarks" / "results" / "classifier.json"
DOCS = ROOT / "docs" / "classifier.md"


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict[str, dict[str, object]]]:
    return json.loads(RESULTS.read_text(encoding="utf-8"))["accuracy"]  # type: ignore[no-any-return]


def test_the_data_files_are_apart() -> None:
    train = {json.loads(x)["prompt"] for x in (ROOT / "classifier/data/train.jsonl").open()}
    heldout = [json.loads(x) for x in evaluate.HELDOUT.open()]
    assert not train & {r["prompt"] for r in heldout}
    train_sources = {
        json.loads(x)["source"].split(":")[0] for x in (ROOT / "classifier/data/train.jsonl").open()
    }
    assert not train_sources & {r["source"].split(":")[0] for r in heldout}
    routing = {json.loads(x)["prompt"] for x in evaluate.ROUTING.open()}
    assert not train & routing


@pytest.mark.parametrize("file", [evaluate.HELDOUT, evaluate.ROUTING])
def test_the_shipped_weights_reproduce_the_recorded_figures(
    file: Path, recorded: dict[str, dict[str, dict[str, object]]]
) -> None:
    rows = evaluate.load_rows(file)
    model = evaluate.measure("model", evaluate.policy_rules(evaluate.POLICY), rows)
    rules = evaluate.measure("keyword rules", evaluate.keyword_rules(), rows)
    key = str(file.relative_to(ROOT))
    assert model.as_dict() == recorded[key]["model"]
    assert rules.as_dict() == recorded[key]["keyword rules"]


def test_the_docs_quote_the_held_out_figures() -> None:
    text = DOCS.read_text(encoding="utf-8")
    rows = evaluate.load_rows(evaluate.HELDOUT)
    model = evaluate.measure("model", evaluate.policy_rules(evaluate.POLICY), rows)
    for name, value in (
        ("accuracy", model.accuracy),
        ("binary accuracy", model.binary_accuracy),
        ("precise recall", model.precise_recall),
    ):
        assert f"{value:.1%}" in text, name


def test_the_docs_quote_the_cascades_held_out_figures() -> None:
    """docs/classifier.md's cascade table: the shipped policies/classes-cascade.yaml (its
    weights and thresholds) reproduces the held-out figures quoted, band share included."""
    text = DOCS.read_text(encoding="utf-8")
    for file in (evaluate.HELDOUT, evaluate.FOLLOWUPS):
        rows = evaluate.load_rows(file)
        cascade = evaluate.measure("cascade", evaluate.cascade_rules(), rows)
        alone = evaluate.measure("model", evaluate.policy_rules(evaluate.POLICY), rows)
        name = str(file.relative_to(ROOT))
        # The row: the first stage alone, then the cascade and its share in the band.
        line = next((x for x in text.splitlines() if x.startswith(f"| `{name}` ")), "")
        assert line, f"docs/classifier.md has no cascade row for {name}"
        expected = (
            f"{alone.precise_recall:.1%} / {alone.tolerant_recall:.1%} | "
            f"{cascade.precise_recall:.1%} / {cascade.tolerant_recall:.1%} | "
            f"{cascade.band / cascade.total:.1%} |"
        )
        assert line.endswith(expected), (line, expected)
