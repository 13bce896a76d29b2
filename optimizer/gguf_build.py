"""llama.cpp (GGUF) variants, the I/O side: ``optimize_gguf(job)`` writes the recipe's variants
as GGUF folders for llama.cpp tiers, each checked against the original like the vLLM ones.

Phases, one function each:

1. ``phase_base``: the source as one F16 GGUF. A GGUF source is requantized by llama.cpp's own
   quantizer (``--allow-requantize``: its tokenizer and metadata stay as llama.cpp wrote them);
   a Hugging Face folder is converted by llama.cpp's ``convert_hf_to_gguf.py``.
2. ``phase_quantize``: ``llama-quantize`` into each variant's GGML type, with the recipe's layer
   overrides as ``--tensor-type`` (optimizer/gguf_plan.py says what applies).
3. ``phase_time``: the 4-bit candidates' decoding speed here, ``llama-bench`` runs interleaved.
4. ``phase_check``: transformers loads the GGUF dequantized and optimizer/check.py compares it
   with the original on the probes (KL, top-1, layers that drift): the weights' error. What
   llama.cpp's kernels add (activations quantized to 8 bits in its dot products) is measured
   in the engine by ``up``'s admission check.
5. ``phase_write``: the folder (``model.gguf``, the tokenizer files the gateway counts with,
   ``generation_config.json``, ``layout.json``, ``kv_cache_config.json``, ``metadata.json``),
   staged and renamed: complete or absent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.cpu import cpu_model, read_cpuinfo
from common.llama_cpp import LlamaCpp, LlamaCppMissing, locate
from common.variant_folder import METADATA
from optimizer import artifacts
from optimizer.artifacts import InputKey
from optimizer.gguf_measure import GGUFBuildError, judged_modules, phase_check, phase_time
from optimizer.gguf_plan import (
    GGUF_FILE,
    Candidate,
    GGUFPlanError,
    TensorOverride,
    choice_reason,
    choose,
    quantize_argv,
    tensor_overrides,
)
from optimizer.gguf_table import read_table
from optimizer.gguf_write import FORMAT, Made, write_variant
from optimizer.layers import resolve_overrides
from optimizer.pipeline import (
    OPTIMIZER_VERSION,
    CheckFailed,
    Job,
    Progress,
    VariantResult,
    phase_load,
)
from optimizer.probes import load_probes
from optimizer.recipe import is_quantized, normalize_precision, recipe_hash
from optimizer.sources import source_fingerprint

# Bump when this module's output changes for the same inputs.
GGUF_BUILD_VERSION = "2"  # 2: the 4-bit candidates timed on one thread, without OMP_*


def is_gguf_target(target_framework: str) -> bool:
    return target_framework.strip().lower().startswith("llama.cpp")


def variant_type(job: Job, variant: str) -> str:
    """The GGML file type of a variant that has one type (int4's is chosen among candidates)."""
    gguf = job.recipe.gguf
    name = normalize_precision(variant)
    return {"fp16": gguf.fp16, "bf16": gguf.bf16, "int8": gguf.int8}.get(name, gguf.int4[0])


def tool_versions(cpp: LlamaCpp, measured: bool) -> dict[str, str]:
    import importlib.metadata

    versions = {
        "model-optimizer": OPTIMIZER_VERSION,
        "gguf-build": GGUF_BUILD_VERSION,
        "llama.cpp": cpp.version,
    }
    for tool in ("torch", "transformers", "gguf"):
        versions[tool] = importlib.metadata.version(tool)
    if measured:  # the 4-bit type is chosen by timing it: another CPU may choose another
        versions["cpu"] = cpu_model(read_cpuinfo()) or "unknown"
    return versions


def input_key(job: Job, variant: str, fingerprint: str, cpp: LlamaCpp) -> InputKey:
    measured = normalize_precision(variant) == "int4" and len(job.recipe.gguf.int4) > 1
    return InputKey(
        source_fingerprint=fingerprint,
        recipe_hash=recipe_hash(job.recipe, FORMAT),
        variant=variant,
        tool_versions=tool_versions(cpp, measured),
        target_framework=cpp.version,
        compile_level=0,
    )


def optimize_gguf(job: Job, say: Progress) -> list[VariantResult]:
    """Build every variant of ``job`` as GGUF; raise ``CheckFailed`` after writing the others."""
    try:
        cpp = locate()
    except LlamaCppMissing as exc:
        raise GGUFBuildError(str(exc)) from None
    fingerprint = source_fingerprint(job.source)
    keys = {name: input_key(job, name, fingerprint, cpp) for name in job.outputs}
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
    names = {gguf: module for module, gguf in gguf_names(original).items()}
    first = next(iter(job.outputs.values()))
    first.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-work-", dir=first.parent) as tmp:
        work = Path(tmp)
        base = phase_base(job, cpp, work, say)
        failures: list[str] = []
        for name in pending:
            result = build_variant(
                job, cpp, name, keys[name], base, original, tokenizer, names, say
            )
            results.append(result)
            if not result.passed:
                failures.append(result.metadata["check"]["message"])
    if failures:
        raise CheckFailed("\n".join(failures))
    return results


def gguf_names(model: Any) -> dict[str, str]:
    """Module name → GGUF tensor name (without ``.weight``), by gguf-py's name map for the
    model's architecture; modules it does not know are left out."""
    import gguf  # optimize env only

    arch = _architecture(model.config)
    blocks = int(getattr(model.config, "num_hidden_layers", 0) or 0)
    mapping = gguf.get_tensor_name_map(arch, blocks)
    out: dict[str, str] = {}
    for module, _ in model.named_modules():
        name = mapping.get_name(module) if module else None
        if name:
            out[module] = name
    if "lm_head" not in out and getattr(model, "lm_head", None) is not None:
        out["lm_head"] = "output"
    return out


def _architecture(config: Any) -> Any:
    import gguf  # optimize env only

    wanted = str(getattr(config, "model_type", "")).lower()
    for arch, label in gguf.MODEL_ARCH_NAMES.items():
        if label == wanted:
            return arch
    raise GGUFPlanError(f"gguf-py knows no architecture {wanted!r}: this model has no GGUF form")


def phase_base(job: Job, cpp: LlamaCpp, work: Path, say: Progress) -> Path:
    """The source as one 16-bit GGUF file in ``work`` (every variant is made from it)."""
    target = work / "base.gguf"
    started = time.monotonic()
    if job.source.kind == "gguf":
        # BF16: the bytes of the reference folder the check compares with (sources.py converts
        # a GGUF source to bf16), so an unquantized GGUF variant is exact, as on vLLM.
        say(f"gguf: {job.source.path.name} → BF16 (llama-quantize --allow-requantize)")
        argv = [str(cpp.quantize), "--allow-requantize", str(job.source.path), str(target), "BF16"]
        _run(argv, work / "base.log", "requantizing the source to BF16")
    else:
        if cpp.convert is None:
            raise GGUFBuildError(
                f"{cpp.root} has no convert_hf_to_gguf.py: a Hugging Face folder cannot be turned "
                "into GGUF with it (use the project's own build, or a llama.cpp checkout)"
            )
        say(f"gguf: {job.model_dir} → GGUF (convert_hf_to_gguf.py, its own 16-bit type)")
        argv = [
            sys.executable,
            str(cpp.convert),
            str(job.model_dir),
            "--outtype",
            "auto",
            "--outfile",
            str(target),
        ]
        _run(argv, work / "base.log", "converting the model to GGUF")
    say(f"gguf: 16-bit base ready in {time.monotonic() - started:.1f}s")
    return target


def overrides_for(job: Job, variant: str, original: Any, base: Path, file_type: str) -> list[Any]:
    """The recipe's ignore list and layer overrides as llama-quantize tensor types."""
    if not is_quantized(variant):
        return []
    quant = job.recipe.quantization
    modules = [name for name, _ in original.named_modules() if name]
    wanted: dict[str, str] = {}
    if job.recipe.gguf.layer_overrides is not None:
        wanted.update(resolve_overrides(job.recipe.gguf.layer_overrides, modules))
    else:
        for pattern in quant.ignore:
            for module in resolve_overrides([_keep(pattern)], modules):
                wanted[module] = "fp16"
        wanted.update(resolve_overrides(quant.layer_overrides, modules))
    names = {module: f"{tensor}.weight" for module, tensor in gguf_names(original).items()}
    return tensor_overrides(wanted, names, file_type, read_table(base).names())


def _keep(pattern: str) -> Any:
    from optimizer.recipe import LayerOverride

    return LayerOverride(layers=[pattern], precision="fp16")


def phase_quantize(
    cpp: LlamaCpp, base: Path, target: Path, file_type: str, overrides: list[TensorOverride]
) -> Path:
    """``llama-quantize`` from the 16-bit base (its own type is a copy of it)."""
    base_type = "BF16" if read_table(base).metadata.get("general.file_type") == 32 else "F16"
    if file_type == base_type and not overrides:
        shutil.copyfile(base, target)
        return target
    argv = quantize_argv(str(cpp.quantize), str(base), str(target), file_type, overrides)
    _run(argv, target.with_suffix(".log"), f"quantizing to {file_type}")
    return target


def build_variant(
    job: Job,
    cpp: LlamaCpp,
    variant: str,
    key: InputKey,
    base: Path,
    original: Any,
    tokenizer: Any,
    names: Mapping[str, str],
    say: Progress,
) -> VariantResult:
    """Quantize (choosing the 4-bit type by measurement), check and write one variant."""
    started = time.monotonic()
    work = base.parent / variant
    work.mkdir()
    types = (
        list(job.recipe.gguf.int4)
        if normalize_precision(variant) == "int4"
        else [variant_type(job, variant)]
    )
    files: dict[str, Path] = {}
    applied: dict[str, dict[str, str]] = {}
    for file_type in types:
        overrides = overrides_for(job, variant, original, base, file_type)
        applied[file_type] = {o.module: o.ggml_type for o in overrides}
        say(
            f"[{variant}] quantize: {file_type}"
            + (f", {len(overrides)} overrides" if overrides else "")
        )
        files[file_type] = phase_quantize(
            cpp, base, work / f"{file_type}.gguf", file_type, overrides
        )
    speeds = phase_time(cpp, files, say)
    checks: dict[str, dict[str, Any]] = {}
    for file_type, file in files.items():
        say(f"[{variant}] check {file_type}: {len(load_probes())} probe prompts vs the original")
        checks[file_type] = phase_check(
            job, variant, original, tokenizer, file, judged_modules(file, names)
        )
    candidates = [
        Candidate(
            ggml_type=t,
            passed=bool(checks[t]["passed"]),
            mean_kl=float(checks[t]["report"]["mean_kl"] or 0.0),
            top1=float(checks[t]["report"]["top1"] or 0.0),
            tokens_per_s=speeds[t],
            bytes=files[t].stat().st_size,
        )
        for t in types
    ]
    choice: dict[str, Any] | None = None
    if len(candidates) > 1:
        tolerance = job.recipe.gguf.speed_tolerance
        try:
            chosen = choose(candidates, tolerance).ggml_type
            choice = {
                "reason": choice_reason(choose(candidates, tolerance), candidates, tolerance),
                "candidates": [c.__dict__ for c in candidates],
            }
            say(f"[{variant}] {choice['reason']}")
        except GGUFPlanError:
            chosen = min(candidates, key=lambda c: c.mean_kl).ggml_type  # report the closest
    else:
        chosen = types[0]
    made = Made(files[chosen], chosen, checks[chosen], choice, applied[chosen])
    return write_variant(job, variant, key, made, names, started, say)


def _run(argv: list[str], log: Path, step: str) -> None:
    with log.open("w") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line]
        tail = lines[-1][-200:] if lines else "no output"
        raise GGUFBuildError(f"{step} failed (exit {done.returncode}): {tail}")


def verify_gguf(model_dir: Path, variant_dir: Path, recipe: Any, say: Progress) -> dict[str, Any]:
    """Re-run the precision check of a GGUF variant folder against its original model (the
    ``check`` command): ``CheckFailed`` with the message ``optimize`` would give."""
    from optimizer.sources import ModelSource

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
    names = {gguf: module for module, gguf in gguf_names(original).items()}
    file = variant_dir / str(meta.get("file", GGUF_FILE))
    say(f"[{variant}] check: {file} against {model_dir}")
    check = phase_check(job, variant, original, tokenizer, file, judged_modules(file, names))
    if not check["passed"]:
        raise CheckFailed(check["message"])
    report = check["report"]
    say(f"[{variant}] ok: kl {report['mean_kl']:.4f}, top-1 {report['top1']:.3f}")
    return check
