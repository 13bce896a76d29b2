from backends.platform import cpu_flags, native_precisions

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx avx2 fma
bogomips\t: 4000
processor\t: 1
flags\t\t: fpu sse2 avx avx2 fma avx512f
"""


def test_flags_of_the_first_processor() -> None:
    assert cpu_flags(CPUINFO) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags("no flags here") == frozenset()


def test_int4_needs_avx512_on_cpu_only() -> None:
    assert "int4" not in native_precisions("cpu", frozenset({"avx2"}))
    assert "int4" in native_precisions("cpu", frozenset({"avx2", "avx512f"}))
    assert {"fp16", "int8"} <= native_precisions("cpu", frozenset({"avx2"}))
    assert "int4" in native_precisions("cuda", frozenset())
