"""Build llama.cpp from its PyPI source with the system compiler, once per source and CPU kind.

Standard library only: ``./mo`` runs it (through model_optimizer/envs.py) with the machine's
python3. Phases: download the pinned sdist with pip (hash-checked), unpack its
``vendor/llama.cpp``, configure with cmake (native CPU kernels, static programs, no network:
no curl, no OpenSSL, no prebuilt web UI), build ``llama-server``, ``llama-quantize`` and
``llama-bench``, then install them with the HF→GGUF converter into a staging folder renamed
into place (common/llama_cpp.py says where). The source and the objects are removed after.
A machine without cmake or a C++ compiler gets one line saying so, and nothing is left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from common.cpu import machine_flags
from common.env_paths import REQUIREMENTS, cache_lock
from common.llama_cpp import (
    BUILD_INFO,
    COMPLETE,
    CONVERT_SCRIPT,
    PIN_FILE,
    SERVER,
    TARGETS,
    build_dir,
    compiler_undefines,
)

SOURCE_IN_SDIST = "vendor/llama.cpp"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",  # this CPU's instructions (the build folder is keyed by its flags)
    "-DBUILD_SHARED_LIBS=OFF",  # programs that can be moved: no libllama.so beside them
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # it would fetch the web UI from a model hub
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CCACHE=OFF",
)
# What the converter needs beside convert_hf_to_gguf.py (it imports them from its own folder).
CONVERT_PARTS = (CONVERT_SCRIPT, "conversion", "gguf-py")
# Objects compiled by a build of the pinned source's targets (counted once; cmake's own "[ 42%]"
# prefixes are per target and jump back and forth, so progress counts compiled files instead).
EXPECTED_OBJECTS = 196
_COMPILED = re.compile(r"Building (C|CXX|ASM) object ")


def cmake_flags(flags: frozenset[str]) -> tuple[str, ...]:
    """cmake's options for a CPU with these flags (pure): CMAKE_FLAGS, and on an AMX CPU the
    C and C++ flags that leave ggml's AMX kernels out (common/llama_cpp.py says why)."""
    undefines = " ".join(compiler_undefines(flags))
    if not undefines:
        return CMAKE_FLAGS
    return (*CMAKE_FLAGS, f"-DCMAKE_C_FLAGS={undefines}", f"-DCMAKE_CXX_FLAGS={undefines}")


Say = Callable[[str], None]


class BuildError(RuntimeError):
    """The build could not be done; one line naming the cause (and the log)."""


def missing_tools(which: Callable[[str], str | None] | None = None) -> list[str]:
    """What the build needs and this machine lacks (pure over ``which``, shutil's by default)."""
    which = which or shutil.which
    missing = [] if which("cmake") else ["cmake"]
    if not any(which(cxx) for cxx in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    return missing


def progress(compiled: int, shown: int, every: int = 10) -> int | None:
    """The build's percentage after ``compiled`` files when it is worth a progress line (another
    ``every`` percent since ``shown``, the last one shown), else None (pure; at most 99)."""
    percent = min(99, compiled * 100 // EXPECTED_OBJECTS)
    return percent if percent >= shown + every else None


def ensure_llama_cpp(say: Say, jobs: int | None = None) -> Path:
    """This machine's llama.cpp build (built now if missing); ``BuildError`` if it cannot be."""
    flags = machine_flags()
    folder = build_dir(flags=flags)
    if (folder / COMPLETE).is_file():
        return folder
    with cache_lock(folder.parent / ".llama.cpp.lock", lambda: say("waiting for another build")):
        if (folder / COMPLETE).is_file():
            return folder
        missing = missing_tools()
        if missing:
            raise BuildError(
                f"llama.cpp is built from source and needs {' and '.join(missing)}: install "
                "them (Debian: apt-get install cmake g++), or point MO_LLAMA_CPP at an existing "
                "llama.cpp"
            )
        started = time.monotonic()
        say(f"building llama.cpp into {folder} (about 5-8 minutes on 2 cores, once) ...")
        folder.parent.mkdir(parents=True, exist_ok=True)
        log = folder.with_name(folder.name + ".log")
        work = Path(tempfile.mkdtemp(prefix=".llama-build-", dir=folder.parent))
        try:
            with log.open("w") as out:
                source, commit = phase_source(work, out)
                jobs = jobs or os.cpu_count() or 1
                cmake = cmake_flags(flags)
                build = phase_build(source, commit, work / "build", cmake, out, say, jobs)
            phase_install(source, commit, build, folder, cmake, time.monotonic() - started)
        except subprocess.CalledProcessError as exc:
            raise BuildError(f"building llama.cpp failed: {_last_error(log)} (log: {log})") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        say(f"llama.cpp ready ({time.monotonic() - started:.0f}s)")
    return folder


def phase_source(work: Path, log: TextIO) -> tuple[Path, str]:
    """Download the pinned sdist (pip checks its hash) and unpack its llama.cpp tree; also its
    commit (the sdist keeps the submodule's git HEAD, not the repository cmake would ask)."""
    download = work / "download"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--require-hashes",
            "-r",
            str(REQUIREMENTS / PIN_FILE),
            "-d",
            str(download),
        ],
        log,
    )
    archives = sorted(download.glob("*.tar.gz"))
    if len(archives) != 1:
        raise BuildError(f"expected one source archive in {download}, found {len(archives)}")
    with tarfile.open(archives[0]) as tar:
        top = tar.getnames()[0].split("/")[0]
        prefix = f"{top}/{SOURCE_IN_SDIST}/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(work / "src", members=members, filter="data")
        head_name = f"{top}/.git/modules/{SOURCE_IN_SDIST}/HEAD"
        head = tar.extractfile(head_name) if _has(tar, head_name) else None
        commit = head.read().decode().strip()[:7] if head is not None else "unknown"
    archives[0].unlink()
    return work / "src" / top / SOURCE_IN_SDIST, commit


