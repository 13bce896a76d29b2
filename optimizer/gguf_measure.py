"""The two measurements of a GGUF variant: its decoding speed here (``phase_time``, llama-bench,
for choosing the 4-bit type) and its precision check against the original (``phase_check``,
optimizer/check.py on the GGUF loaded dequantized by transformers). Optimize environment.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.llama_cpp import LlamaCpp
from optimizer.check import CheckThresholds, compare_models, evaluate, failure_message
from optimizer.gguf_layout import type_name
from optimizer.gguf_plan import is_quantized_type
from optimizer.gguf_table import read_table
from optimizer.layers import fused_siblings
from optimizer.pipeline import COMPUTE_DTYPE_NAME, Job, Progress, _dtype
from optimizer.probes import load_probes

BENCH_TOKENS = 128
BENCH_ROUNDS = 5


class GGUFBuildError(RuntimeError):
    """llama.cpp's tools failed, or their results cannot be used; one line naming the step."""


def phase_time(cpp: LlamaCpp, files: Mapping[str, Path], say: Progress) -> dict[str, float]:
    """Median decode speed (tokens/s) of each file, ``llama-bench`` rounds interleaved."""
    if len(files) < 2:
        return {name: 0.0 for name in files}
    if cpp.bench is None:
        raise GGUFBuildError(f"{cpp.root} has no llama-bench to time the 4-bit candidates")
    samples: dict[str, list[float]] = {name: [] for name in files}
    for round_ in range(BENCH_ROUNDS):
        order = list(files)[round_ % len(files) :] + list(files)[: round_ % len(files)]
        for name in order:
            samples[name].append(_bench(cpp, files[name]))
    speeds = {name: statistics.median(values) for name, values in samples.items()}
    say("gguf: decode speed " + ", ".join(f"{n} {v:.1f} tok/s" for n, v in speeds.items()))
    return speeds


def _bench(cpp: LlamaCpp, file: Path) -> float:
    """One ``llama-bench`` decode run: one thread, as a tier runs (backends/llama_args.py), and
    without this process's OMP_WAIT_POLICY=PASSIVE (it makes llama.cpp's OpenMP threads three
    times slower)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    argv = [
        str(cpp.bench),
        "-m",
        str(file),
        "-p",
        "0",
        "-n",
        str(BENCH_TOKENS),
        "-r",
        "1",
        "-t",
        "1",
        "-o",
        "json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600, env=env)
    try:
        rows = json.loads(done.stdout)
        return float(rows[0]["avg_ts"])
    except (ValueError, KeyError, IndexError, TypeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise GGUFBuildError(f"llama-bench failed on {file.name}: {tail}") from None


def phase_check(
    job: Job, variant: str, original: Any, tokenizer: Any, file: Path, judged: list[str]
) -> dict[str, Any]:
    """Load the GGUF dequantized and compare it with the original on the probes."""
    from transformers import AutoModelForCausalLM  # optimize env only

    candidate = AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=_dtype(COMPUTE_DTYPE_NAME)
    )
    report = compare_models(original, candidate.eval(), tokenizer, load_probes())
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
        modules = [name for name, _ in original.named_modules() if name]
        keep = fused_siblings([name for name, _ in verdict.worst_layers], modules)
        result["message"] = failure_message(verdict, variant, layers=keep)
    return result


def judged_modules(file: Path, names: Mapping[str, str]) -> list[str]:
    """The modules whose weights the GGUF stores quantized (what the check judges)."""
    out = []
    for tensor in read_table(file).tensors:
        module = names.get(tensor.name.removesuffix(".weight"))
        if (
            module
            and tensor.name.endswith(".weight")
            and is_quantized_type(type_name(tensor.type_id))
        ):
            out.append(module)
    return out
