"""Classifier benchmark: time per request, accuracy side by side, the routing frontier.

    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/bench_classifier.py \\
        [--policy policies/routing.yaml] [--tokenizer PATH/tokenizer.json] [--runs 20000] \\
        [--tokens 1000] [--patterns] [--json benchmarks/results/classifier.json]
        [--plot benchmarks/results/classifier_frontier.png]

Two classifiers, each through the gateway's own ``classify_request`` (a one-message chat): the
shipped policy's (the trained model, its threshold, its overrides) and the keyword rules
(policies/classes-keyword-rules.yaml).

(a) Time at 1,000 tokens: prompts of exactly --tokens tokens (default 1,000, the default model's
    tokenizer) cut from the shipped calibration texts (chat prose, code, math). Each call is
    timed alone (timeit, number=1) --runs times after a warm-up; median and p99 of the wall
    clock, and of the thread's CPU time (on a shared machine the wall clock's p99 is mostly the
    time other processes held the CPU). The token counting the gateway does first
    (``TokenCounter.count_chat``) is timed too, for the request path's budget. --patterns also
    times each keyword-rule pattern alone.
(b) Time by size: one chat message of 1 KB, 10 KB, 100 KB and 1 MB (the gateway's body limit),
    and 1 MB as a completions list of 100,000 short prompts; median and max of --size-runs
    calls. What is read is bounded (the window, ``max_turns``, ``max_prompts``): past the window
    only the copies the request already implies (joining a message's parts) grow with the input.
(c) Accuracy side by side on the held-out set (classifier/data/heldout.jsonl, sources never
    trained on) and on the routing prompts (measure/data/routing_prompts.jsonl, the Vicuna
    questions: test data only), through classifier/evaluate.py.
(d) The routing-eval frontier re-scored offline: benchmarks/results/routing.json holds, for
    each of the routing prompts, every tier's direct answer (tokens, agreement with fp16). With
    each classifier's classes, every assignment class -> tier gives a (cheap share, quality)
    point (measure/frontier.py); the Pareto frontier and the point of the routes that run used
    (tolerant -> int4, code and math -> fp16, long as the gateway chose) are printed side by side.
    No tier is run: the answers are those recorded on 2026-12-03.

The tokenizer defaults to the embedded default model's (``~/.cache/model-optimizer/models/
SmolLM2-135M-Instruct-*/tokenizer.json``, created by ``./mo up`` or ``./mo optimize``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from classifier import evaluate  # noqa: E402
from common.class_categories import LONG  # noqa: E402
from gateway.policy.schema import PolicyError  # noqa: E402
from gateway.request.classify.classes import CompiledClasses, classify_request  # noqa: E402
from gateway.request.classify.prefilter import Scan  # noqa: E402
from gateway.request.tokens.limits import TokenCounter, TokenizerError, read_chat_template  # noqa: E402
from measure.frontier import Outcome, Point, Speed, all_points, pareto  # noqa: E402
from measure.serving_stats import percentile  # noqa: E402
from model_optimizer.envs import cache_root  # noqa: E402

CALIBRATION = ROOT / "optimizer" / "data" / "calibration.jsonl"
ROUTING_RUN = ROOT / "benchmarks" / "results" / "routing.json"
SIZES = (1_000, 10_000, 100_000, 1_000_000)


def find_tokenizer(given: str | None) -> Path:
    if given:
        return Path(given)
    found = sorted(cache_root().glob("models/SmolLM2-135M-Instruct-*/tokenizer.json"))
    if not found:
        raise SystemExit(
            f"no tokenizer.json under {cache_root() / 'models'}/SmolLM2-135M-Instruct-*: run "
            "`./mo up` (or `./mo optimize --model default ...`) once, or pass --tokenizer PATH"
        )
    return found[-1]


def prompts(counter: TokenCounter, tokens: int) -> dict[str, str]:
    """One prompt of exactly ``tokens`` tokens per calibration category (chat, code, math)."""
    rows = [json.loads(line) for line in CALIBRATION.read_text(encoding="utf-8").splitlines()]
    tokenizer = counter.tokenizer
    out: dict[str, str] = {}
    for category in ("chat", "code", "math"):
        text = "\n\n".join(r["text"] for r in rows if r["category"] == category)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) < tokens:
            raise SystemExit(f"{CALIBRATION}: only {len(ids)} tokens of {category} text")
        out[category] = tokenizer.decode(ids[:tokens])
    return out


def time_calls(
    call: Callable[[], object], runs: int, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, float]:
    timer = timeit.Timer(call, timer=clock)
    timer.repeat(repeat=max(runs // 20, 50), number=1)  # warm-up
    samples = [s * 1e6 for s in timer.repeat(repeat=runs, number=1)]
    return percentile(samples, 50), percentile(samples, 99)


def _chat(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def bench_time(
    counter: TokenCounter,
    classifiers: dict[str, CompiledClasses],
    runs: int,
    tokens: int,
    per_pattern: bool,
) -> dict[str, Any]:
    print(f"(a) time per call, {tokens}-token prompts, {runs} runs each (microseconds)")
    print(
        f"    {'classifier':14} {'prompt':6} {'chars':>6} {'class':9} {'median':>8} {'p99':>8}"
        f"   {'cpu median':>10} {'cpu p99':>8}"
    )
    out: dict[str, Any] = {}
    texts = prompts(counter, tokens)
    for name, rules in classifiers.items():
        for category, text in texts.items():
            body = _chat(text)
            # With the chat template a 1,000-token text counts ~1,030 tokens, over long.min_tokens
            # (1,024), where the classifier returns at once: pass a count just under it.
            below = min(counter.count_chat(body["messages"]), rules.long_min_tokens - 1)

            def call(
                b: dict[str, Any] = body, n: int = below, r: CompiledClasses = rules
            ) -> object:
                return classify_request(b, n, r)

            median, p99 = time_calls(call, runs)
            # The thread's CPU time: the same calls without the time other processes took.
            cpu_median, cpu_p99 = time_calls(call, runs, time.thread_time)
            cls = classify_request(body, below, rules).cls
            print(
                f"    {name:14} {category:6} {len(text):>6} {cls:9} {median:8.1f} {p99:8.1f}"
                f"   {cpu_median:10.1f} {cpu_p99:8.1f}"
            )
            out[f"{name}/{category}"] = {
                "class": cls,
                "median_us": median,
                "p99_us": p99,
                "cpu_median_us": cpu_median,
                "cpu_p99_us": cpu_p99,
            }
            if per_pattern and rules.model is None:
                scan = Scan.of(rules.window(text))
                keywords = rules.keywords
                for matcher in (keywords.fence, *keywords.code_patterns, *keywords.math_patterns):
                    cost, _ = time_calls(
                        lambda m=matcher, s=scan: m.search(s), max(runs // 20, 200)
                    )
                    hit = "match" if matcher.search(scan) else ""
                    print(f"        {matcher.name:22} {cost:7.2f}  {hit}")
    for category, text in texts.items():
        messages = [{"role": "user", "content": text}]
        count_median, _ = time_calls(lambda m=messages: counter.count_chat(m), max(runs // 10, 200))
        print(f"    token counting (count_chat) {category:6} median {count_median:8.1f}")
        out[f"count_chat/{category}"] = {"median_us": count_median}
    return out


def bench_sizes(classifiers: dict[str, CompiledClasses], runs: int) -> dict[str, Any]:
    print(f"\n(b) time by input size, {runs} calls each (milliseconds: median / max)")
    unit = "Solve for x: 3x + 5 = 20. Then write a Python function that checks it. "
    cases: list[tuple[str, dict[str, Any]]] = []
    for size in SIZES:
        cases.append((f"chat {size // 1000} KB", _chat((unit * (size // len(unit) + 1))[:size])))
    cases.append(("list 1 MB, 100k prompts", {"prompt": [f"p{i:06d}" for i in range(100_000)]}))
    cases.append(("list 1 MB, 100k same", {"prompt": ["Hello there"] * 100_000}))
    turn = (unit * 2)[:100]
    messages = [{"role": ("user", "assistant")[i % 2], "content": turn} for i in range(10_000)]
    cases.append(("chat 1 MB, 10k messages", {"messages": messages}))
    print(f"    {'input':26}" + "".join(f"{name:>22}" for name in classifiers))
    out: dict[str, Any] = {}
    for label, body in cases:
        cells = []
        for name, rules in classifiers.items():
            samples = sorted(
                timeit.repeat(
                    lambda b=body, r=rules: classify_request(b, 10, r), number=1, repeat=runs
                )
            )
            median, worst = samples[len(samples) // 2] * 1e3, samples[-1] * 1e3
            cells.append(f"{median:10.3f} / {worst:8.3f}")
            out[f"{name}/{label}"] = {"median_ms": median, "max_ms": worst}
        print(f"    {label:26}" + "".join(f"{c:>22}" for c in cells))
    return out


def bench_accuracy(classifiers: dict[str, CompiledClasses]) -> dict[str, Any]:
    print("\n(c) accuracy, side by side (classifier/evaluate.py; neither file was trained on)")
    out: dict[str, Any] = {}
    for file in (evaluate.HELDOUT, evaluate.ROUTING):
        rows = evaluate.load_rows(file)
        results = [evaluate.measure(name, rules, rows) for name, rules in classifiers.items()]
        print(evaluate.render(file, results))
        out[str(file.relative_to(ROOT))] = {r.name: r.as_dict() for r in results}
    return out


def bench_frontier(classifiers: dict[str, CompiledClasses]) -> dict[str, Any]:
    if not ROUTING_RUN.is_file():
        print(f"\n(d) frontier: {ROUTING_RUN} not found, skipped")
        return {}
    run = json.loads(ROUTING_RUN.read_text(encoding="utf-8"))
    rows = [
        json.loads(line)
        for line in (ROOT / run["file"]).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    recorded = run["outcomes"]
    if len(rows) != len(recorded):
        raise SystemExit(f"{ROUTING_RUN}: {len(recorded)} outcomes for {len(rows)} prompts")
    reference, tiers = run["reference"], list(run["tiers"])
    used = {"tolerant": "int4", "code": "fp16", "math": "fp16"}  # the routes of that run
    print(
        f"\n(d) routing frontier re-scored offline from {ROUTING_RUN.name} "
        f"({len(rows)} prompts, answers recorded per tier; reference {reference})"
    )
    out: dict[str, Any] = {}
    for name, rules in classifiers.items():
        outcomes = []
        for row, o in zip(rows, recorded, strict=True):
            tokens = 10_000 if row["label"] == LONG else 10  # long prompts were 1,200 tokens
            cls = classify_request(_chat(row["prompt"]), tokens, rules).cls
            # prompt + completion tokens per tier, kept whole as the "completion" (runs before
            # the measured cost axis recorded only the sum)
            tokens = o.get("tokens") or {
                t: o["prompt_tokens"] + n for t, n in o["completion"].items()
            }
            outcomes.append(
                Outcome(row["label"], cls, o["route_tier"], 0, 0, 0.0, tokens, o["quality"])
            )
        # That run recorded no tier speeds: its axis stays the share of tokens served off fp16
        # (a description of the traffic, not a cost), the frontier taken over it.
        unmeasured = dict.fromkeys(tiers, Speed(0.0, 0.0))
        points = [
            Point(p.assignment, 1.0 - p.off_reference, p.quality, p.off_reference)
            for p in all_points(outcomes, tiers, unmeasured, reference)
        ]
        frontier = sorted(pareto(points), key=lambda p: p.off_reference)
        chosen = [used.get(o.route_class, o.route_tier) for o in outcomes]
        total = sum(o.tokens(t) for o, t in zip(outcomes, chosen, strict=True))
        cheap = sum(o.tokens(t) for o, t in zip(outcomes, chosen, strict=True) if t != reference)
        quality = sum(o.quality[t] for o, t in zip(outcomes, chosen, strict=True)) / len(outcomes)
        share = cheap / total
        print(f"    {name}: the run's routes -> cheap share {share:.1%}, quality {quality:.3f}")
        print(f"      frontier ({len(frontier)} of {len(points)} assignments):")
        for p in frontier:
            print(f"        {p.off_reference:6.1%}  {p.quality:.3f}  {_assignment(p)}")
        out[name] = {
            "routes_point": {"cheap_share": cheap / total, "quality": quality},
            "frontier": [
                {
                    "cheap_share": p.off_reference,
                    "quality": p.quality,
                    "assignment": dict(p.assignment),
                }
                for p in frontier
            ],
        }
    return out


def plot_frontiers(frontiers: dict[str, Any], path: Path) -> None:
    """Both classifiers' frontiers and their points under the run's routes, in one PNG."""
    # Here, not at the top: a heavy import only the plot needs; Agg before pyplot.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    for (name, data), color in zip(frontiers.items(), ("tab:blue", "tab:orange"), strict=False):
        front = data["frontier"]
        ax.plot(
            [p["cheap_share"] for p in front],
            [p["quality"] for p in front],
            "o-",
            color=color,
            label=f"{name}: Pareto frontier",
        )
        point = data["routes_point"]
        ax.scatter(
            [point["cheap_share"]],
            [point["quality"]],
            marker="*",
            s=220,
            color=color,
            zorder=5,
            label=f"{name}: the run's routes",
        )
    ax.set_xlabel("share of tokens served by tiers other than fp16")
    ax.set_ylabel("quality relative to all-fp16 (token agreement)")
    ax.set_title("Routing frontier re-scored: trained model vs keyword rules")
    ax.set_xlim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.savefig(path, format="png", bbox_inches="tight")
    plt.close(fig)


def _assignment(point: Point) -> str:
    return ", ".join(f"{cls}->{tier}" for cls, tier in point.assignment)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", type=Path, default=evaluate.POLICY)
    parser.add_argument("--tokenizer", help="tokenizer.json (default: the default model's)")
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--size-runs", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--patterns", action="store_true", help="time each keyword pattern too")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument("--plot", type=Path, help="also draw both frontiers into this PNG")
    args = parser.parse_args()
    try:
        path = find_tokenizer(args.tokenizer)
        counter = TokenCounter.from_file(path, read_chat_template(path.parent))
        model = evaluate.policy_rules(args.policy)
        classifiers = {"model": model, "keyword rules": evaluate.keyword_rules()}
    except (PolicyError, TokenizerError) as exc:
        raise SystemExit(str(exc)) from None
    cpu = _cpu()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"policy {args.policy}; tokenizer {path}; CPU {cpu}, {os.cpu_count()} cores; load {load}")
    figures: dict[str, Any] = {"cpu": cpu, "python": platform.python_version()}
    figures["time_1000_tokens"] = bench_time(
        counter, classifiers, args.runs, args.tokens, args.patterns
    )
    figures["time_by_size"] = bench_sizes(classifiers, args.size_runs)
    figures["accuracy"] = bench_accuracy(classifiers)
    figures["frontier"] = bench_frontier(classifiers)
    if args.plot and figures["frontier"]:
        plot_frontiers(figures["frontier"], args.plot)
    figures["load_average_after"] = os.getloadavg()
    print(
        f"\n(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
