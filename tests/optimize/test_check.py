"""The precision check on the real default model: identical, broken and RTN-quantized copies."""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from optimizer.check import (
    CheckError,
    CheckReport,
    CheckThresholds,
    CheckVerdict,
    LayerError,
    TokenStats,
    compare_models,
    evaluate,
    failure_message,
    linear_names,
)
from optimizer.probes import DEFAULT_PROBES, Probe, ProbeError, load_probes

BROKEN = "model.layers.5.mlp.down_proj"
CATEGORIES = ("chat", "code", "math")
CALIBRATION = DEFAULT_PROBES.parent / "calibration.jsonl"
LAYERS = 30 * 7  # SmolLM2: q, k, v, o, gate, up, down per block (lm_head is not quantized)


@pytest.fixture(scope="session")
def probes() -> list[Probe]:
    return load_probes()


@pytest.fixture(scope="session")
def few_probes(probes: list[Probe]) -> list[Probe]:
    """Two probes per category: enough to test the mechanics, quick to run."""
    return [probe for name in CATEGORIES for probe in _of(probes, name)[:2]]


@pytest.fixture(scope="session")
def rtn_model(original: Any) -> Any:
    """A copy quantized by llm-compressor: RTN W4A16, symmetric, group 64, lm_head ignored."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
    modifier = QuantizationModifier(
        config_groups={"w4a16": {"targets": ["Linear"], "weights": {**weights, "group_size": 64}}},
        ignore=["lm_head"],
    )
    model = copy.deepcopy(original)
    oneshot(model=model, recipe=[modifier])  # no dataset: weight-only RTN needs none
    return model.eval()


@pytest.fixture(scope="session")
def rtn_report(original: Any, rtn_model: Any, tokenizer: Any, probes: list[Probe]) -> CheckReport:
    report = compare_models(original, rtn_model, tokenizer, probes)
    print(f"\nRTN W4A16 g64 check: {json.dumps(_summary(report))}")
    return report


# -- probes ------------------------------------------------------------------------------


def test_probe_set_is_small_and_balanced(probes: list[Probe], tokenizer: Any) -> None:
    assert Counter(probe.category for probe in probes) == {name: 8 for name in CATEGORIES}
    assert len({probe.text for probe in probes}) == len(probes)
    lengths = [len(tokenizer(probe.text)["input_ids"]) for probe in probes]
    assert max(lengths) <= 128
    assert all(probe.source for probe in probes)


@pytest.mark.parametrize("category", ["chat", "code", "math"])
def test_probes_are_held_aside_from_calibration(probes: list[Probe], category: str) -> None:
    texts = [json.loads(line)["text"] for line in CALIBRATION.read_text().splitlines() if line]
    chosen = [probe for probe in probes if probe.category == category]
    leaked = [
        probe.source
        for probe in chosen
        if any(probe.text.split("\nAnswer:")[0] in text for text in texts)
    ]
    assert leaked == []


def test_load_probes_names_file_and_line_of_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    path.write_text('{"category": "chat", "text": "hi"}\n\n{"category": "code"}\n')
    with pytest.raises(ProbeError, match=r"probes\.jsonl:3: field 'text'"):
        load_probes(path)
    path.write_text('{"category": "chat", "text": "hi"}\nnot json\n')
    with pytest.raises(ProbeError, match=r"probes\.jsonl:2: not valid JSON"):
        load_probes(path)
    path.write_text("\n")
    with pytest.raises(ProbeError, match="no probes"):
        load_probes(path)
    with pytest.raises(ProbeError, match="cannot read probes"):
        load_probes(tmp_path / "missing.jsonl")


# -- the check on real models ---------------------------------------------------------------


def test_identical_copy_matches_exactly(
    original: Any, tokenizer: Any, few_probes: list[Probe]
) -> None:
    twin = copy.deepcopy(original)
    hooks_before = _hook_count(original) + _hook_count(twin)
    report = compare_models(original, twin, tokenizer, few_probes)
    assert _hook_count(original) + _hook_count(twin) == hooks_before
    assert report.mean_kl < 1e-6 and report.max_kl < 1e-6
    assert report.top1 == 1.0
    assert set(report.categories) == set(CATEGORIES)
    assert [layer.name for layer in report.layers] == linear_names(original)
    assert len(report.layers) == LAYERS + 1
    assert max(max(lay.rel_error, lay.output_rel_error) for lay in report.layers) < 1e-6
    verdict = evaluate(report, CheckThresholds(max_kl=1e-6, min_top1=1.0, max_layer_rel_error=1e-6))
    assert verdict.passed and verdict.failures == []
    json.dumps(report.to_dict(), allow_nan=False)


def test_the_original_itself_is_not_a_candidate(
    original: Any, tokenizer: Any, few_probes: list[Probe]
) -> None:
    with pytest.raises(CheckError, match="two models"):
        compare_models(original, original, tokenizer, few_probes)


def test_one_broken_layer_fails_and_is_named(
    original: Any, tokenizer: Any, few_probes: list[Probe]
) -> None:
    broken = copy.deepcopy(original)
    with torch.no_grad():
        broken.get_submodule(BROKEN).weight.mul_(50)
    report = compare_models(original, broken, tokenizer, few_probes)
    errors = report.layer_errors
    assert errors[BROKEN] == pytest.approx(49.0, rel=1e-3)  # ||50y - y|| / ||y||
    # Isolated errors put the blame on that layer alone; later layers see a changed input
    # but compute the same function of it.
    assert max(error for name, error in errors.items() if name != BROKEN) < 1e-5
    verdict = evaluate(report, CheckThresholds(max_kl=0.5, min_top1=0.6, max_layer_rel_error=0.5))
    assert not verdict.passed
    # Judged by output error, the layers after the broken one drift too; it is the worst.
    assert verdict.worst_layers[0][0] == BROKEN
    by_isolated = evaluate(
        report,
        CheckThresholds(max_kl=0.5, min_top1=0.6, max_layer_rel_error=0.5),
        metric="rel_error",
    )
    assert by_isolated.worst_layers == [(BROKEN, errors[BROKEN])]
    message = failure_message(by_isolated, "int4")
    first, *rest = message.splitlines()
    assert first.startswith("precision check failed for int4: ")
    assert f"worst layers: {BROKEN} 49" in first
    snippet = yaml.safe_load("\n".join(rest[1:]))
    assert snippet == {
        "quantization": {"layer_overrides": [{"layers": [BROKEN], "precision": "float16"}]}
    }


def test_rtn_w4a16_differs_a_little(rtn_model: Any, rtn_report: CheckReport) -> None:
    report = rtn_report
    assert 0.0 < report.mean_kl < 1.5
    assert 0.5 < report.top1 < 1.0
    assert report.positions == sum(stats.positions for stats in report.categories.values())
    for stats in report.categories.values():
        assert stats.mean_kl > 0 and 0.4 < stats.top1 < 1.0 and stats.max_kl >= stats.mean_kl
    quantized = {
        name
        for name, module in rtn_model.named_modules()
        if getattr(module, "quantization_scheme", None) is not None
    }
    assert len(quantized) == LAYERS
    errors = report.layer_errors
    assert set(errors) == quantized | {"lm_head"}
    assert all(0.0 < errors[name] < 0.5 for name in quantized)
    assert errors["lm_head"] == 0.0  # unquantized; same weights on the same input
    verdict = evaluate(report, CheckThresholds(max_kl=0.01, min_top1=0.99, max_layer_rel_error=0.1))
    assert not verdict.passed and len(verdict.worst_layers) == 5
    assert verdict.worst_layers[0][1] == max(layer.output_rel_error for layer in report.layers)


def test_compressed_checkpoint_loads_back_and_checks_the_same(
    original: Any,
    rtn_model: Any,
    tokenizer: Any,
    few_probes: list[Probe],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """What the pipeline does: save compressed (as vLLM loads it), load back, check that."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("int4")
    # save_pretrained leaves the saved model compressed in memory: save a copy.
    copy.deepcopy(rtn_model).save_pretrained(folder, save_compressed=True)
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized" and config["quantization_status"] == "compressed"

    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    packed = reloaded.get_submodule(BROKEN)
    assert "weight_packed" in dict(packed.named_parameters())  # decompressed on first forward
    from_disk = compare_models(original, reloaded, tokenizer, few_probes)
    in_memory = compare_models(original, rtn_model, tokenizer, few_probes)
    assert from_disk.mean_kl == pytest.approx(in_memory.mean_kl, rel=1e-3)
    assert from_disk.top1 == pytest.approx(in_memory.top1, abs=1e-6)
    assert [lay.name for lay in from_disk.layers] == [lay.name for lay in in_memory.layers]
    for disk, memory in zip(from_disk.layers, in_memory.layers, strict=True):
        assert disk.rel_error == pytest.approx(memory.rel_error, rel=1e-3, abs=1e-6)


