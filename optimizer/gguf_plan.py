"""Pure planning of llama.cpp (GGUF) variants: which GGML type each tensor gets, the quantizer's
command line, and which 4-bit type wins on this machine.

What the recipe means for GGUF (policies/recipes/default.yaml, section ``gguf``):

* ``variants`` and their check thresholds: as for vLLM (the same precision check).
* ``gguf.types``: the GGML type of each variant (fp16 → F16, int8 → Q8_0); ``gguf.int4``: the
  4-bit candidates, of which the optimizer keeps the fastest on this machine that passes its
  check (``choose``).
* ``quantization.ignore`` and ``quantization.layer_overrides``: the named modules' tensors get the
  GGML type of the override's precision (``type_of``: float16 → F16, bfloat16 → BF16, int8 →
  Q8_0, int4 → the variant's own 4-bit type), passed to llama-quantize as ``--tensor-type``.
* Not applicable, and ignored for GGUF: ``quantization.group_size`` (GGML's blocks are fixed:
  32 weights, 256 for the K-quants), ``quantization.smoothing_strength`` (llama.cpp quantizes
  no activations ahead of time: nothing to smooth) and ``calibration`` (the types here round to
  nearest; no importance matrix is computed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optimizer.recipe import normalize_precision

FLOAT_TYPES = ("F32", "F16", "BF16")
INT8_TYPES = ("Q8_0",)
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS")
# llama-quantize's file types (its last argument) that name a mixture: the tensors it may give
# other types (K-quant mixes keep some at 6 bits) are its business unless an override says.
GGUF_FILE = "model.gguf"


class GGUFPlanError(ValueError):
    """A GGUF plan that cannot be made; one line naming the culprit."""


def precision_of(ggml_type: str) -> str:
    """The recipe precision a GGML tensor type stands for (``Q5_0`` and ``Q6_K``, which K-quant
    mixtures put in an int4 file, count as int4: they are what that variant is made of)."""
    name = ggml_type.upper()
    if name in ("F32", "F16"):
        return "fp16"
    if name == "BF16":
        return "bf16"
    if name.startswith("Q8"):
        return "int8"
    return "int4"


def is_quantized_type(ggml_type: str) -> bool:
    return ggml_type.upper() not in FLOAT_TYPES


def type_of(precision: str, variant_type: str) -> str:
    """The GGML type an override's ``precision`` means in a variant of ``variant_type``."""
    name = normalize_precision(precision)
    return {"fp16": "F16", "bf16": "BF16", "int8": "Q8_0"}.get(name, variant_type)


@dataclass(frozen=True)
class TensorOverride:
    """One ``--tensor-type`` of llama-quantize: a whole GGUF tensor name and its type."""

    module: str  # the Hugging Face module name the recipe named
    tensor: str  # its GGUF tensor, e.g. blk.3.attn_q.weight
    ggml_type: str

    def argument(self) -> str:
        # llama-quantize matches the pattern with std::regex_search: anchor it to the name.
        return f"^{re.escape(self.tensor)}$={self.ggml_type.lower()}"


def tensor_overrides(
    overrides: Mapping[str, str],
    gguf_names: Mapping[str, str],
    variant_type: str,
    present: Sequence[str],
) -> list[TensorOverride]:
    """The ``--tensor-type`` overrides of a variant (pure).

    ``overrides`` maps module names to recipe precisions (optimizer/layers.resolve_overrides);
    ``gguf_names`` maps module names to GGUF tensor names (gguf-py's name map); ``present`` lists
    the tensors of the F16 file. A module with no tensor in the file (a tied ``lm_head``, a
    container like ``model``) is skipped; an override that reaches no tensor at all is an error.
    """
    out: list[TensorOverride] = []
    have = set(present)
    reached = False
    for module, precision in overrides.items():
        tensor = gguf_names.get(module)
        if tensor is None or tensor not in have:
            continue
        reached = True
        out.append(TensorOverride(module, tensor, type_of(precision, variant_type)))
    if overrides and not reached:
        names = ", ".join(sorted(overrides))
        raise GGUFPlanError(f"quantization.layer_overrides: {names} name no tensor of the GGUF")
    return out


def quantize_argv(
    program: str, source: str, target: str, file_type: str, overrides: Sequence[TensorOverride]
) -> list[str]:
    """llama-quantize's command line: ``source`` (F16) into ``target`` as ``file_type``."""
    argv = [program]
    for override in overrides:
        if override.tensor == "token_embd.weight":
            argv += ["--token-embedding-type", override.ggml_type.lower()]
        elif override.tensor == "output.weight":
            argv += ["--output-tensor-type", override.ggml_type.lower()]
        else:
            argv += ["--tensor-type", override.argument()]
    return [*argv, source, target, file_type]


@dataclass(frozen=True)
class Candidate:
    """One 4-bit type tried: its precision check and its decoding speed here."""

    ggml_type: str
    passed: bool
    mean_kl: float
    top1: float
    tokens_per_s: float  # median decode speed (llama-bench), interleaved with the others
    bytes: int


def choose(candidates: Sequence[Candidate], tolerance: float) -> Candidate:
    """The candidate to keep: among those that passed their check, the fastest; a slower one
    within ``tolerance`` (a share of the fastest's time per token) counts as tied, and among
    the tied the lowest KL wins (pure). ``GGUFPlanError`` when none passed."""
    passed = [c for c in candidates if c.passed and c.tokens_per_s > 0]
    if not passed:
        tried = ", ".join(c.ggml_type for c in candidates) or "none"
        raise GGUFPlanError(f"no 4-bit candidate passed its precision check (tried {tried})")
    fastest = max(c.tokens_per_s for c in passed)
    tied = [c for c in passed if 1 / c.tokens_per_s <= (1 + tolerance) / fastest]
    return min(tied, key=lambda c: (c.mean_kl, -c.tokens_per_s))


def choice_reason(chosen: Candidate, candidates: Sequence[Candidate], tolerance: float) -> str:
    """One line for the log and metadata.json: what was measured and why this one."""
    figures = "; ".join(
        f"{c.ggml_type}: {c.tokens_per_s:.1f} tok/s, kl {c.mean_kl:.3f}"
        + ("" if c.passed else " (failed its check)")
        for c in candidates
    )
    return (
        f"{chosen.ggml_type} chosen: the fastest that passed, ties within "
        f"{tolerance:.0%} to the lowest KL ({figures})"
    )
