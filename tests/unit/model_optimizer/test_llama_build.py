"""model_optimizer/llama_build.py's pure parts: what the machine lacks, progress, when to build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from model_optimizer import llama_build
from model_optimizer.envs import wants_llama_cpp
from model_optimizer.llama_build import EXPECTED_OBJECTS, BuildError, missing_tools, progress


def test_missing_tools_are_named() -> None:
    assert missing_tools(lambda name: f"/usr/bin/{name}") == []
    assert missing_tools(lambda name: None) == ["cmake", "a C++ compiler (g++ or clang++)"]
    only_clang = {"cmake": "/usr/bin/cmake", "clang++": "/usr/bin/clang++"}
    assert missing_tools(only_clang.get) == []


def test_amx_kernels_are_left_out_on_amx_cpus_only() -> None:
    plain = frozenset({"avx2", "avx512f", "avx512_vnni"})
    assert llama_build.cmake_flags(plain) == llama_build.CMAKE_FLAGS
    flags = llama_build.cmake_flags(plain | {"amx_int8", "amx_tile", "amx_bf16"})
    assert flags[: len(llama_build.CMAKE_FLAGS)] == llama_build.CMAKE_FLAGS
    c_flags = {f.partition("=")[0]: f.partition("=")[2] for f in flags if "_FLAGS=" in f}
    assert set(c_flags) == {"-DCMAKE_C_FLAGS", "-DCMAKE_CXX_FLAGS"}
    assert "-U__AMX_INT8__" in c_flags["-DCMAKE_CXX_FLAGS"].split()


def test_the_undefines_win_over_march_native_wherever_cmake_puts_them() -> None:
    """cmake writes CMAKE_CXX_FLAGS before ggml's -march=native; the compiler must still drop
    the macros that guard ggml's AMX code (and keep AVX-512 VNNI's). Checked on the machine's
    own compiler, with a CPU model that has AMX, whatever this CPU is."""
    compiler = shutil.which("g++") or shutil.which("clang++")
    assert compiler, "the llama.cpp build needs a C++ compiler; this machine has none"
    flags = llama_build.cmake_flags(frozenset({"amx_int8"}))
    undefines = next(f for f in flags if f.startswith("-DCMAKE_CXX_FLAGS=")).partition("=")[2]
    argv = [compiler, "-x", "c++", *undefines.split(), "-march=sapphirerapids", "-dM", "-E", "-"]
    macros = subprocess.run(argv, input="", capture_output=True, text=True, check=True).stdout
    assert "__AVX512VNNI__" in macros
    assert "__AMX" not in macros


def test_progress_is_shown_each_tenth_and_never_reaches_100() -> None:
    tenth = -(-EXPECTED_OBJECTS // 10)  # files for 10 %
    assert progress(1, 0) is None
    assert progress(tenth, 0) == 10
    assert progress(tenth + 1, 10) is None
    assert progress(EXPECTED_OBJECTS * 2, 80) == 99  # more files than counted once: 99 %
    assert progress(EXPECTED_OBJECTS * 2, 90) is None


def test_llama_cpp_is_built_on_cpu_hosts_unless_an_install_is_named() -> None:
    assert wants_llama_cpp([], gpu=False, environ={})
    assert not wants_llama_cpp([], gpu=True, environ={})
    assert wants_llama_cpp(["llama.cpp"], gpu=True, environ={})
    assert not wants_llama_cpp(["gateway"], gpu=False, environ={})
    assert not wants_llama_cpp([], gpu=False, environ={"MO_LLAMA_CPP": "/opt/llama.cpp"})


def test_a_machine_without_a_compiler_gets_one_line_and_nothing_half_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path))
    monkeypatch.setattr(llama_build.shutil, "which", lambda name: None)
    with pytest.raises(BuildError) as info:
        llama_build.ensure_llama_cpp(lambda message: None)
    message = str(info.value)
    assert "needs cmake and a C++ compiler" in message and "MO_LLAMA_CPP" in message
    assert "\n" not in message
    engines = tmp_path / "engines"
    assert [p.name for p in engines.iterdir()] == [".llama.cpp.lock"]  # no build folder
