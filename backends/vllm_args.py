"""Turn a tier's launch settings into a vLLM command line and environment (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class TierLaunch:
    """Everything needed to start one vLLM OpenAI server for one precision tier."""

    name: str
    model_dir: Path
    served_model_name: str
    port: int
    host: str = LOOPBACK
    device: str = "cpu"
    max_model_len: int = 2048
    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int = 256 * 1024 * 1024
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None  # --dtype (None: the variant's own)
    cpu_threads: str | None = None  # e.g. "0-1": VLLM_CPU_OMP_THREADS_BIND
    # --enable-sleep-mode, so a KV reset can sleep (level 1) and wake the tier; cuda only
    # (vLLM refuses the flag on CPU, where resets drop the prefix cache instead).
    sleep_mode: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)


def build_argv(python: Path, launch: TierLaunch) -> list[str]:
    """The vLLM server command line.

    ``python -m vllm.entrypoints.openai.api_server`` because vllm-cpu's ``vllm`` console script
    fails (it asks package metadata for "vllm"). ``--enforce-eager`` on CPU always: the compiled
    CPU path answers SmolLM2 with wrong tokens (measured, see ARCHITECTURE.md).
    """
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(launch.model_dir),
        "--served-model-name",
        launch.served_model_name,
        "--host",
        launch.host,
        "--port",
        str(launch.port),
        "--max-model-len",
        str(launch.max_model_len),
        "--max-num-seqs",
        str(launch.max_num_seqs),
        "--disable-uvicorn-access-log",
    ]
    if launch.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(launch.max_num_batched_tokens)]
    if launch.device == "cpu":
        argv += ["--enforce-eager", "--kv-cache-memory-bytes", str(launch.kv_cache_memory_bytes)]
    elif launch.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(launch.gpu_memory_utilization)]
    else:
        argv += ["--kv-cache-memory-bytes", str(launch.kv_cache_memory_bytes)]
    if launch.device == "cuda" and launch.sleep_mode:
        argv.append("--enable-sleep-mode")
    if launch.kv_cache_dtype:
        argv += ["--kv-cache-dtype", launch.kv_cache_dtype]
    if launch.dtype:
        argv += ["--dtype", launch.dtype]
    return [*argv, *launch.extra_args]


# Environment variables a tier never inherits: the gateway's plain API and admin keys
# (MO_GATEWAY_API_KEYS, MO_GATEWAY_ADMIN_KEYS, ...) are the gateway's alone.
PRIVATE_PREFIXES = ("MO_GATEWAY_",)


def build_env(launch: TierLaunch, base: dict[str, str]) -> dict[str, str]:
    """The server's environment: offline, dev endpoints on (loopback only), no KV override,
    none of the gateway's keys."""
    env = {name: value for name, value in base.items() if not name.startswith(PRIVATE_PREFIXES)}
    # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes.
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # /reset_prefix_cache and friends exist only in dev mode; they have no auth,
            # which is why tiers never listen beyond loopback.
            "VLLM_SERVER_DEV_MODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if launch.cpu_threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = launch.cpu_threads
    return env
