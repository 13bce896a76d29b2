"""Fuzz benchmark: the gateway as shipped, 10,000 and more schemathesis cases (not in CI).

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_fuzz.py [--examples 2500] [--seed N] [--json PATH] [--show 20]

The same harness as the CI test (tests/shipped_fuzz.py, tests/unit/gateway/test_gateway_fuzz.py):
the gateway built by ``up``'s own ``gateway_config`` (policies/routing.yaml, the default 1 MB body
limit and every other default, the embedded default model's real tokenizer; Redis off) in this
process on 127.0.0.1, over one stub tier per tier of policies/deploy/tiers.yaml. Cases come from
the gateway's served ``/openapi.json``: ``--examples`` per operation and mode (chat and
completions, positive and negative; ``GET /v1/models`` has one input), so 2,500 gives 10,001.

Prints, per mode: cases, the status histogram, the error codes, how many reached a tier; then
the 5xx count, the findings (a 5xx; a 2xx to an invalid case; a 4xx to a valid case other than
over a limit; an error not in OpenAI's shape) and the duration. Exit 1 on any finding.
``--seed`` None: Hypothesis' derandomized cases (the same every run, as in CI).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.shipped_fuzz import Tally, default_tokenizer_dir, fuzz, shipped_gateway  # noqa: E402


def cpu_model() -> str:
    """lscpu's "Model name" (else the platform's processor string)."""
    try:
        out = subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=False, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def report(tally: Tally, tokenizer: Path, examples: int, seed: int | None) -> str:
    summary = tally.summary()
    lines = [
        f"gateway as shipped, {summary['cases']:,} schemathesis cases "
        f"({examples} per operation and mode, seed {seed if seed is not None else 'derandomized'})",
        f"tokenizer: {tokenizer}",
        f"CPU: {cpu_model()}",
        "",
        "| mode | cases | statuses | error codes | reached a tier |",
        "|---|---|---|---|---|",
    ]
    for mode in ("positive", "negative"):
        part = summary[mode]
        statuses = ", ".join(f"{s}: {n:,}" for s, n in part["statuses"].items())
        codes = ", ".join(f"{c}: {n:,}" for c, n in part["codes"].items()) or "-"
        lines.append(
            f"| {mode} | {part['cases']:,} | {statuses} | {codes} | {part['reached_a_tier']:,} |"
        )
    shapes = ", ".join(f"{k}: {n:,}" for k, n in summary["shapes"].items()) or "-"
    lines += [
        "",
        f"derived shapes (tests/fuzz_shapes.py; shape status: count): {shapes}",
        "",
        f"5xx: {summary['server_errors']}; findings: {summary['findings']}; "
        f"{summary['seconds']:.0f} s ({summary['cases'] / max(summary['seconds'], 1e-9):.0f} "
        "cases/s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2500, help="per operation and mode")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    parser.add_argument("--show", type=int, default=20, help="findings printed at most")
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error("--examples must be at least 1")
    tokenizer = default_tokenizer_dir()
    started = time.monotonic()
    with shipped_gateway(tokenizer) as (url, stubs):
        tally = fuzz(
            url,
            stubs,
            args.examples,
            args.seed,
            progress=lambda m: print(f"fuzz: {m}", file=sys.stderr, flush=True),
        )
    print(report(tally, tokenizer, args.examples, args.seed))
    for finding in tally.findings[: args.show]:
        print(f"finding: {finding}")
    if args.json:
        summary = {
            **tally.summary(),
            "cpu": cpu_model(),
            "examples": args.examples,
            "seed": args.seed,
            "wall_seconds": round(time.monotonic() - started, 1),
            "findings_shown": tally.findings[: args.show],
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if tally.findings or tally.server_errors() else 0


if __name__ == "__main__":
    sys.exit(main())
