"""What it takes to start one tier's server, whatever its engine (a plain value).

``backends/spec.py`` plans one ``TierLaunch`` per tier from the deployment spec and the variant's
files; ``backends/vllm_args.py`` and ``backends/llama_args.py`` turn it into a command line and
an environment (pure); ``backends/process.py`` runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

LOOPBACK = "127.0.0.1"
VLLM: Final = "vllm"
LLAMA_CPP: Final = "llama.cpp"
Engine = Literal["vllm", "llama.cpp"]
ENGINES: tuple[Engine, ...] = ("vllm", "llama.cpp")


@dataclass(frozen=True)
class TierLaunch:
    """Everything needed to start one OpenAI server (vLLM or llama-server) for one tier."""

    name: str
    model_dir: Path
    served_model_name: str
    port: int
    host: str = LOOPBACK
    device: str = "cpu"
    engine: Engine = "vllm"
    max_model_len: int = 2048
    max_num_seqs: int = 8  # llama.cpp: its parallel slots, each max_model_len long
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int = 256 * 1024 * 1024
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None  # vLLM's --dtype (None: the variant's own)
    cpu_threads: str | None = None  # cores, e.g. "0-1": vLLM's OMP binding, llama.cpp's mask
    threads: int | None = None  # llama.cpp, unpinned: its threads (None: one; a pod's own cores)
    # --enable-sleep-mode, so a KV reset can sleep (level 1) and wake the tier; cuda only
    # (vLLM refuses the flag on CPU, where resets drop the prefix cache instead).
    sleep_mode: bool = False
    # The tier's key: vLLM's tier guard wants it on its control routes (backends/tier_guard.py),
    # llama-server on every route but /health. Passed in the environment, never in argv, and
    # kept out of repr. None: no key (vLLM's guarded routes then answer 401 to everyone).
    api_key: str | None = field(default=None, repr=False)
    # llama.cpp: the sampling defaults of the variant's generation_config.json (temperature,
    # top_p), so a request without them samples as on vLLM; a draft model's folder for
    # speculative decoding; where slot KV files may be written (it enables slot erase).
    sampling: Mapping[str, float] = field(default_factory=dict)
    draft_dir: Path | None = None
    slot_dir: Path | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)
