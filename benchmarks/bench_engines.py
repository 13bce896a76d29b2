"""vLLM-CPU against llama.cpp on this machine, tier by tier, side by side in one run.

    ./mo setup && ./mo up --engine vllm --tiers fp16   # once, for the vLLM variant (Ctrl-C)
    ./mo up                                            # once, for the GGUF variants (Ctrl-C)
    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/bench_engines.py \\
        [--output benchmarks/results/engines-<cpu>.json] [--skip-vllm]

Starts, one after another, the servers ``up`` would start for: vLLM's fp16 tier, llama.cpp's
fp16, int8 and int4 tiers, llama.cpp's fp16 tier drafting with the int4 variant (speculative
decoding: ``--model-draft``, ``--spec-type draft-simple``), and the int4 tier on two pinned
threads (a tier with cores of its own). They all stay up, and
are measured with ``up``'s own calibration (measure/speed.py): the requests alone interleaved
across servers (prompt i to every server before prompt i+1), then each server alone at
``--concurrency`` streams. Every request is greedy, ``--input-tokens`` prompt tokens from the
shipped calibration text, ``--output-tokens`` generated (``ignore_eos``).

It also checks speculation's promise: greedy answers of the drafting fp16 tier against the
plain one's (the same tokens are the promise), on ``--agreement-prompts`` prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.commands import Programs
from backends.launch import LLAMA_CPP, VLLM, TierLaunch
from backends.process import TierProcess, free_port
from common.cpu import cpu_model, read_cpuinfo
from common.llama_cpp import locate
from measure.prompts import load_tokenizer, make_prompts
from measure.speed import SpeedOptions, measure_tiers
from model_optimizer.envs import cache_root, env_python
from model_optimizer.tier_setup import (
    DEFAULT_SERVED_NAME,
    UpOptions,
    chosen_spec,
    phase_emulation,
    phase_launches,
    variants_folder,
)

KEY = "bench-engines-key"


def launches(skip_vllm: bool) -> dict[str, TierLaunch]:
    """The servers to compare, as ``up`` would launch them (fresh loopback ports)."""
    out: dict[str, TierLaunch] = {}
    if not skip_vllm:
        spec = chosen_spec(UpOptions(tiers=("fp16",)), DEFAULT_SERVED_NAME)
        folder = variants_folder(DEFAULT_SERVED_NAME, VLLM)
        (fp16,) = phase_emulation(phase_launches(UpOptions(), spec, {VLLM: folder}, VLLM), folder)
        out["vllm fp16"] = fp16
    spec = chosen_spec(UpOptions(), DEFAULT_SERVED_NAME)
    gguf = variants_folder(DEFAULT_SERVED_NAME, LLAMA_CPP)
    for launch in phase_launches(UpOptions(), spec, {LLAMA_CPP: gguf}, LLAMA_CPP):
        out[f"llama.cpp {launch.name}"] = launch
    reference = out["llama.cpp fp16"]
    out["llama.cpp fp16 + int4 draft"] = dataclasses.replace(
        reference, name="fp16-draft", draft_dir=gguf / "int4"
    )
    # what a tier with cores of its own gets (spec: cpu_threads "0-1"); co-located tiers run
    # one thread each (backends/llama_args.py says why)
    out["llama.cpp int4, 2 threads"] = dataclasses.replace(
        out["llama.cpp int4"], name="int4-2t", cpu_threads="0-1"
    )
    return {
        name: dataclasses.replace(
            launch,
            port=free_port(),
            api_key=KEY,
            slot_dir=cache_root() / "slots" / f"bench-{i}" if launch.engine == LLAMA_CPP else None,
        )
        for i, (name, launch) in enumerate(out.items())
    }


def start(named: dict[str, TierLaunch], logs: Path) -> dict[str, TierProcess]:
    programs = Programs(vllm_python=env_python("serve"), llama_server=locate().server)
    running: dict[str, TierProcess] = {}
    for name, launch in named.items():
        process = TierProcess(launch, programs, logs / f"{launch.name}-{launch.port}.log")
        process.start()
        running[name] = process
        process.wait_ready(600)
        print(f"bench: {name} ready on {process.base_url}", file=sys.stderr, flush=True)
    return running


async def greedy_ids(url: str, prompt: str, tokens: int) -> list[int]:
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "return_tokens": True}
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=600, trust_env=False, headers=headers) as client:
        answer = (await client.post(f"{url}/completion", json=body)).json()
    return [int(t) for t in answer["tokens"]]


async def same_tokens(plain: str, drafting: str, prompts: list[str], tokens: int) -> float:
    """Share of prompts whose greedy answers are token-for-token the same."""
    same = 0
    for prompt in prompts:
        same += await greedy_ids(plain, prompt, tokens) == await greedy_ids(
            drafting, prompt, tokens
        )
    return same / len(prompts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8, help="alone, per server")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--agreement-prompts", type=int, default=16)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--output", type=Path, default=None, help="JSON results")
    args = parser.parse_args()
    named = launches(args.skip_vllm)
    logs = cache_root() / "logs" / "bench-engines"
    running: dict[str, TierProcess] = {}
    started = time.time()
    try:
        running = start(named, logs)
        urls = {name: process.base_url for name, process in running.items()}
        opts = SpeedOptions(
            input_len=args.input_tokens,
            output_len=args.output_tokens,
            requests=args.requests,
            concurrency=args.concurrency,
        )
        tokenizer_dir = variants_folder(DEFAULT_SERVED_NAME, LLAMA_CPP) / "fp16"
        headers = {"authorization": f"Bearer {KEY}"}
        speeds = asyncio.run(measure_tiers(urls, DEFAULT_SERVED_NAME, tokenizer_dir, opts, headers))
        tokenizer = load_tokenizer(tokenizer_dir)
        texts = [p.text for p in make_prompts(tokenizer, args.agreement_prompts, 64, seed=7)]
        agreement = asyncio.run(
            same_tokens(
                urls["llama.cpp fp16"],
                urls["llama.cpp fp16 + int4 draft"],
                texts,
                args.output_tokens,
            )
        )
    finally:
        for process in running.values():
            process.stop()
    rows = [
        {
            "server": name,
            "ttft_ms": round(s.ttft_s * 1000, 1),
            "tpot_ms": round(s.tpot_s * 1000, 2),
            "throughput_tok_s": round(s.throughput_tok_s, 1),
            "failed": s.failed,
        }
        for name, s in speeds.items()
    ]
    result = {
        "cpu": cpu_model(read_cpuinfo()),
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "options": dataclasses.asdict(opts),
        "rows": rows,
        "speculative_same_greedy_tokens": agreement,
    }
    print(
        f"{result['cpu']}, {result['cores']} cores, {result['date']}: "
        f"{opts.input_len} prompt tokens, {opts.output_len} generated"
    )
    print(f"| server | TTFT alone | TPOT alone | out tok/s at {opts.concurrency} |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['server']} | {row['ttft_ms']:.0f} ms | {row['tpot_ms']:.1f} ms | "
            f"{row['throughput_tok_s']:.0f} |"
        )
    print(
        f"speculative fp16 (int4 draft): greedy answers token-for-token the plain fp16's on "
        f"{agreement:.0%} of {args.agreement_prompts} prompts"
    )
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
