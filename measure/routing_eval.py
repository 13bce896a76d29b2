"""``model-optimizer eval routing FILE``: replay a labeled prompt set through the gateway.

Each prompt goes once through the gateway (recording ``x-route-class``, ``x-route-tier`` and
the usage) and once straight to every tier; every answer is greedy with the same seed and
``max_tokens``. The figures are measure/frontier.py's; this module does the I/O, the
Markdown and the PNG (matplotlib's Agg backend, imported only when plotting).
"""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from measure import vllm_client as api
from measure.eval_data import LABELS, LabeledPrompt, load_labeled
from measure.evaluate import _gather
from measure.frontier import Outcome, Point, all_points, confusion, gateway_point, pareto, shares
from measure.quality import sequence_agreement


@dataclass(frozen=True)
class RoutingOptions:
    file: Path
    gateway: str
    tiers: dict[str, str]
    reference: str
    model: str | None = None
    seed: int = 0
    limit: int | None = None  # the first N prompts of the file
    max_tokens: int = 64
    concurrency: int = 4
    request_timeout: float = 600.0


def _ids(answer: api.Answer, where: str) -> tuple[int, ...]:
    if not answer.token_ids and answer.completion_tokens:
        raise api.EndpointError(f"{where}: no token_ids in the answer (vLLM's return_token_ids)")
    return answer.token_ids


async def replay(opts: RoutingOptions, prompts: Sequence[LabeledPrompt]) -> list[Outcome]:
    timeout = httpx.Timeout(opts.request_timeout, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as client:
        model = opts.model or await api.served_model(client, opts.tiers[opts.reference])

        def ask(base: str, text: str) -> Any:
            return lambda: api.chat(client, base, model, text, opts.max_tokens, opts.seed)

        # The tiers are separate servers: ask them all at once (each --concurrency at a time);
        # the gateway afterwards, so this replay's own load does not steer its routing.
        answers = await asyncio.gather(
            *(
                _gather(f"{tier} direct", [ask(base, p.prompt) for p in prompts], opts.concurrency)
                for tier, base in opts.tiers.items()
            )
        )
        direct = dict(zip(opts.tiers, answers, strict=True))
        calls = [ask(opts.gateway, p.prompt) for p in prompts]
        routed = await _gather("gateway", calls, opts.concurrency)
    outcomes = []
    for i, (prompt, answer) in enumerate(zip(prompts, routed, strict=True)):
        ref = _ids(direct[opts.reference][i], opts.tiers[opts.reference])
        cls, tier = answer.headers.get("x-route-class"), answer.headers.get("x-route-tier")
        if not cls or not tier:
            raise api.EndpointError(f"{opts.gateway}: no x-route-class/x-route-tier headers")
        outcomes.append(
            Outcome(
                label=prompt.label,
                route_class=cls,
                route_tier=tier,
                gateway_tokens=answer.prompt_tokens + answer.completion_tokens,
                gateway_quality=sequence_agreement(_ids(answer, opts.gateway), ref),
                tokens={t: a[i].prompt_tokens + a[i].completion_tokens for t, a in direct.items()},
                quality={
                    t: sequence_agreement(_ids(a[i], opts.tiers[t]), ref) for t, a in direct.items()
                },
                route_reason=answer.headers.get("x-route-reason", ""),
            )
        )
    return outcomes


def report(opts: RoutingOptions, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    tiers = list(opts.tiers)
    points = all_points(outcomes, tiers, opts.reference)
    frontier = pareto(points)
    actual = gateway_point(outcomes, opts.reference)
    return {
        "file": str(opts.file),
        "gateway": opts.gateway,
        "tiers": dict(opts.tiers),
        "reference": opts.reference,
        "seed": opts.seed,
        "max_tokens": opts.max_tokens,
        "prompts": len(outcomes),
        "confusion": confusion(outcomes, LABELS),
        "shares": shares(outcomes, tiers),
        "gateway_point": _point(actual),
        "frontier": [_point(p) for p in frontier],
        "points": [_point(p) for p in points],
        "outcomes": [
            asdict(o) | {"tokens": dict(o.tokens), "quality": dict(o.quality)} for o in outcomes
        ],
    }


def _point(p: Point) -> dict[str, Any]:
    return {
        "assignment": dict(p.assignment) if _is_assignment(p) else [list(r) for r in p.assignment],
        "cheap_share": p.cheap_share,
        "quality": p.quality,
    }


def _is_assignment(p: Point) -> bool:
    classes = [c for c, _ in p.assignment]
    return len(classes) == len(set(classes))


def markdown(data: Mapping[str, Any], plot_name: str) -> str:
    ref, lines = data["reference"], []
    lines.append(
        f"{data['prompts']} prompts from `{data['file']}`, greedy, up to {data['max_tokens']} "
        f"tokens, seed {data['seed']}; quality = token agreement with {ref}'s answer."
    )
    lines += ["", "Confusion (rows: label, columns: the gateway's `x-route-class`):", ""]
    lines.append("| label | " + " | ".join(LABELS) + " | total |")
    lines.append("|---|" + "---|" * (len(LABELS) + 1))
    for label, row in data["confusion"].items():
        cells = " | ".join(str(row.get(c, 0)) for c in LABELS)
        lines.append(f"| {label} | {cells} | {sum(row.values())} |")
    lines += ["", "Traffic through the gateway (`x-route-tier`):", ""]
    lines += ["| tier | requests | tokens |", "|---|---|---|"]
    for tier, share in data["shares"].items():
        lines.append(f"| {tier} | {share['requests']:.1%} | {share['tokens']:.1%} |")
    lines += ["", f"Quality vs cost (share of tokens served by tiers other than {ref}):", ""]
    lines += ["| deployment | non-fp16 token share | quality |", "|---|---|---|"]
    gw = data["gateway_point"]
    lines.append(f"| **gateway (actual)** | {gw['cheap_share']:.1%} | {gw['quality']:.3f} |")
    for p in data["frontier"]:
        name = ", ".join(f"{c}→{t}" for c, t in p["assignment"].items())
        lines.append(f"| frontier: {name} | {p['cheap_share']:.1%} | {p['quality']:.3f} |")
    lines += ["", f"![quality vs cost]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot(data: Mapping[str, Any]) -> bytes:
    # Here, not at the top: a heavy import only plots need, and Agg must be chosen before pyplot.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    pts, front, gw = data["points"], data["frontier"], data["gateway_point"]
    ax.scatter(
        [p["cheap_share"] for p in pts],
        [p["quality"] for p in pts],
        s=14,
        color="0.7",
        label="class → tier assignments",
    )
    ax.plot(
        [p["cheap_share"] for p in front],
        [p["quality"] for p in front],
        "o-",
        color="tab:blue",
        label="Pareto frontier",
    )
    ax.scatter(
        [gw["cheap_share"]],
        [gw["quality"]],
        marker="*",
        s=260,
        color="tab:red",
        zorder=5,
        label="gateway (actual routing)",
    )
    ax.set_xlabel(f"share of tokens served by tiers other than {data['reference']}")
    ax.set_ylabel(f"quality relative to all-{data['reference']} (token agreement)")
    ax.set_title(f"Routing: quality vs cost ({data['prompts']} prompts)")
    ax.set_xlim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def run(opts: RoutingOptions) -> dict[str, Any]:
    prompts = load_labeled(opts.file)
    if opts.limit is not None:
        prompts = prompts[: opts.limit]
    outcomes = asyncio.run(replay(opts, prompts))
    print(f"eval routing: {len(outcomes)} prompts replayed", file=sys.stderr, flush=True)
    return report(opts, outcomes)