def _has(tar: tarfile.TarFile, name: str) -> bool:
    try:
        tar.getmember(name)
    except KeyError:
        return False
    return True


def phase_build(
    source: Path,
    commit: str,
    build: Path,
    cmake: tuple[str, ...],
    log: TextIO,
    say: Say,
    jobs: int,
) -> Path:
    """Configure and build the programs, a progress line each tenth of the files compiled."""
    version = [f"-DLLAMA_BUILD_COMMIT={commit}", "-DLLAMA_BUILD_NUMBER=0"]
    _run(["cmake", "-S", str(source), "-B", str(build), *cmake, *version], log)
    cmd = ["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)]
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        shown, compiled = 0, 0
        for line in proc.stdout:
            log.write(line)
            compiled += bool(_COMPILED.search(line))
            percent = progress(compiled, shown)
            if percent is not None:
                shown = percent // 10 * 10
                say(f"llama.cpp build {percent}% ({compiled} files compiled)")
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd)
    return build / "bin"


def phase_install(
    source: Path,
    commit: str,
    bin_dir: Path,
    folder: Path,
    cmake: tuple[str, ...],
    seconds: float,
) -> None:
    """Programs, converter, license and build.json into ``folder`` (staged, then renamed)."""
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=folder.parent))
    try:
        (staging / "bin").mkdir()
        for name in TARGETS:
            shutil.copy2(bin_dir / name, staging / "bin" / name)
        (staging / "convert").mkdir()
        for part in CONVERT_PARTS:
            if (source / part).is_dir():
                shutil.copytree(source / part, staging / "convert" / part)
            else:
                shutil.copy2(source / part, staging / "convert" / part)
        shutil.copy2(source / "LICENSE", staging / "LICENSE")
        version = subprocess.run(
            [str(staging / "bin" / SERVER), "--version"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if version.returncode != 0:  # a build that does not run here is no build
            raise BuildError(f"the built {SERVER} does not run: {version.stderr.strip()[-200:]}")
        info = {
            "source": (REQUIREMENTS / PIN_FILE).read_text().strip().splitlines()[-1].split()[0],
            "commit": commit,
            "cmake": list(cmake),
            "seconds": round(seconds),
        }
        (staging / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (folder / COMPLETE).write_text(f"{seconds:.0f}s\n")


def _run(cmd: list[str], log: TextIO) -> None:
    log.flush()
    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)


def _last_error(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    for line in reversed(lines):
        if "error" in line.lower():
            return line[-240:]
    return lines[-1][-240:] if lines else "empty log"
