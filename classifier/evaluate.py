"""``model-optimizer classifier evaluate``: the classifier's figures on labeled prompts.

Pure Python (the gateway environment): each prompt is sent through the gateway's own
classification (gateway/request/classify/classes.py ``classify_request``) as a one-message chat,
under a policy's ``classes`` section: the shipped policy (the model, its threshold and overrides)
and, side by side, the keyword rules (policies/classes-keyword-rules.yaml). Token counts are not
needed: ``long`` is decided by tokens alone and is not part of these sets.

Reported per file: accuracy over the three classes, the binary precise-vs-tolerant accuracy
(what decides the route), per-class precision and recall, precise recall (code and math sent to
a precise class), the confusion matrix, and per source. The default files are the held-out set
(classifier/data/heldout.jsonl: sources never trained on) and the routing prompts
(measure/data/routing_prompts.jsonl: the Vicuna questions, test data only; its `long` rows are
left out). Neither is read by the training.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.class_categories import CODE, MATH, TOLERANT
from gateway.policy.classes import ClassesPolicy
from gateway.policy.schema import PolicyError, load_policy, parse_policy
from gateway.request.classify.classes import CompiledClasses, classify_request
from gateway.request.classify.second_stage import verdict

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "classifier" / "data" / "heldout.jsonl"
FOLLOWUPS = ROOT / "classifier" / "data" / "heldout-followups.jsonl"  # scripts/make_followups.py
ROUTING = ROOT / "measure" / "data" / "routing_prompts.jsonl"
POLICY = ROOT / "policies" / "routing.yaml"
KEYWORD_RULES = ROOT / "policies" / "classes-keyword-rules.yaml"
CASCADE = ROOT / "policies" / "classes-cascade.yaml"
CLASSES = (TOLERANT, CODE, MATH)
_ROUTES = "tiers: [t]\nroutes: {tolerant: [t], code: [t], math: [t], long: [t]}\n"


@dataclass
class Figures:
    """One classifier on one file."""

    name: str
    matrix: Counter[tuple[str, str]] = field(default_factory=Counter)
    by_source: Counter[tuple[str, bool]] = field(default_factory=Counter)
    misses: list[str] = field(default_factory=list)
    band: int = 0  # prompts the first stage was unsure of (the second stage decided)
    # (turn "first" | "follow-up", label precise?, predicted precise?) -> prompts
    by_turn: Counter[tuple[str, bool, bool]] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.matrix.values())

    @property
    def accuracy(self) -> float:
        return sum(self.matrix[c, c] for c in CLASSES) / self.total

    @property
    def binary_accuracy(self) -> float:
        right = sum(n for (e, p), n in self.matrix.items() if (e == TOLERANT) == (p == TOLERANT))
        return right / self.total

    @property
    def precise_recall(self) -> float:
        precise = [(e, p) for e in (CODE, MATH) for p in CLASSES]
        support = sum(self.matrix[k] for k in precise)
        kept = sum(self.matrix[e, p] for e, p in precise if p != TOLERANT)
        return kept / support if support else float("nan")

    @property
    def tolerant_recall(self) -> float:
        support = sum(self.matrix[TOLERANT, p] for p in CLASSES)
        return self.matrix[TOLERANT, TOLERANT] / support if support else float("nan")

    def turn(self, turn: str) -> str:
        """Precise and tolerant recall on ``turn``'s prompts, or "-" when there are none."""
        counts = self.by_turn
        out = []
        for precise, name in ((True, "precise"), (False, "tolerant")):
            support = counts[turn, precise, True] + counts[turn, precise, False]
            if support:
                out.append(f"{name} {counts[turn, precise, precise] / support:.1%} of {support}")
        return ", ".join(out) or "-"

    def precision(self, cls: str) -> float:
        predicted = sum(self.matrix[e, cls] for e in CLASSES)
        return self.matrix[cls, cls] / predicted if predicted else float("nan")

    def recall(self, cls: str) -> float:
        support = sum(self.matrix[cls, p] for p in CLASSES)
        return self.matrix[cls, cls] / support if support else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.total,
            "accuracy": round(self.accuracy, 4),
            "binary_accuracy": round(self.binary_accuracy, 4),
            "precise_recall": round(self.precise_recall, 4),
            "per_class": {
                c: {"precision": round(self.precision(c), 4), "recall": round(self.recall(c), 4)}
                for c in CLASSES
            },
            "confusion": {e: {p: self.matrix[e, p] for p in CLASSES} for e in CLASSES},
        } | ({"band_share": round(self.band / self.total, 4)} if self.band else {})


def load_rows(path: Path) -> list[dict[str, str]]:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("label") == "long":
            continue  # decided by tokens, not by these classifiers
        if row.get("label") not in CLASSES or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{i}: needs a prompt and a label tolerant|code|math")
        rows.append(row)
    return rows


def keyword_rules() -> CompiledClasses:
    text = _ROUTES + KEYWORD_RULES.read_text(encoding="utf-8")
    return CompiledClasses.build(parse_policy(text, str(KEYWORD_RULES)).classes)


def cascade_rules(path: Path = CASCADE) -> CompiledClasses:
    """A cascade's ``classes`` section (policies/classes-cascade.yaml: the first stage, its
    band, the second)."""
    text = _ROUTES + path.read_text(encoding="utf-8")
    return CompiledClasses.build(parse_policy(text, str(path)).classes, path.parent)