# -- evaluate and failure_message are pure ------------------------------------------------------


def _report(
    mean_kl: float = 0.05,
    top1: float = 0.95,
    categories: dict[str, tuple[float, float]] | None = None,
    layers: dict[str, float] | None = None,
) -> CheckReport:
    cats = categories or {"chat": (mean_kl, top1), "math": (mean_kl, top1)}
    errors = layers or {"a.q_proj": 0.05, "a.down_proj": 0.08, "lm_head": 0.0}
    return CheckReport(
        mean_kl=mean_kl,
        max_kl=3 * mean_kl,
        top1=top1,
        positions=100,
        probes=4,
        categories={name: TokenStats(kl, t1, t1, 50) for name, (kl, t1) in cats.items()},
        # ``evaluate`` judges output_rel_error by default; the isolated error differs.
        layers=[LayerError(name, error / 2, error) for name, error in errors.items()],
        seconds=1.0,
    )


LIMITS = CheckThresholds(max_kl=0.1, min_top1=0.9, max_layer_rel_error=0.1)


def test_evaluate_passes_within_limits_and_lists_worst_layers() -> None:
    verdict = evaluate(_report(), LIMITS, top=2)
    assert verdict == CheckVerdict(True, [], [("a.down_proj", 0.08), ("a.q_proj", 0.05)])
    with pytest.raises(ValueError, match="passed"):
        failure_message(verdict, "int8")


