from common.cpu import cpu_flags, cpu_model

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma
bogomips\t: 4000
processor\t: 1
model name\t: Other
flags\t\t: fpu sse2 avx avx2 fma avx512f
"""


def test_flags_of_the_first_processor() -> None:
    assert cpu_flags(CPUINFO) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags("no flags here") == frozenset()


def test_model_of_the_first_processor() -> None:
    assert cpu_model(CPUINFO) == "AMD EPYC"
    assert cpu_model("nothing") == ""
