"""common/llama_cpp.py: the build's key and finding llama.cpp (the project's build or
MO_LLAMA_CPP)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from common import llama_cpp
from common.llama_cpp import LlamaCppMissing, build_key, locate


def _program(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_build_key_follows_the_pins_and_the_cpu() -> None:
    avx2, avx512 = frozenset({"avx2"}), frozenset({"avx2", "avx512f"})
    assert build_key(b"pins", avx2) == build_key(b"pins", frozenset({"avx2"}))
    assert build_key(b"pins", avx2) != build_key(b"pins", avx512)  # -march=native
    assert build_key(b"pins", avx2) != build_key(b"other pins", avx2)
    assert len(build_key(b"pins", avx2)) == 12


def test_an_amx_cpu_gets_a_build_of_its_own_and_the_others_keep_theirs() -> None:
    avx512 = frozenset({"avx2", "avx512f"})
    recipe_1 = hashlib.sha256(b"1\npins\0avx2 avx512f").hexdigest()[:12]
    assert build_key(b"pins", avx512) == recipe_1  # built before the AMX rule: still reused
    amx = avx512 | {"amx_int8", "amx_tile"}
    recipe_1_amx = hashlib.sha256(b"1\npins\0" + " ".join(sorted(amx)).encode()).hexdigest()
    assert build_key(b"pins", amx) != recipe_1_amx[:12]  # its kernels crashed: built again


def test_an_existing_install_is_found_in_its_bin_folder(tmp_path: Path) -> None:
    server = _program(tmp_path / "build" / "bin" / "llama-server")
    quantize = _program(tmp_path / "build" / "bin" / "llama-quantize")
    (tmp_path / "convert_hf_to_gguf.py").write_text("")
    found = locate({"MO_LLAMA_CPP": str(tmp_path)})
    assert (found.server, found.quantize) == (server, quantize)
    assert found.bench is None  # llama-bench is optional
    assert found.convert == tmp_path / "convert_hf_to_gguf.py"
    assert found.version == "llama.cpp==external"


def test_an_install_without_its_server_is_one_line(tmp_path: Path) -> None:
    _program(tmp_path / "llama-quantize")
    with pytest.raises(LlamaCppMissing, match="no executable llama-server") as info:
        locate({"MO_LLAMA_CPP": str(tmp_path)})
    assert "\n" not in str(info.value)
    with pytest.raises(LlamaCppMissing, match="no such folder"):
        locate({"MO_LLAMA_CPP": str(tmp_path / "nowhere")})


def test_the_own_build_is_used_once_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path))
    folder = llama_cpp.build_dir()
    assert folder.parent == tmp_path / "engines"
    with pytest.raises(LlamaCppMissing, match=r"not built yet.*\./mo setup"):
        locate({})
    _program(folder / "bin" / "llama-server")
    _program(folder / "bin" / "llama-quantize")
    (folder / "build.json").write_text(json.dumps({"commit": "0c1e570"}))
    with pytest.raises(LlamaCppMissing):  # no .complete: a build that did not finish
        locate({})
    (folder / ".complete").write_text("300s\n")
    assert locate({}).version == "llama.cpp==0c1e570"
