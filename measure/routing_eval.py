"""``model-optimizer eval routing FILE``: replay a labeled prompt set through the gateway.

Each prompt goes once through the gateway (recording ``x-route-class``, ``x-route-tier`` and
the usage) and once straight to every tier; every answer is greedy with the same seed and
``max_tokens``. The cost axis uses each tier's speed as ``up`` measured it on this machine
(the file of gateway/measured.py; ``speeds_from``). The figures are measure/frontier.py's;
this module does the I/O, the Markdown and the PNG (matplotlib's Agg backend, imported only
when plotting).
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

from gateway.measured import MeasuredStack
from measure import vllm_client as api
from measure.eval_data import LABELS, LabeledPrompt, load_labeled
from measure.evaluate import _gather
from measure.frontier import (
    Gap,
    Outcome,
    Point,
    Speed,
    all_points,
    confusion,
    gap,
    gateway_point,
    pareto,
    routed_point,
    shares,
)
from measure.quality import sequence_agreement


@dataclass(frozen=True)
class RoutingOptions:
    file: Path
    gateway: str
    tiers: dict[str, str]
    reference: str
    speeds: Mapping[str, Speed]  # every tier's, measured by up on this machine
    speed_source: str = ""  # where the speeds come from, for the report
    model: str | None = None
    seed: int = 0
    max_tokens: int = 64
    concurrency: int = 4
    request_timeout: float = 600.0


def speeds_from(
    measured: MeasuredStack, tiers: Mapping[str, str], source: Path
) -> tuple[dict[str, Speed], str, list[str]]:
    """Each of ``tiers``' measured speed, a phrase naming where it comes from, and notes (a
    tier measured at another URL than the one evaluated). ``ValueError`` for a tier with no
    figures: its cost would be made up."""
    missing = [t for t in tiers if t not in measured.tiers]
    if missing:
        raise ValueError(
            f"{source}: no measured speed for tier(s) {', '.join(missing)} "
            f"(measured: {', '.join(measured.tiers) or 'none'})"
        )
    speeds = {t: Speed(measured.tiers[t].ttft_s, measured.tiers[t].tpot_s) for t in tiers}
    notes = [
        f"tier {t} was measured at {measured.tier_urls[t]}, evaluated at {url}"
        for t, url in tiers.items()
        if measured.tier_urls.get(t, url) != url
    ]
    where = f"measured by up on port {measured.gateway_port} at {measured.written_at}, {source}"
    return speeds, where, notes


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
                prompt_tokens=answer.prompt_tokens,
                gateway_completion=answer.completion_tokens,
                gateway_quality=sequence_agreement(_ids(answer, opts.gateway), ref),
                completion={t: a[i].completion_tokens for t, a in direct.items()},
                quality={
                    t: sequence_agreement(_ids(a[i], opts.tiers[t]), ref) for t, a in direct.items()
                },
                route_reason=answer.headers.get("x-route-reason", ""),
            )
        )
    return outcomes


def report(opts: RoutingOptions, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    tiers = list(opts.tiers)
    points = all_points(outcomes, tiers, opts.speeds, opts.reference)
    frontier = pareto(points)
    actual = gateway_point(outcomes, opts.speeds, opts.reference)
    routed = routed_point(outcomes, opts.speeds, opts.reference)
    return {
        "file": str(opts.file),
        "gateway": opts.gateway,
        "tiers": dict(opts.tiers),
        "reference": opts.reference,
        "seed": opts.seed,
        "max_tokens": opts.max_tokens,
        "prompts": len(outcomes),
        "cost": "mean expected seconds per request: ttft + completion tokens x tpot of the tier",
        "speeds": {t: asdict(opts.speeds[t]) for t in tiers},
        "speed_source": opts.speed_source,
        "confusion": confusion(outcomes, LABELS),
        "shares": shares(outcomes, tiers),
        "gateway_point": _point(actual),
        "gateway_routed_point": _point(routed),
        "gateway_gap": _gap(gap(routed, points)),
        "frontier": [_point(p) for p in frontier],
        "points": [_point(p) for p in points],
        "outcomes": [
            asdict(o) | {"completion": dict(o.completion), "quality": dict(o.quality)}
            for o in outcomes
        ],
    }


def _point(p: Point) -> dict[str, Any]:
    return {
        "assignment": dict(p.assignment) if _is_assignment(p) else [list(r) for r in p.assignment],
        "seconds": p.seconds,
        "quality": p.quality,
        "off_reference": p.off_reference,
    }


def _gap(g: Gap) -> dict[str, Any]:
    return {
        "on_frontier": g.on_frontier,
        "quality_gain": g.quality_gain,
        "seconds_saved": g.seconds_saved,
        "by": _point(g.by) if g.by is not None else None,
    }


def _is_assignment(p: Point) -> bool:
    classes = [c for c, _ in p.assignment]
    return len(classes) == len(set(classes))


def _name(assignment: Mapping[str, str] | list[list[str]]) -> str:
    pairs = assignment.items() if isinstance(assignment, Mapping) else assignment
    return ", ".join(f"{c}→{t}" for c, t in pairs)


def gap_line(data: Mapping[str, Any]) -> str:
    """One line: is the gateway's routing on the frontier, and if not, by how much (its
    routing scored like the assignments: each prompt by its routed tier's direct answer)."""
    gw, g = data["gateway_routed_point"], data["gateway_gap"]
    where = f"{gw['seconds']:.3f} s/request, quality {gw['quality']:.3f}"
    if g["on_frontier"]:
        return f"gateway routing: on the frontier ({where}; no assignment beats it on both)"
    by = g["by"]
    saved = g["seconds_saved"] / gw["seconds"] if gw["seconds"] else 0.0
    return (
        f"gateway routing: dominated ({where}) by {_name(by['assignment'])} "
        f"({by['seconds']:.3f} s/request, quality {by['quality']:.3f}): at its cost the best "
        f"assignment gains {g['quality_gain']:+.3f} quality; at its quality the cheapest costs "
        f"{g['seconds_saved']:.3f} s/request ({saved:.0%}) less"
    )


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
    lines += ["", f"Measured speeds ({data['speed_source'] or 'source not given'}):", ""]
    lines += ["| tier | TTFT | TPOT |", "|---|---|---|"]
    for tier, speed in data["speeds"].items():
        lines.append(
            f"| {tier} | {speed['ttft_s'] * 1000:.0f} ms | {speed['tpot_s'] * 1000:.1f} ms |"
        )
    lines += [
        "",
        "Quality vs cost (cost: mean expected seconds per request on this machine, TTFT + "
        "answer tokens x TPOT of the tier serving it; the share of tokens served off "
        f"{ref} describes the traffic, it is not a cost):",
        "",
    ]
    lines += ["| deployment | s/request | quality | tokens off " + ref + " |", "|---|---|---|---|"]
    gw, routed = data["gateway_point"], data["gateway_routed_point"]
    lines.append(
        f"| **gateway's routing** (its tiers' direct answers) | {routed['seconds']:.3f} | "
        f"{routed['quality']:.3f} | {routed['off_reference']:.1%} |"
    )
    lines.append(
        f"| gateway (its own answers: the routing plus the engine's run-to-run differences) | "
        f"{gw['seconds']:.3f} | {gw['quality']:.3f} | {gw['off_reference']:.1%} |"
    )
    for p in data["frontier"]:
        lines.append(
            f"| frontier: {_name(p['assignment'])} | {p['seconds']:.3f} | {p['quality']:.3f} | "
            f"{p['off_reference']:.1%} |"
        )
    lines += ["", gap_line(data), "", f"![quality vs cost]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot(data: Mapping[str, Any]) -> bytes:
    # Here, not at the top: a heavy import only plots need, and Agg must be chosen before pyplot.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    pts, front = data["points"], data["frontier"]
    gw, own = data["gateway_routed_point"], data["gateway_point"]
    ax.scatter(
        [p["seconds"] for p in pts],
        [p["quality"] for p in pts],
        s=14,
        color="0.7",
        label="class → tier assignments",
    )
    ax.plot(
        [p["seconds"] for p in front],
        [p["quality"] for p in front],
        "o-",
        color="tab:blue",
        label="Pareto frontier",
    )
    on = data["gateway_gap"]["on_frontier"]
    ax.scatter(
        [gw["seconds"]],
        [gw["quality"]],
        marker="*",
        s=260,
        color="tab:red",
        zorder=5,
        label=f"gateway's routing: {'on the frontier' if on else 'dominated'}",
    )
    ax.scatter(
        [own["seconds"]],
        [own["quality"]],
        marker="x",
        s=80,
        color="tab:red",
        zorder=5,
        label="gateway's own answers (routing + engine run-to-run differences)",
    )
    ax.set_xlabel("cost: expected seconds per request (measured TTFT + answer tokens x TPOT)")
    ax.set_ylabel(f"quality relative to all-{data['reference']} (token agreement)")
    ax.set_title(f"Routing: quality vs cost ({data['prompts']} prompts)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def load_prompts(file: Path, limit: int | None) -> list[LabeledPrompt]:
    """The labeled file's first ``limit`` prompts (all with ``None``); ``EvalDataError``."""
    prompts = load_labeled(file)
    return prompts if limit is None else prompts[:limit]


def run(opts: RoutingOptions, prompts: Sequence[LabeledPrompt]) -> dict[str, Any]:
    outcomes = asyncio.run(replay(opts, prompts))
    print(f"eval routing: {len(outcomes)} prompts replayed", file=sys.stderr, flush=True)
    data = report(opts, outcomes)
    print(f"eval routing: {gap_line(data)}", file=sys.stderr, flush=True)
    return data
