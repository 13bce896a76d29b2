"""``eval``'s figures from its runs (pure), their JSON and Markdown, and the atomic write.

Per tier x category, over the runs: perplexity (corpus, of the continuations), next-token
agreement with the reference tier's top-1 tokens in the same run, and the category's task
(math: GSM8K exact match; code: HumanEval pass@1). Each figure is a ``Spread``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from measure.evaluate import CATEGORIES, EvalOptions, Prepared, TierRun
from measure.quality import Spread, agreement, mean_or_zero, perplexity, spread

TASKS = {"math": "gsm8k_exact_match", "code": "humaneval_pass_at_1"}


def figures(prepared: Prepared, runs: Sequence[TierRun], reference: str) -> list[dict[str, Any]]:
    """One row per tier x category (tiers in run order)."""
    by_key = {(r.tier, r.run): r for r in runs}
    tiers = list(dict.fromkeys(r.tier for r in runs))
    run_ids = sorted({r.run for r in runs})
    rows = []
    for tier in tiers:
        for category in CATEGORIES:
            idx = [i for i, t in enumerate(prepared.texts) if t.category == category]
            if not idx:
                continue
            ppl, agree = [], []
            for run in run_ids:
                ours, ref = by_key[tier, run], by_key[reference, run]
                ppl.append(perplexity([ours.scores[i].logprobs for i in idx]))
                agree.append(
                    agreement([ours.scores[i].top1 for i in idx], [ref.scores[i].top1 for i in idx])
                )
            row: dict[str, Any] = {
                "tier": tier,
                "category": category,
                "items": len(idx),
                "tokens": sum(len(prepared.texts[i].continuation_ids) for i in idx),
                "perplexity": _plain(spread(ppl)),
                "agreement": _plain(spread(agree)),
                "task": None,
                "task_score": None,
            }
            if category in TASKS:
                flags = [
                    by_key[tier, run].math_correct
                    if category == "math"
                    else by_key[tier, run].code_passed
                    for run in run_ids
                ]
                row["task"] = TASKS[category]
                row["task_score"] = _plain(spread([mean_or_zero(f) for f in flags]))
            rows.append(row)
    return rows


def report(opts: EvalOptions, prepared: Prepared, runs: Sequence[TierRun]) -> dict[str, Any]:
    counts = {c: sum(t.category == c for t in prepared.texts) for c in CATEGORIES}
    return {
        "model": prepared.model,
        "reference": opts.reference,
        "tiers": dict(opts.tiers),
        "runs": opts.runs,
        "seed": opts.seed,
        "limit": opts.limit,
        "max_tokens": opts.max_tokens,
        "items": counts | {"gsm8k": len(prepared.math), "humaneval": len(prepared.code)},
        "results": figures(prepared, runs, opts.reference),
        "per_item": [
            {
                "tier": r.tier,
                "run": r.run,
                "gsm8k_correct": [
                    m.item_id for m, ok in zip(prepared.math, r.math_correct, strict=True) if ok
                ],
                "humaneval_passed": [
                    c.task_id for c, ok in zip(prepared.code, r.code_passed, strict=True) if ok
                ],
            }
            for r in runs
        ],
    }


def _plain(value: Spread) -> dict[str, Any]:
    out = dataclasses.asdict(value)
    out["runs"] = list(value.runs)
    return out


def fmt(figure: Mapping[str, Any] | None, digits: int = 3) -> str:
    """``mean [min–max]``, or just the value when the runs agree exactly."""
    if figure is None:
        return "-"
    mean, low, high = figure["mean"], figure["min"], figure["max"]
    if low == high:
        return f"{mean:.{digits}f} (runs equal)"
    return f"{mean:.{digits}f} [{low:.{digits}f}–{high:.{digits}f}]"


def markdown(data: Mapping[str, Any]) -> str:
    ref = data["reference"]
    lines = [
        f"Model `{data['model']}`, {data['runs']} run(s), seed {data['seed']}, greedy, "
        f"{data['limit']} items per category, answers up to {data['max_tokens']} tokens; "
        f"agreement = next-token top-1 agreement with {ref}; task: math = GSM8K exact match, "
        "code = HumanEval pass@1. Figures: mean [min–max over runs].",
        "",
        f"| tier | category | items (tokens) | perplexity | agreement with {ref} | task |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["results"]:
        task = fmt(row["task_score"], 2)
        if row["task"]:
            task = f"{'GSM8K EM' if row['category'] == 'math' else 'HumanEval pass@1'} {task}"
        lines.append(
            f"| {row['tier']} | {row['category']} | {row['items']} ({row['tokens']}) | "
            f"{fmt(row['perplexity'], 2)} | {fmt(row['agreement'])} | {task} |"
        )
    return "\n".join(lines) + "\n"


def write_atomically(output: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` into ``output`` all at once: a temporary sibling folder renamed into
    place. ``output`` must not exist or be empty (it is replaced)."""
    output = output.absolute()
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f"{output}: exists and is not an empty folder")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        for name, content in files.items():
            (staging / name).write_bytes(content)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
