"""Classifier benchmark: time per request and accuracy on the Vicuna benchmark questions.

    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/bench_classifier.py \\
        [--policy policies/routing.yaml] [--tokenizer PATH/tokenizer.json] [--runs 20000] \\
        [--questions measure/data/vicuna_bench_questions.jsonl] [--patterns]

(a) Time: ``classify`` on prompts of exactly --tokens tokens (default 1,000, counted with the
    default model's tokenizer) built from the shipped calibration texts: chat prose, code and
    math. Each call is timed on its own (timeit, number=1) --runs times after a warm-up; median
    and p99. The token counting the gateway does first (``TokenCounter.count_chat``) is timed
    too, for the request path's budget. --patterns also times each pattern's check alone.
(b) Accuracy: each question's first turn, counted as a one-message chat, classified with the
    policy; expected class: Vicuna's ``coding`` -> code, ``math`` -> math, every other category
    -> tolerant. Prints the confusion matrix, per-class precision/recall and the misses with
    their reasons. The rules were written before this file was looked at and are not tuned to
    it: the numbers are what they are.
(c) The token counter against the exact ChatML rendering of those questions (SmolLM2's template
    is ChatML, rendered here by hand), to show how close the approximation is.

The tokenizer defaults to the embedded default model's (``~/.cache/model-optimizer/models/
SmolLM2-135M-Instruct-*/tokenizer.json``, created by ``./mo up`` or ``./mo optimize``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policy.schema import PolicyError, load_policy  # noqa: E402
from gateway.request.classify import (  # noqa: E402
    CODE,
    LONG,
    MATH,
    TOLERANT,
    CompiledClasses,
    classify,
)
from gateway.request.limits import TokenCounter, TokenizerError, read_chat_template  # noqa: E402
from gateway.request.prefilter import Scan  # noqa: E402
from measure.eval_data import VICUNA  # noqa: E402
from measure.serving_stats import percentile  # noqa: E402
from model_optimizer.envs import cache_root  # noqa: E402

CLASSES = (TOLERANT, CODE, MATH, LONG)
EXPECTED = {"coding": CODE, "math": MATH}  # every other Vicuna category: tolerant
DEFAULT_QUESTIONS = VICUNA  # the copy the repo ships (measure/data, with its license)
CALIBRATION = ROOT / "optimizer" / "data" / "calibration.jsonl"


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


def time_calls(call: object, runs: int) -> tuple[float, float]:
    timer = timeit.Timer(call)  # type: ignore[arg-type]
    timer.repeat(repeat=max(runs // 20, 50), number=1)  # warm-up
    samples = [s * 1e6 for s in timer.repeat(repeat=runs, number=1)]
    return percentile(samples, 50), percentile(samples, 99)


def bench_time(
    counter: TokenCounter, compiled: CompiledClasses, runs: int, tokens: int, per_pattern: bool
) -> None:
    print(f"(a) time per call, {tokens}-token prompts, {runs} runs each (microseconds)")
    print(f"    {'prompt':8} {'chars':>6} {'class':9} {'median':>8} {'p99':>8}   count_chat median")
    for name, text in prompts(counter, tokens).items():
        # With the chat template a 1,000-token text counts ~1,030 tokens, over long.min_tokens
        # (1,024), where classify returns at once; pass a count just under it so every rule runs.
        below = min(
            counter.count_chat([{"role": "user", "content": text}]), compiled.long_min_tokens - 1
        )
        median, p99 = time_calls(
            lambda text=text, below=below: classify(text, below, compiled), runs
        )
        messages = [{"role": "user", "content": text}]
        count_median, _ = time_calls(lambda m=messages: counter.count_chat(m), max(runs // 10, 200))
        cls = classify(text, below, compiled).cls
        print(f"    {name:8} {len(text):>6} {cls:9} {median:8.1f} {p99:8.1f}   {count_median:8.1f}")
        if per_pattern:
            scan = Scan.of(text)
            for matcher in (compiled.fence, *compiled.code_patterns, *compiled.math_patterns):
                cost, _ = time_calls(lambda m=matcher, s=scan: m.search(s), max(runs // 20, 200))
                hit = "match" if matcher.search(scan) else ""
                print(f"        {matcher.name:22} {cost:7.2f}  {hit}")
    print(
        f"    (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs)"
    )


def bench_accuracy(counter: TokenCounter, compiled: CompiledClasses, questions: Path) -> None:
    rows = [json.loads(line) for line in questions.read_text(encoding="utf-8").splitlines() if line]
    matrix: Counter[tuple[str, str]] = Counter()
    misses: list[str] = []
    for row in rows:
        text = row["turns"][0]
        expected = EXPECTED.get(row["category"], TOLERANT)
        n = counter.count_chat([{"role": "user", "content": text}])
        result = classify(text, n, compiled)
        matrix[expected, result.cls] += 1
        if result.cls != expected:
            snippet = " ".join(text.split())[:70]
            misses.append(
                f"    #{row['question_id']:<3} {row['category']:14} {expected:>8} -> "
                f"{result.cls:8} {snippet!r}\n          {result.reason}"
            )
    total = sum(matrix.values())
    correct = sum(matrix[c, c] for c in CLASSES)
    print(f"\n(b) accuracy on {questions.name}: {correct}/{total} = {correct / total:.1%}")
    print("    confusion matrix (rows: expected, columns: predicted)")
    print("    " + f"{'':10}" + "".join(f"{c:>10}" for c in CLASSES))
    for expected in CLASSES:
        cells = "".join(f"{matrix[expected, predicted]:>10}" for predicted in CLASSES)
        print(f"    {expected:10}{cells}")
    print(f"    {'class':10}{'precision':>10}{'recall':>10}{'support':>10}")
    for cls in (TOLERANT, CODE, MATH):
        predicted = sum(matrix[e, cls] for e in CLASSES)
        support = sum(matrix[cls, p] for p in CLASSES)
        precision = f"{matrix[cls, cls] / predicted:.2f}" if predicted else "-"
        recall = f"{matrix[cls, cls] / support:.2f}" if support else "-"
        print(f"    {cls:10}{precision:>10}{recall:>10}{support:>10}")
    categories = Counter(row["category"] for row in rows)
    print("    categories: " + ", ".join(f"{k} {v}" for k, v in sorted(categories.items())))
    if misses:
        print(f"    misclassified ({len(misses)}):")
        print("\n".join(misses))


def bench_counting(counter: TokenCounter, questions: Path) -> None:
    chat = counter.chat_format(counter.chat_template)
    if chat.family != "chatml":
        print(f"\n(c) token counter: template family {chat.family}, no exact rendering to compare")
        return
    system = (counter.chat_template or "").replace("\\n", "\n")
    start = system.find("<|im_start|>system\n")
    default = system[start + 19 : system.find("<|im_end|>", start)] if start >= 0 else None
    diffs = []
    for line in questions.read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["turns"][0]
        rendered = f"<|im_start|>system\n{default}<|im_end|>\n" if default is not None else ""
        rendered += f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        exact = len(counter.tokenizer.encode(rendered, add_special_tokens=False).ids)
        diffs.append(counter.count_chat([{"role": "user", "content": text}]) - exact)
    off = [d for d in diffs if d]
    print(
        f"\n(c) count_chat vs exact ChatML rendering on {len(diffs)} questions: "
        f"{len(diffs) - len(off)} exact, differences {sorted(set(off)) or 'none'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default=str(ROOT / "policies" / "routing.yaml"))
    parser.add_argument("--tokenizer", help="tokenizer.json (default: the default model's)")
    parser.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--patterns", action="store_true", help="time each pattern too")
    args = parser.parse_args()
    try:
        policy = load_policy(args.policy)
        path = find_tokenizer(args.tokenizer)
        counter = TokenCounter.from_file(path, read_chat_template(path.parent))
    except (PolicyError, TokenizerError) as exc:
        raise SystemExit(str(exc)) from None
    compiled = CompiledClasses.build(policy.classes)
    print(f"policy {args.policy}; tokenizer {path}")
    bench_time(counter, compiled, args.runs, args.tokens, args.patterns)
    questions = Path(args.questions)
    bench_accuracy(counter, compiled, questions)
    bench_counting(counter, questions)


if __name__ == "__main__":
    main()
