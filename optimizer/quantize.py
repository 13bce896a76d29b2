"""Quantization through llm-compressor: calibration set, modifiers, ``oneshot``, progress.

INT4 is GPTQ W4A16 (symmetric, grouped); INT8 is W8A8 as llm-compressor recommends
(SmoothQuant, then GPTQ). Nothing here decides *which* layers: ``layers.plan_variant`` does.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.layers import VariantPlan

SHIPPED_CALIBRATION = Path(__file__).parent / "data" / "calibration.jsonl"
_QUANTIZING = re.compile(r"Quantizing (\d+) module\(s\): \[(.*)\]")


@dataclass(frozen=True)
class CalibrationSpec:
    dataset: Path | None
    num_samples: int
    max_seq_length: int
    seed: int


def calibration_texts(spec: CalibrationSpec) -> list[str]:
    """``num_samples`` texts, drawn with a fixed seed, balanced across the file's categories."""
    path = spec.dataset or SHIPPED_CALIBRATION
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_category: dict[str, list[str]] = {}
    for row in rows:
        by_category.setdefault(str(row.get("category", "text")), []).append(str(row["text"]))
    rng = random.Random(spec.seed)
    pools = {name: rng.sample(texts, len(texts)) for name, texts in sorted(by_category.items())}
    picked: list[str] = []
    while len(picked) < spec.num_samples and any(pools.values()):
        for pool in pools.values():
            if pool and len(picked) < spec.num_samples:
                picked.append(pool.pop())
    return picked


def calibration_dataset(tokenizer: Any, spec: CalibrationSpec) -> Any:
    """A tokenized ``datasets.Dataset`` ready for ``oneshot`` (no hub access)."""
    from datasets import Dataset  # optimize env only, like llm-compressor

    encoded = tokenizer(
        calibration_texts(spec),
        max_length=spec.max_seq_length,
        truncation=True,
        add_special_tokens=False,
    )
    return Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    )


def _weights(bits: int, group_size: int | None) -> dict[str, Any]:
    """Symmetric integer weights: grouped for 4 bits, per output channel for 8 bits."""
    grouped = group_size is not None and bits == 4
    return {
        "num_bits": bits,
        "type": "int",
        "symmetric": True,
        "strategy": "group" if grouped else "channel",
        **({"group_size": group_size} if grouped else {}),
    }


# W8A8 as llm-compressor's preset defines it: dynamic per-token int8 activations.
_INT8_ACTIVATIONS = {
    "num_bits": 8,
    "type": "int",
    "symmetric": True,
    "strategy": "token",
    "dynamic": True,
}


def config_groups(plan: VariantPlan) -> dict[str, Any]:
    """compressed-tensors config groups targeting the plan's layers by exact name.

    int4 layers: W4A16 (GPTQ, grouped). int8 layers: W8A8 in the int8 variant; weight-only
    W8A16 when an override asks for int8 inside the int4 variant (activations stay 16-bit there).
    """
    groups: dict[str, Any] = {}
    int4 = list(plan.targets("int4"))
    int8 = list(plan.targets("int8"))
    if int4:
        groups["int4"] = {"targets": int4, "weights": _weights(4, plan.group_size)}
    if int8:
        group: dict[str, Any] = {"targets": int8, "weights": _weights(8, None)}
        if plan.precision == "int8":
            group["input_activations"] = dict(_INT8_ACTIVATIONS)
        groups["int8"] = group
    return groups


def build_modifiers(plan: VariantPlan, smoothing_strength: float) -> list[Any]:
    """llm-compressor modifiers for one variant: GPTQ, preceded by SmoothQuant for int8."""
    # llm-compressor (and torch under it) is in the optimize env only
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    groups = config_groups(plan)
    if not groups:
        raise ValueError(f"variant {plan.precision} quantizes no layer")
    gptq = GPTQModifier(config_groups=groups, ignore=list(plan.ignore))
    if plan.precision == "int8":
        return [SmoothQuantModifier(smoothing_strength=smoothing_strength), gptq]
    return [gptq]


@contextmanager
def module_progress(on_module: Callable[[str], None]) -> Iterator[None]:
    """Report each module GPTQ quantizes (llm-compressor logs them through loguru)."""
    from loguru import logger  # llm-compressor's dependency: optimize env only

    def sink(message: Any) -> None:
        match = _QUANTIZING.search(str(message.record["message"]))
        if match:
            for name in re.findall(r"'([^']+)'", match.group(2)):
                on_module(name)

    handler = logger.add(sink, level="INFO", format="{message}")
    try:
        yield
    finally:
        logger.remove(handler)


def run_oneshot(
    model: Any,
    tokenizer: Any,
    modifiers: list[Any],
    calibration: CalibrationSpec,
    on_module: Callable[[str], None],
) -> Any:
    """Quantize ``model`` in place with calibration data; return it."""
    from llmcompressor import oneshot  # optimize env only (loads torch)

    dataset = calibration_dataset(tokenizer, calibration)
    with module_progress(on_module):
        oneshot(
            model=model,
            tokenizer=tokenizer,
            dataset=dataset,
            recipe=modifiers,
            max_seq_length=calibration.max_seq_length,
            num_calibration_samples=calibration.num_samples,
            shuffle_calibration_samples=False,
        )
    return model
