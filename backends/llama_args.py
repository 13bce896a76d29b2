"""Turn a tier's launch settings into a llama-server command line and environment (pure).

The server, as run here (flags of llama.cpp 0c1e570's tools/server):

* ``-np max_num_seqs`` parallel slots with continuous batching, ``-c max_model_len × slots``:
  each slot holds ``max_model_len`` tokens (slots keep their own KV cells; no shared pool);
* ``-t`` threads: one per core ``cpu_threads`` names (pinned: ``--cpu-mask``,
  ``--cpu-strict``), else one, unpinned. ggml's threads meet at a barrier after every operation,
  so tiers sharing cores with two threads each stall one another: on the 2-core AVX-512 EPYC,
  int4 and fp16 tiers each serving 2 streams at once gave 22 and 21 output tok/s with two
  threads each, 78 and 55 with one each, while one thread alone decodes as fast as two (TPOT
  7.6 against 7.1 ms; its prefill is slower: 128 prompt tokens in 242 against 163 ms).
  ``--poll 0``: threads sleep between tokens rather than spin;
* ``--alias`` the served model name (``/v1/models`` lists it), ``--metrics`` (Prometheus, read by
  backends/llama_metrics.py), ``--slot-save-path`` (it enables ``/slots/N?action=erase``, the KV
  reset), ``--cache-ram 0`` (no prompt cache outside the slots: memory stays what the slots
  hold, and an erase empties everything), ``--sse-ping-interval -1`` (streams carry only
  events, as vLLM's do), ``--no-webui``;
* sampling defaults from the variant's generation_config.json (``--temp``, ``--top-p``) and
  llama.cpp's own extra samplers off (``--top-k 0 --min-p 0``), so a request without sampling
  fields samples as it does on a vLLM tier;
* a draft model (``-md``, ``--spec-type draft-simple``) when the tier speculates.

The key goes in ``LLAMA_API_KEY`` (never in argv, where ``ps`` shows it): llama-server then
wants it on every route but ``/health``.
"""

from __future__ import annotations

from pathlib import Path

from backends.launch import TierLaunch

GGUF_FILE = "model.gguf"  # what the optimizer writes in a GGUF variant folder
KEY_ENV = "LLAMA_API_KEY"
DRAFT_TOKENS = 4  # --spec-draft-n-max: tokens drafted per step (benchmarks/bench_engines.py)
# Environment a llama-server never inherits: the gateway's own keys, llama.cpp's settings that
# would override the flags below (LLAMA_ARG_*; LLAMA_API_KEY is set from the launch), and
# OpenMP's (OMP_WAIT_POLICY=PASSIVE, which the test runner sets for torch, makes llama.cpp's
# two-thread decoding three times slower: 61 against 193 tok/s, llama-bench, int4).
PRIVATE_PREFIXES = (
    "MO_GATEWAY_",
    "MO_TIER_API_KEY",
    "LLAMA_ARG_",
    KEY_ENV,
    "VLLM_API_KEY",
    "OMP_",
)


def cores(spec: str) -> list[int]:
    """``"0-1,3"`` → ``[0, 1, 3]``."""
    out: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return sorted(set(out))


def cpu_mask(spec: str) -> str:
    """A core list as llama.cpp's hex affinity mask: ``"0,2"`` → ``"0x5"``."""
    return hex(sum(1 << core for core in cores(spec)))


def build_argv(server: Path, launch: TierLaunch) -> list[str]:
    """The llama-server command line (see the module docstring)."""
    argv = [
        str(server),
        "--model",
        str(launch.model_dir / GGUF_FILE),
        "--alias",
        launch.served_model_name,
        "--host",
        launch.host,
        "--port",
        str(launch.port),
        "--parallel",
        str(launch.max_num_seqs),
        "--ctx-size",
        str(launch.max_model_len * launch.max_num_seqs),
        "--no-kv-unified",
        "--poll",
        "0",
        "--metrics",
        "--cache-ram",
        "0",
        "--sse-ping-interval",
        "-1",
        "--no-webui",
        "--top-k",
        "0",
        "--min-p",
        "0",
    ]
    if launch.cpu_threads:
        used = cores(launch.cpu_threads)
        argv += ["--threads", str(len(used)), "--cpu-mask", cpu_mask(launch.cpu_threads)]
        argv += ["--cpu-strict", "1"]
    else:
        argv += ["--threads", str(launch.threads or 1)]
    if launch.max_num_batched_tokens is not None:
        argv += ["--batch-size", str(launch.max_num_batched_tokens)]
    if "temperature" in launch.sampling:
        argv += ["--temp", f"{launch.sampling['temperature']:g}"]
    if "top_p" in launch.sampling:
        argv += ["--top-p", f"{launch.sampling['top_p']:g}"]
    if launch.slot_dir is not None:
        argv += ["--slot-save-path", str(launch.slot_dir)]
    if launch.draft_dir is not None:
        argv += ["--model-draft", str(launch.draft_dir / GGUF_FILE)]
        argv += ["--spec-type", "draft-simple", "--spec-draft-n-max", str(DRAFT_TOKENS)]
    return [*argv, *launch.extra_args]


def build_env(launch: TierLaunch, base: dict[str, str]) -> dict[str, str]:
    """The server's environment: none of the gateway's keys or llama.cpp's overrides, the tier's
    own key in ``LLAMA_API_KEY``."""
    env = {name: value for name, value in base.items() if not name.startswith(PRIVATE_PREFIXES)}
    if launch.api_key:
        env[KEY_ENV] = launch.api_key
    return env
