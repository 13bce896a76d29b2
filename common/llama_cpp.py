"""Where llama.cpp is: the project's own build in the cache, or an install named by MO_LLAMA_CPP.

Standard library only: ``./mo``'s bare python3 builds it (model_optimizer/llama_build.py), the
backends start its ``llama-server`` and the optimizer runs its quantizer and converter.

The build folder is ``<cache>/engines/llama.cpp-<key>``, the key hashing the pinned source
(requirements/llama-cpp.txt), the build recipe and the CPU's flags: the build is compiled for the
CPU it runs on (``-march=native``), so another CPU kind gets a build of its own instead of one
that dies on an illegal instruction. ``MO_LLAMA_CPP=<folder>`` uses an existing llama.cpp
instead: a folder holding ``llama-server`` and ``llama-quantize`` (itself, or its ``bin/`` or
``build/bin/``), e.g. a llama.cpp checkout built with cmake; its ``convert_hf_to_gguf.py`` (at
the checkout's top) is needed only to turn a Hugging Face folder into GGUF.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.cpu import machine_flags
from common.env_paths import REQUIREMENTS, cache_root

ENGINE = "llama.cpp"
LLAMA_CPP_ENV = "MO_LLAMA_CPP"
PIN_FILE = "llama-cpp.txt"
# Bump when model_optimizer/llama_build.py builds differently for the same source.
BUILD_RECIPE = "1"
SERVER, QUANTIZE, BENCH = "llama-server", "llama-quantize", "llama-bench"
TARGETS = (SERVER, QUANTIZE, BENCH)
CONVERT_SCRIPT = "convert_hf_to_gguf.py"
# ggml's AMX kernels (compiled in when -march=native defines __AMX_INT8__) crashed every prompt
# batch on an AMX Xeon here (SIGSEGV in ggml_backend_amx_mul_mat; llama-bench -p 16: rc 139)
# while AMX itself ran a plain tdpbssd probe: on such CPUs the build leaves them out, keeping the
# AVX-512 kernels. GCC defines -march's macros before it reads -U, wherever -U stands.
AMX_FLAGS = frozenset({"amx_int8", "amx_tile", "amx_bf16"})
NO_AMX = ("-U__AMX_INT8__", "-U__AMX_TILE__", "-U__AMX_BF16__")
BUILD_INFO = "build.json"
COMPLETE = ".complete"


class LlamaCppMissing(RuntimeError):
    """No usable llama.cpp; the message is one line saying what to do."""


@dataclass(frozen=True)
class LlamaCpp:
    """One llama.cpp install: its programs, the HF→GGUF converter and what it calls itself."""

    root: Path
    server: Path
    quantize: Path
    bench: Path | None  # llama-bench: the optimizer measures 4-bit types with it
    convert: Path | None  # convert_hf_to_gguf.py (with its conversion/ and gguf-py/ beside it)
    version: str  # e.g. "llama.cpp==0c1e570": recorded in the variants built with it

    @property
    def framework(self) -> str:
        return self.version


def compiler_undefines(flags: frozenset[str]) -> tuple[str, ...]:
    """Macros the build undefines on a CPU with these flags (pure): AMX's, where it has AMX."""
    return NO_AMX if flags & AMX_FLAGS else ()


def build_key(pins: bytes, flags: frozenset[str]) -> str:
    """The build folder's key: the pinned source, the recipe and the CPU's flags (pure)."""
    digest = hashlib.sha256()
    digest.update(f"{BUILD_RECIPE}\n".encode())
    digest.update(pins)
    digest.update(b"\0" + " ".join(sorted(flags)).encode())
    undefines = compiler_undefines(flags)
    if undefines:  # a build of recipe 1 on an AMX CPU kept the kernels that crash: not reused
        digest.update(b"\0" + " ".join(undefines).encode())
    return digest.hexdigest()[:12]


def build_dir(root: Path | None = None, flags: frozenset[str] | None = None) -> Path:
    """Where this machine's own build lives (built or not)."""
    pins = (REQUIREMENTS / PIN_FILE).read_bytes()
    key = build_key(pins, machine_flags() if flags is None else flags)
    return (root or cache_root()) / "engines" / f"llama.cpp-{key}"


def _program(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / "bin" / name, folder / "build" / "bin" / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def locate(environ: Mapping[str, str] | None = None) -> LlamaCpp:
    """The llama.cpp to use: ``MO_LLAMA_CPP`` when set, else this machine's completed build."""
    environ = os.environ if environ is None else environ
    given = environ.get(LLAMA_CPP_ENV, "").strip()
    if given:
        return _existing(Path(given).expanduser())
    folder = build_dir()
    if not (folder / COMPLETE).is_file():
        raise LlamaCppMissing(
            f"llama.cpp is not built yet ({folder}): run ./mo setup, or point {LLAMA_CPP_ENV} "
            "at an existing llama.cpp"
        )
    info = json.loads((folder / BUILD_INFO).read_text())
    convert = folder / "convert" / CONVERT_SCRIPT
    return LlamaCpp(
        root=folder,
        server=folder / "bin" / SERVER,
        quantize=folder / "bin" / QUANTIZE,
        bench=folder / "bin" / BENCH,
        convert=convert if convert.is_file() else None,
        version=f"{ENGINE}=={info.get('commit', 'unknown')}",
    )


def _existing(folder: Path) -> LlamaCpp:
    if not folder.is_dir():
        raise LlamaCppMissing(f"{LLAMA_CPP_ENV}={folder}: no such folder")
    server, quantize = _program(folder, SERVER), _program(folder, QUANTIZE)
    if server is None or quantize is None:
        missing = SERVER if server is None else QUANTIZE
        raise LlamaCppMissing(
            f"{LLAMA_CPP_ENV}={folder}: no executable {missing} in it, its bin/ or build/bin/"
        )
    convert = folder / CONVERT_SCRIPT
    return LlamaCpp(
        root=folder,
        server=server,
        quantize=quantize,
        bench=_program(folder, BENCH),
        convert=convert if convert.is_file() else None,
        version=f"{ENGINE}==external",
    )