def chat(row: dict[str, Any]) -> dict[str, Any]:
    """A row as a chat: its ``history`` (earlier user turns, each answered) then its prompt."""
    messages: list[dict[str, str]] = []
    for turn in row.get("history") or ():
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": "Sure."}]
    return {"messages": [*messages, {"role": "user", "content": row["prompt"]}]}


def policy_rules(path: Path, threshold: float | None = None) -> CompiledClasses:
    classes: ClassesPolicy = load_policy(path).classes
    if threshold is not None and classes.model is not None:
        model = classes.model.model_copy(update={"threshold": threshold})
        classes = classes.model_copy(update={"model": model})
    return CompiledClasses.build(classes, path.parent)


def measure(name: str, rules: CompiledClasses, rows: Sequence[dict[str, str]]) -> Figures:
    figures = Figures(name)
    for row in rows:
        found = classify_request(chat(row), 0, rules)
        if found.band is not None:  # the second stage, here in line (deterministic)
            figures.band += 1
            found = verdict(found.band, found.band.stage.model.p_precise(found.band.text))
        figures.matrix[row["label"], found.cls] += 1
        source = str(row.get("source", "-")).split(":")[0]
        right = (found.cls == TOLERANT) == (row["label"] == TOLERANT)
        figures.by_source[source, right] += 1
        turn = "follow-up" if row.get("history") else "first"
        figures.by_turn[turn, row["label"] != TOLERANT, found.cls != TOLERANT] += 1
        if not right:
            snippet = " ".join(row["prompt"].split())[:70]
            figures.misses.append(
                f"{row['label']:>8} -> {found.cls:8} {row.get('source', '')}: {snippet!r}\n"
                f"             {found.reason}"
            )
    return figures


def render(file: Path, results: Sequence[Figures], misses: int = 0) -> str:
    out = [f"## {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}", ""]
    names = [r.name for r in results]
    out.append("| figure | " + " | ".join(names) + " |")
    out.append("|---|" + "---|" * len(results))
    rows: list[tuple[str, Callable[[Figures], str]]] = [
        ("prompts", lambda f: str(f.total)),
        ("accuracy (3 classes)", lambda f: f"{f.accuracy:.1%}"),
        ("accuracy (precise vs tolerant)", lambda f: f"{f.binary_accuracy:.1%}"),
        ("precise recall (code+math kept precise)", lambda f: f"{f.precise_recall:.1%}"),
        ("tolerant recall (tolerant kept tolerant)", lambda f: f"{f.tolerant_recall:.1%}"),
        ("first turns", lambda f: f.turn("first")),
        ("follow-up turns", lambda f: f.turn("follow-up")),
        ("share in the band (second stage)", lambda f: f"{f.band / f.total:.1%}"),
    ]
    for cls in CLASSES:
        rows.append((f"{cls} precision / recall", _pr(cls)))
    for label, get in rows:
        out.append(f"| {label} | " + " | ".join(get(r) for r in results) + " |")
    for r in results:
        out += ["", f"Confusion, {r.name} (rows: label, columns: predicted)", ""]
        out.append("| label | " + " | ".join(CLASSES) + " |")
        out.append("|---|" + "---|" * len(CLASSES))
        for e in CLASSES:
            out.append(f"| {e} | " + " | ".join(str(r.matrix[e, p]) for p in CLASSES) + " |")
        sources = sorted({s for s, _ in r.by_source})
        parts = []
        for s in sources:
            right, total = r.by_source[s, True], r.by_source[s, True] + r.by_source[s, False]
            parts.append(f"{s} {right}/{total}")
        out += ["", "Precise-vs-tolerant right, per source: " + ", ".join(parts)]
        if misses:
            out += ["", f"First {min(misses, len(r.misses))} of {len(r.misses)} misses:", "```"]
            out += [*r.misses[:misses], "```"]
    return "\n".join(out)


def _pr(cls: str) -> Callable[[Figures], str]:
    return lambda f: f"{f.precision(cls):.1%} / {f.recall(cls):.1%}"


def run(
    files: Sequence[Path],
    policy: Path = POLICY,
    threshold: float | None = None,
    misses: int = 0,
    output: Path | None = None,
    with_cascade: bool = True,
    cascade_file: Path = CASCADE,
) -> str:
    try:
        model = policy_rules(policy, threshold)
        rules = keyword_rules()
        cascade = cascade_rules(cascade_file) if with_cascade and model.second is None else None
    except PolicyError as exc:
        raise SystemExit(f"model-optimizer: error: {exc}") from None
    if model.model is None or model.model_rule is None:
        raise SystemExit(f"model-optimizer: error: {policy}: classes.model is not set")
    label = f"model ({model.model.label}, threshold {model.model_rule.threshold:g})"
    if model.second is not None:
        label = f"cascade ({model.model.label}, then {model.second.model.label})"
    cascade_label = f"cascade ({cascade_file.name})"
    sections = []
    report: dict[str, Any] = {"policy": str(policy), "model": model.model.label, "files": {}}
    for file in files:
        rows = load_rows(file)
        results = [measure(label, model, rows)]
        if cascade is not None:
            results.append(measure(cascade_label, cascade, rows))
        results.append(measure("keyword rules", rules, rows))
        sections.append(render(file, results, misses))
        report["files"][str(file)] = {r.name: r.as_dict() for r in results}
    text = "\n\n".join(sections)
    if output is not None:
        output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return text
