"""``model-optimizer routes``: a running gateway's routes, readably (``GET /admin/routes``).

Each class: its tiers in order, how the route came to be (derived, as written, pinned, and what
the measurements say of a pin), each tier's reason (figures, the gain's interval and sample
count), and its last change. Each tier: the calibration's figures beside the live ones of real
traffic. The admin key is the first of ``MO_GATEWAY_ADMIN_KEYS``; ``--json`` prints the
document as the gateway sent it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import httpx


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    routes = sub.add_parser("routes", help="a running gateway's routes, why, and their figures")
    routes.add_argument("--gateway", default="http://127.0.0.1:8000", help="the gateway's URL")
    routes.add_argument("--json", action="store_true", help="the document as the gateway sent it")


def run(args: argparse.Namespace) -> int:
    key = os.environ.get("MO_GATEWAY_ADMIN_KEYS", "").split(",")[0].strip()
    if not key:
        print("model-optimizer: error: routes needs MO_GATEWAY_ADMIN_KEYS", file=sys.stderr)
        return 2
    url = f"{args.gateway.rstrip('/')}/admin/routes"
    try:
        answer = httpx.get(
            url, headers={"authorization": f"Bearer {key}"}, timeout=10, trust_env=False
        )
    except httpx.HTTPError as exc:
        print(f"model-optimizer: error: {url}: {exc}", file=sys.stderr)
        return 1
    if answer.status_code != 200:
        print(f"model-optimizer: error: {url}: HTTP {answer.status_code}", file=sys.stderr)
        return 1
    document = answer.json()
    print(json.dumps(document, indent=1) if args.json else render(document))
    return 0


def render(document: Mapping[str, Any]) -> str:
    """The document as lines an operator reads."""
    window = document.get("live_window") or {}
    lines = [
        f"reference tier: {document.get('reference') or 'none'}; live figures: the last "
        f"{window.get('answers', '?')} answers within {window.get('seconds', '?')} s per tier",
        "",
    ]
    for cls, entry in document.get("classes", {}).items():
        spare = entry.get("overflow") or []
        chain = " -> ".join(t for t in entry["tiers"] if t not in spare)
        overflow = f", then overflow {', '.join(spare)}" if spare else ""
        lines.append(f"{cls}: {chain}{overflow}  [{entry['how']}]")
        if entry.get("pin"):
            lines.append(f"  {entry['pin']}")
        for tier, why in entry.get("reasons", {}).items():
            lines.append(f"  {tier}: {why}")
        last = entry.get("last_change")
        if last is not None:
            was = "loaded" if last["from"] is None else f"was {', '.join(last['from'])}"
            lines.append(f"  since {last['at']} ({was}): {last['reason']}")
    lines.append("")
    for tier, figures in document.get("tiers", {}).items():
        lines.append(f"{tier}: {_calibration(figures.get('calibration'))}")
        lines.append(f"  live: {_live(figures.get('live'))}")
    return "\n".join(lines)


def _calibration(figures: Mapping[str, Any] | None) -> str:
    if figures is None:
        return "not calibrated"
    emulated = ", emulated" if figures.get("emulated") else ""
    return (
        f"calibration TTFT {figures['ttft_ms']:g} ms, TPOT {figures['tpot_ms']:g} ms, "
        f"{figures['throughput_tok_s']:g} tok/s under load ({figures['samples']} prompts{emulated})"
    )


def _stat(stat: Mapping[str, Any]) -> str:
    interval = stat.get("interval_ms")
    shown = f" [{interval[0]:g}, {interval[1]:g}]" if interval else ""
    return f"{stat['median_ms']:g} ms{shown} (n={stat['n']})"


def _live(live: Mapping[str, Any] | None) -> str:
    if not live or not live.get("n"):
        return "no answers in the window"
    parts = [f"{live['n']} answers ({live['streams']} streamed)"]
    if "tpot_ms" in live:
        parts.append(f"TPOT {_stat(live['tpot_ms'])}")
    for bucket, stat in live.get("ttft_ms_by_prompt_tokens", {}).items():
        parts.append(f"TTFT at {bucket} prompt tokens {_stat(stat)}")
    for level, stat in live.get("tpot_by_load", {}).items():
        parts.append(f"TPOT at load {level} {_stat(stat['tpot_ms'])}")
    if "whole_ms_per_token" in live:
        parts.append(f"whole answers {_stat(live['whole_ms_per_token'])} per token")
    return "; ".join(parts)
