"""``model-optimizer bench``'s flags and its run: check input, sweep (or ablate), write, exit.

Exit codes: 0 done; 2 bad input (one line on stderr: a non-loopback or unreachable target, a bad
concurrency list, an unknown tier, an output folder that exists); 130 interrupted (what was
measured is printed and written, flagged partial); 1 nothing could be measured.

The CLI (model_optimizer) calls ``run`` with the ``TierLauncher`` that ``--ablation`` uses to
start a tier as ``up`` does; measure never imports the CLI package.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from common.env_paths import cache_root
from measure import ablation, report
from measure.ablation import TierLauncher
from measure.bench import (
    BenchConfig,
    BenchResult,
    RunResult,
    new_progress,
    now_iso,
    parse_concurrency,
    prompts_needed,
    sweep,
)
from measure.prompts import PromptError, load_tokenizer, make_prompts
from measure.targets import Target, TargetError, parse_tiers, resolve_targets

DEFAULT_TARGET = "http://127.0.0.1:8000"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"a loopback gateway or tier URL ({DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--tier",
        default="",
        help="with a gateway --target: its stack's tiers to load directly, and/or 'gateway', "
        "e.g. fp16,int8,int4,gateway (default: the target alone)",
    )
    parser.add_argument("--input-len", type=int, default=512, help="prompt tokens (512)")
    parser.add_argument("--output-len", type=int, default=128, help="generated tokens (128)")
    parser.add_argument("--concurrency", default="4,8,16", help="levels to sweep (4,8,16)")
    parser.add_argument(
        "--num-prompts", type=int, default=None, help="requests per level (2 x concurrency)"
    )
    parser.add_argument("--num-warmups", type=int, default=1, help="dropped requests per target")
    parser.add_argument("--seed", type=int, default=0, help="prompt choice (0)")
    parser.add_argument(
        "--tokenizer", default=None, help="tokenizer.json or a variant folder (the fp16 variant's)"
    )
    parser.add_argument("--output", default=None, help="new folder for the results")
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="fp16 -> int8 -> int4 -> KV dtype -> routing, each against the last (gateway target)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="fp8",
        help="--ablation's KV step: dtypes to try in order, e.g. fp8,fp8_e5m2 (fp8)",
    )


def _fail(message: str) -> int:
    print(f"model-optimizer: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, launcher: TierLauncher) -> int:
    try:
        levels = parse_concurrency(args.concurrency)
    except ValueError as exc:
        return _fail(str(exc))
    for flag, value, least in (
        ("--input-len", args.input_len, 1),
        ("--output-len", args.output_len, 1),
        ("--num-prompts", 1 if args.num_prompts is None else args.num_prompts, 1),
        ("--num-warmups", args.num_warmups, 0),
    ):
        if value < least:
            return _fail(f"{flag} must be at least {least}, not {value}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    output = Path(args.output) if args.output else Path("bench-results") / f"bench-{stamp}"
    if output.exists():
        return _fail(f"output folder {output} already exists (give a new --output)")
    config = BenchConfig(
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=levels,
        num_prompts=args.num_prompts,
        seed=args.seed,
        num_warmups=args.num_warmups,
    )
    try:
        tiers = parse_tiers(args.tier)
        if args.ablation:
            if tiers:
                return _fail("--ablation picks its own tiers; leave out --tier")
            tiers = ["fp16", "int8", "int4", "gateway"]
        model, targets = resolve_targets(args.target, tiers)
        folder = Path(args.tokenizer) if args.tokenizer else cache_root() / "variants" / model
        tokenizer = load_tokenizer(folder / "fp16" if not args.tokenizer else folder)
    except (TargetError, PromptError) as exc:
        return _fail(str(exc))
    kv_dtypes = tuple(d.strip() for d in args.kv_cache_dtype.split(",") if d.strip())
    return _measure(args, config, model, targets, tokenizer, output, kv_dtypes, launcher)


def _measure(
    args: argparse.Namespace,
    config: BenchConfig,
    model: str,
    targets: list[Target],
    tokenizer: Tokenizer,
    output: Path,
    kv_dtypes: tuple[str, ...],
    launcher: TierLauncher,
) -> int:
    steps = ablation.ladder(kv_dtypes) if args.ablation else []
    count = len(steps) if steps else len(targets)
    prompts = make_prompts(tokenizer, prompts_needed(count, config), config.input_len, config.seed)
    result = BenchResult(model_id=model, config=config, started_at=now_iso())
    runs: list[RunResult] = result.runs
    outcomes: list[ablation.StepOutcome] = []
    per_target = sum(config.prompts_at(c) for c in config.concurrency)
    progress = new_progress(count * per_target)
    pool = list(prompts)
    take = prompts_needed(1, config)
    try:
        if not steps:
            sweep(targets, model, pool, config, runs, progress)
        by_label = {t.label: t for t in targets}
        for step in steps:
            chunk, pool = pool[:take], pool[take:]
            if step.kv_cache_dtypes:
                running = by_label[step.tier or ""].backends[0]
                with ablation.kv_tier(
                    model, step.tier or "", running, step.kv_cache_dtypes, launcher
                ) as (dtype, backends, url, note):
                    if dtype is None:
                        outcomes.append(ablation.StepOutcome(step, False, note))
                        progress.update(per_target)
                        continue
                    target = Target(step.name, url, "tier", backends)
                    sweep([target], model, chunk, config, runs, progress)
                    outcomes.append(ablation.StepOutcome(step, True, note))
                continue
            base = by_label[step.tier or "gateway"]
            sweep(
                [dataclasses.replace(base, label=step.name)], model, chunk, config, runs, progress
            )
            outcomes.append(ablation.StepOutcome(step, True))
    except KeyboardInterrupt:
        result.partial = True
    finally:
        progress.close()
    if not runs and not outcomes:
        print("model-optimizer: bench: interrupted before any request finished", file=sys.stderr)
        return 130 if result.partial else 1
    title = f"{model}: {config.input_len} in / {config.output_len} out" + (
        " (partial)" if result.partial else ""
    )
    table = report.markdown_table(runs)
    extra: dict[str, Any] = {"ablation": None}
    text = f"# {title}\n\n{table}"
    served = report.served_note(runs)
    if served:
        text += f"\n{served}\n"
    if steps:
        found = ablation.deltas(outcomes, runs)
        text += "\n## Ablation\n\n" + ablation.markdown(outcomes, found)
        extra["ablation"] = {
            "steps": [dataclasses.asdict(o) for o in outcomes],
            "deltas": [dataclasses.asdict(d) for d in found],
        }
    command = ["model-optimizer", *sys.argv[1:]]
    files = {"bench.json": report.result_json(result, command, extra), "bench.md": text}
    try:
        report.write_outputs(output, files, runs, title)
    except (OSError, FileExistsError) as exc:
        print(text)
        return _fail(f"cannot write {output}: {exc}")
    print(text)
    flag = " (partial: interrupted)" if result.partial else ""
    print(f"bench: results in {output}{flag}", file=sys.stderr)
    return 130 if result.partial else 0
