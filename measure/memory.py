"""Peak memory of the serving backends while a run is measured.

A backend is one vLLM OpenAI server (``vllm.entrypoints.openai.api_server``) and every process
under it (engine core, workers). For a tier URL it is the process listening on that port; for a
gateway URL, the vLLM servers started under the gateway's process (``model-optimizer up``);
a gateway run without its own tiers (``python -m gateway``) has none to sample.

RSS is summed over the tree (backends/process_tree.py, the one implementation the gateway and
the benchmark scripts use too), sampled every ``interval`` seconds in a thread. GPU memory comes
from NVML when the ``pynvml`` module imports and a GPU answers (per process, summed over the
tree); otherwise it is ``None``: there is no GPU figure on a CPU host, not a zero one.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import psutil

from backends.process_tree import tree_pids, tree_rss_bytes

VLLM_SERVER = "vllm.entrypoints.openai.api_server"
LLAMA_SERVER = "llama-server"


@dataclass(frozen=True)
class Backend:
    """One tier server (vLLM or llama-server): its tier name (the variant folder's name), port
    and pid."""

    name: str
    port: int
    pid: int


@dataclass(frozen=True)
class PeakMemory:
    name: str
    pid: int
    peak_rss_mib: float
    peak_gpu_mib: float | None


def tier_server(cmdline: list[str]) -> tuple[str, int] | None:
    """(tier name, port) when ``cmdline`` starts a vLLM OpenAI server or a llama-server, else
    ``None`` (pure). The name is the variant folder's: vLLM's ``--model`` is the folder,
    llama-server's the ``model.gguf`` in it."""
    llama = bool(cmdline) and Path(cmdline[0]).name == LLAMA_SERVER
    if not (llama or VLLM_SERVER in cmdline) or "--port" not in cmdline:
        return None
    try:
        port = int(cmdline[cmdline.index("--port") + 1])
    except (IndexError, ValueError):
        return None
    name = f"port {port}"
    if "--model" in cmdline and cmdline.index("--model") + 1 < len(cmdline):
        model = Path(cmdline[cmdline.index("--model") + 1])
        name = model.parent.name if llama else model.name
    return name, port


def backends_of(pid: int) -> list[Backend]:
    """``pid`` itself when it is a vLLM server, else the vLLM servers among its descendants."""
    try:
        root = psutil.Process(pid)
        candidates = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found = []
    for proc in candidates:
        with contextlib.suppress(psutil.Error):
            server = tier_server(proc.cmdline())
            if server is not None:
                found.append(Backend(server[0], server[1], proc.pid))
                if proc.pid == pid:
                    break
    return sorted(found, key=lambda b: b.port)


def _nvml() -> ModuleType | None:
    """pynvml, initialised, when it is installed and a driver answers; else ``None``."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # no module, no driver, no GPU: all mean "no GPU figure"
        return None
    return nvml


def gpu_bytes(nvml: Any, pids: list[int]) -> int:
    """GPU memory used by ``pids`` on every device NVML sees."""
    wanted = set(pids)
    total = 0
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid in wanted and proc.usedGpuMemory:
                total += int(proc.usedGpuMemory)
    return total


@dataclass
class PeakSampler:
    """``with PeakSampler(backends): ...`` → ``.peaks()`` after (or during) the block."""

    backends: list[Backend]
    interval: float = 0.2
    _rss: dict[int, int] = field(default_factory=dict)
    _gpu: dict[int, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _nvml: ModuleType | None = None

    def __enter__(self) -> PeakSampler:
        self._nvml = _nvml() if self.backends else None
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="peak-memory")
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        for backend in self.backends:
            rss = tree_rss_bytes(backend.pid) or 0  # gone: no sample
            self._rss[backend.pid] = max(self._rss.get(backend.pid, 0), rss)
            if self._nvml is not None:
                with contextlib.suppress(Exception):
                    used = gpu_bytes(self._nvml, tree_pids(backend.pid))
                    self._gpu[backend.pid] = max(self._gpu.get(backend.pid, 0), used)

    def peaks(self) -> list[PeakMemory]:
        return [
            PeakMemory(
                name=b.name,
                pid=b.pid,
                peak_rss_mib=self._rss.get(b.pid, 0) / 2**20,
                peak_gpu_mib=self._gpu[b.pid] / 2**20 if b.pid in self._gpu else None,
            )
            for b in self.backends
        ]