def test_evaluate_reports_overall_and_category_failures() -> None:
    report = _report(0.3, 0.7, {"chat": (0.5, 0.6), "code": (0.05, 0.95)})
    assert evaluate(report, LIMITS).failures == [
        "kl 0.3 > 0.1 (chat 0.5)",
        "top-1 0.700 < 0.9 (chat 0.600)",
    ]
    only_chat = _report(0.05, 0.95, {"chat": (0.5, 0.95), "code": (0.01, 0.99)})
    assert evaluate(only_chat, LIMITS).failures == ["kl[chat] 0.5 > 0.1"]


def test_evaluate_names_only_the_layers_over_the_limit() -> None:
    report = _report(layers={"x.v_proj": 0.3, "x.o_proj": 0.2, "x.up_proj": 0.01})
    verdict = evaluate(report, LIMITS)
    assert verdict.failures == ["2 layer(s) with relative error > 0.1"]
    assert verdict.worst_layers == [("x.v_proj", 0.3), ("x.o_proj", 0.2)]


def test_nan_always_fails() -> None:
    nan = math.nan
    report = _report(nan, nan, layers={"x.v_proj": nan, "x.o_proj": 0.01})
    verdict = evaluate(report, LIMITS)
    assert not verdict.passed and len(verdict.failures) == 3
    assert verdict.worst_layers[0][0] == "x.v_proj"
    assert report.to_dict()["mean_kl"] is None
    json.dumps(report.to_dict(), allow_nan=False)


def test_failure_message_first_line_and_snippet() -> None:
    verdict = evaluate(_report(0.91, layers={"m.layers.3.mlp.down_proj": 4.12}), LIMITS)
    lines = failure_message(verdict, "int4", ["m.layers.3.mlp.down_proj", "lm_head"]).splitlines()
    assert lines[0] == (
        "precision check failed for int4: kl 0.91 > 0.1 (chat 0.91, math 0.91); "
        "1 layer(s) with relative error > 0.1; worst layers: m.layers.3.mlp.down_proj 4.12"
    )
    assert yaml.safe_load("\n".join(lines[2:])) == {
        "quantization": {
            "layer_overrides": [
                {"layers": ["m.layers.3.mlp.down_proj", "lm_head"], "precision": "float16"}
            ]
        }
    }
    assert json.loads(json.dumps(verdict.to_dict()))["worst_layers"][0]["rel_error"] == 4.12


# -- helpers ------------------------------------------------------------------------------------


def _of(probes: list[Probe], category: str) -> list[Probe]:
    return [probe for probe in probes if probe.category == category]


def _hook_count(model: Any) -> int:
    return sum(len(module._forward_hooks) for module in model.modules())


def _summary(report: CheckReport) -> dict[str, Any]:
    worst = sorted(report.layers, key=lambda layer: layer.rel_error, reverse=True)[:5]
    drift = max(report.layers, key=lambda layer: layer.output_rel_error)
    return {
        "seconds": round(report.seconds, 1),
        "positions": report.positions,
        "mean_kl": round(report.mean_kl, 4),
        "max_kl": round(report.max_kl, 3),
        "top1": round(report.top1, 4),
        "categories": {
            name: [round(stats.mean_kl, 4), round(stats.top1, 4)]
            for name, stats in report.categories.items()
        },
        "worst": [(layer.name, round(layer.rel_error, 4)) for layer in worst],
        "max_output_rel_error": (drift.name, round(drift.output_rel_error, 4)),
    }
