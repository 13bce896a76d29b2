"""The cascade's two stages timed, from 1 KB to 1 MB (issue 33).

    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/bench_second_stage.py \\
        [--classes policies/classes-cascade.yaml] [--runs 2000] [--json FILE]

For one chat message of 1 KB, 10 KB, 100 KB and 1 MB (the gateway's body limit):

- ``first stage``: ``classify_request`` under the cascade's ``classes`` (the prompt model, and
  for a prompt in its band the query for the second stage: what the request path pays in line);
- ``second stage``: the band model's P(precise) alone (gateway/request/classify/band_model.py), what
  the executor's thread pays;
- ``settle``: a band prompt through ``second_stage.settle`` on an event loop at concurrency 1,
  the added latency a request in the band sees (the thread hop included).

Median and p99 of the wall clock, in milliseconds. What is read is bounded (the window), so
past a few KB only the copies the request implies grow with the input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policy.schema import parse_policy  # noqa: E402
from gateway.request.classify.classes import CompiledClasses, classify_request  # noqa: E402
from gateway.request.classify.second_stage import BandQuery, settle  # noqa: E402
from measure.serving_stats import percentile  # noqa: E402

CASCADE = ROOT / "policies" / "classes-cascade.yaml"
ROUTES = "tiers: [t]\nroutes: {tolerant: [t], code: [t], math: [t], long: [t]}\n"
SIZES = (1_000, 10_000, 100_000, 1_000_000)
UNIT = "Could you tell me about the history of the number 7 and why people like it in stories? "


def _rules(path: Path) -> CompiledClasses:
    policy = parse_policy(ROUTES + path.read_text(encoding="utf-8"), str(path))
    rules = CompiledClasses.build(policy.classes, path.parent)
    if rules.second is None:
        raise SystemExit(f"{path}: classes.model.second_stage is missing or unusable")
    return rules


def _stats(samples: list[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in samples]
    return {"median_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}


def _time(call: Any, runs: int) -> dict[str, float]:
    """Wall clock and the thread's CPU time (on a shared machine the wall clock's p99 is mostly
    the time other processes held the CPU)."""
    for _ in range(max(runs // 20, 5)):
        call()
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.thread_time()
        call()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    cpu_figures = _stats(cpu)
    return _stats(wall) | {
        "cpu_median_ms": cpu_figures["median_ms"],
        "cpu_p99_ms": cpu_figures["p99_ms"],
    }


async def _settle_times(query: BandQuery, runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await settle(query)
        samples.append(time.perf_counter() - start)
    return _stats(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=Path, default=CASCADE)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rules = _rules(args.classes)
    second = rules.second
    assert second is not None
    print(f"{args.classes}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
    print(
        f"{'input':12}{'stage':>14}{'median ms':>12}{'p99 ms':>10}{'cpu median':>12}{'cpu p99':>9}"
    )
    out: dict[str, Any] = {}
    for size in SIZES:
        text = (UNIT * (size // len(UNIT) + 1))[:size]
        body = {"messages": [{"role": "user", "content": text}]}
        found = classify_request(body, 10, rules)
        label = f"{size // 1000} KB"
        # Timed as a band prompt whatever the first stage said of it (the cost does not depend
        # on the verdict).
        query = found.band or BandQuery(second, text, 0.5, 0.0, "", "")
        rows = {
            "first stage": _time(lambda b=body: classify_request(b, 10, rules), args.runs),
            "second stage": _time(lambda t=text: second.model.p_precise(t), args.runs),
            "settle": asyncio.run(_settle_times(query, args.runs)),
        }
        for stage, f in rows.items():
            cpu = f"{f['cpu_median_ms']:12.3f}{f['cpu_p99_ms']:9.3f}" if "cpu_p99_ms" in f else ""
            print(f"{label:12}{stage:>14}{f['median_ms']:12.3f}{f['p99_ms']:10.3f}{cpu}")
            out[f"{label}/{stage}"] = f
    out["load_average_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
