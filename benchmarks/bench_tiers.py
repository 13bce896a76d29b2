"""Per-tier serving benchmark, straight to each vLLM tier (no gateway), all tiers in one run.

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_tiers.py [--input-tokens 512] [--output-tokens 128] \\
        [--concurrency 1,2,4] [--requests-per-level 2x]

The seeds' scenario scaled to a 2-core CPU: prompts of --input-tokens tokens, --output-tokens
generated with ignore_eos, at each concurrency. Tiers are started from the default model's
cached variants (built by ``model-optimizer up`` or ``optimize``) one after another and run
one at a time while measured, so the ratios between them hold. TTFT and TPOT are kept apart;
peak memory is the RSS of the tier's whole process tree, sampled every 0.2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.commands import Programs  # noqa: E402
from backends.platform import native_precisions, serving_dtype  # noqa: E402
from backends.process import free_port  # noqa: E402
from backends.process_tree import tree_rss_bytes  # noqa: E402
from backends.spec import load_spec  # noqa: E402
from backends.supervisor import Supervisor  # noqa: E402
from backends.tier_plan import resolve_tiers  # noqa: E402
from common.cpu import machine_flags  # noqa: E402
from gateway.request.events.chunk import read_chunk  # noqa: E402
from gateway.request.events.sse import aread_payloads  # noqa: E402
from measure.serving_stats import percentile  # noqa: E402
from model_optimizer.envs import cache_root, env_python  # noqa: E402
from model_optimizer.optimize import installed_vllm  # noqa: E402
from model_optimizer.tier_setup import DEFAULT_SERVED_NAME, DEFAULT_SPEC, warm_up  # noqa: E402

MODEL = DEFAULT_SERVED_NAME


@dataclass
class Sample:
    ttft: float
    e2e: float
    tokens: int


@dataclass
class Row:
    tier: str
    concurrency: int
    requests: int
    failures: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    e2e_p50_s: float
    output_tok_s: float
    peak_rss_mb: float


def prompt_of(tokens: int) -> str:
    # SmolLM2's tokenizer: " the" ~ one token; close enough for a load shape.
    return "Tell me a story about" + " the" * max(1, tokens - 6)


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, out: int) -> Sample:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": out,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    started = time.perf_counter()
    ttft = 0.0
    tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for data in aread_payloads(resp.aiter_bytes()):
            chunk = read_chunk(data, chat=False)
            if chunk.choices and chunk.choices[0].text:
                tokens += 1
                if ttft == 0.0:
                    ttft = time.perf_counter() - started
    return Sample(ttft, time.perf_counter() - started, tokens)


async def level(url: str, concurrency: int, total: int, prompt: str, out: int) -> list[Sample]:
    queue = list(range(total))
    samples: list[Sample] = []
    async with httpx.AsyncClient(timeout=600, trust_env=False) as client:

        async def worker() -> None:
            while queue:
                queue.pop()
                samples.append(await one_request(client, url, prompt, out))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def measure(tier: str, url: str, pid: int, args: argparse.Namespace) -> list[Row]:
    rows = []
    prompt = prompt_of(args.input_tokens)
    for conc in [int(c) for c in args.concurrency.split(",")]:
        peak = [0.0]
        done = threading.Event()

        def sample_rss(peak: list[float] = peak, done: threading.Event = done) -> None:
            while not done.wait(0.2):
                peak[0] = max(peak[0], (tree_rss_bytes(pid) or 0) / 1e6)

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        started = time.perf_counter()
        total = conc * args.requests_per_level
        samples = asyncio.run(level(url, conc, total, prompt, args.output_tokens))
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
        good = [s for s in samples if s.tokens > 1]
        tpots = [(s.e2e - s.ttft) / (s.tokens - 1) for s in good]
        rows.append(
            Row(
                tier=tier,
                concurrency=conc,
                requests=len(samples),
                failures=total - len(good),
                ttft_p50_ms=percentile([s.ttft for s in good], 50, empty=math.nan) * 1000,
                ttft_p90_ms=percentile([s.ttft for s in good], 90, empty=math.nan) * 1000,
                tpot_p50_ms=percentile(tpots, 50, empty=math.nan) * 1000,
                tpot_p90_ms=percentile(tpots, 90, empty=math.nan) * 1000,
                e2e_p50_s=statistics.median(s.e2e for s in good) if good else float("nan"),
                output_tok_s=sum(s.tokens for s in good) / wall,
                peak_rss_mb=peak[0],
            )
        )
        print(f"bench: {tier} c={conc}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def render(rows: list[Row]) -> str:
    head = (
        "| tier | conc | req | fail | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms"
        " | e2e p50 s | out tok/s | peak RSS MB |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r.tier} | {r.concurrency} | {r.requests} | {r.failures} | {r.ttft_p50_ms:.0f}"
            f" | {r.ttft_p90_ms:.0f} | {r.tpot_p50_ms:.1f} | {r.tpot_p90_ms:.1f}"
            f" | {r.e2e_p50_s:.1f} | {r.output_tok_s:.1f} | {r.peak_rss_mb:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--requests-per-level", type=int, default=2, help="x concurrency")
    parser.add_argument("--tiers", default="fp16,int8,int4")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = parser.parse_args()
    variants = cache_root() / "variants" / MODEL
    if not variants.is_dir():
        raise SystemExit(f"no variants in {variants}: run ./mo up (or optimize) first")
    launches = resolve_tiers(
        load_spec(DEFAULT_SPEC), {"vllm": variants}, "cpu", installed_vllm(), 2
    )
    flags = machine_flags()
    native = native_precisions("cpu", flags)
    emulated = variants.with_name(f"{variants.name}.emulated")
    rows: list[Row] = []
    for launch in launches:
        if launch.name not in args.tiers.split(","):
            continue
        # One tier at a time, on both cores: the comparison is between precisions.
        one = dataclasses.replace(
            launch, port=free_port(), cpu_threads=None, dtype=serving_dtype("cpu", flags)
        )
        label = one.name
        if one.name not in native:  # as `up` serves it on CPUs without the kernel
            one = dataclasses.replace(one, model_dir=emulated / one.name)
            label = f"{one.name} (emulated)"
        sup = Supervisor(
            [one], Programs(vllm_python=env_python("serve")), cache_root() / "logs", warm_up=warm_up
        )
        sup.start_all()
        try:
            proc = sup.records[one.name].process.process
            assert proc is not None
            rows += measure(label, f"http://127.0.0.1:{one.port}", proc.pid, args)
        finally:
            sup.stop_all()
    table = render(rows)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tiers.json").write_text(json.dumps([asdict(r) for r in rows], indent=2))
    (args.out / "tiers.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
