from backends.platform import (
    dtype_reason,
    emulation_reason,
    native_precisions,
    serving_dtype,
)


def test_int4_needs_avx512_on_cpu_only() -> None:
    assert "int4" not in native_precisions("cpu", frozenset({"avx2"}))
    assert "int4" in native_precisions("cpu", frozenset({"avx2", "avx512f"}))
    assert {"fp16", "int8"} <= native_precisions("cpu", frozenset({"avx2"}))
    assert "int4" in native_precisions("cuda", frozenset())


def test_amx_cpus_run_float16_and_emulate_int8() -> None:
    amx = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    assert native_precisions("cpu", amx) == {"fp16", "bf16", "int4"}
    assert serving_dtype("cpu", amx) == "float16"
    assert serving_dtype("cpu", amx | {"amx_fp16"}) == "float32"
    assert serving_dtype("cpu", frozenset({"avx2", "avx512f", "avx512_bf16"})) is None
    assert serving_dtype("cuda", amx) is None
    assert "AMX" in dtype_reason(amx)
    assert "AMX" in emulation_reason("int8", amx)
    assert "AVX-512" in emulation_reason("int4", frozenset({"avx2"}))


def test_cpus_without_bf16_arithmetic_run_float32() -> None:
    for flags in ({"avx2"}, {"avx2", "avx512f", "avx512bw"}):
        assert serving_dtype("cpu", frozenset(flags)) == "float32"
        assert "bf16" in dtype_reason(frozenset(flags))
    assert serving_dtype("cuda", frozenset({"avx2"})) is None
