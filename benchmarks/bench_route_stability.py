"""Do the measured routes hold from one ``up`` to the next on a busy machine? (issue 32's target)

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_route_stability.py [--runs 5] [--busy 1]

It runs ``model-optimizer up`` ``--runs`` times (loopback, the default model, the spec's tiers,
the shipped policy) while ``--busy`` processes each keep a core busy (a spinning loop that stops
by itself after ``--busy-limit`` seconds, and is stopped at the end). Each run measures afresh:
the cached admission verdicts (``~/.cache/model-optimizer/admission``) are moved aside for the
run and put back at the end. Per run it records each class's route and each tier's calibration
(TTFT and per-token time alone, with the sample count the intervals are built on), and prints
them side by side with the verdict: the same routes every run or not. Progress on stderr,
markdown on stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from up_stack import ROOT, cpu_model, up_stack

sys.path.insert(0, str(ROOT))

from model_optimizer.envs import cache_root

SPIN = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def say(text: str) -> None:
    print(f"bench_route_stability: {text}", file=sys.stderr, flush=True)


def one_run(folder: Path, index: int, extra: list[str]) -> dict[str, Any]:
    with up_stack(folder / f"up-{index}.log", extra) as stack:
        document = stack.admin("/admin/routes")
    tiers = document["tiers"]
    return {
        "chains": {cls: entry["tiers"] for cls, entry in sorted(document["classes"].items())},
        "lines": {cls: entry.get("line", "") for cls, entry in document["classes"].items()},
        "tiers": {n: t["calibration"] for n, t in sorted(tiers.items()) if t["calibration"]},
    }


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> bool:
    engine = f" --engine {args.engine}" if args.engine else ""
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.busy} core(s) kept busy; "
          f"{len(runs)} runs of `model-optimizer up{engine}`\n")  # fmt: skip
    classes = sorted(runs[0]["chains"])
    print("| run | " + " | ".join(classes) + " | TPOT ms per tier |")
    print("|---|" + "---|" * (len(classes) + 1))
    for i, found in enumerate(runs, 1):
        chains = " | ".join(" → ".join(found["chains"][c]) for c in classes)
        tpots = ", ".join(f"{n} {t['tpot_ms']:.1f}" for n, t in found["tiers"].items())
        print(f"| {i} | {chains} | {tpots} |")
    same = all(r["chains"] == runs[0]["chains"] for r in runs)
    distinct = len({repr(r["chains"]) for r in runs})
    print(f"\nsame routes in every run: {'yes' if same else f'no ({distinct} different sets)'}")
    for cls in classes:
        print(f"- {cls}, last run: {runs[-1]['lines'].get(cls, '')}")
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=1, help="cores kept busy meanwhile")
    parser.add_argument("--busy-limit", type=float, default=7200.0, help="seconds at most")
    parser.add_argument("--engine", choices=["llama.cpp", "vllm"], help="default: the spec's")
    args = parser.parse_args()
    extra = ["--engine", args.engine] if args.engine else []
    if args.runs < 2 or args.busy < 0:
        parser.error("--runs needs at least 2 runs, --busy 0 or more")
    cached = cache_root() / "admission"
    spinners = []
    with tempfile.TemporaryDirectory(prefix="bench-route-stability-") as name:
        folder = Path(name)
        aside = folder / "admission"
        if cached.is_dir():
            shutil.move(str(cached), aside)
        try:
            spinners = [
                subprocess.Popen([sys.executable, "-c", SPIN.format(limit=args.busy_limit)])
                for _ in range(args.busy)
            ]
            runs = []
            for i in range(1, args.runs + 1):
                say(f"run {i}/{args.runs}: model-optimizer up, measuring afresh ...")
                shutil.rmtree(cached, ignore_errors=True)
                runs.append(one_run(folder, i, extra))
                say(f"run {i}: {runs[-1]['chains']}")
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
            shutil.rmtree(cached, ignore_errors=True)
            if aside.is_dir():
                shutil.move(str(aside), cached)
    return 0 if report(runs, args) else 1


if __name__ == "__main__":
    sys.exit(main())
