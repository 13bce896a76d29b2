"""Train the cascade's second stage and choose the cascade's thresholds, by cross-validation over
the training sources only (classifier/data/train.jsonl; the held-out file is never read here).

The first stage is the shipped prompt model's recipe (its norm power and C, read from its
weights file's metadata); its probabilities out of fold (GroupKFold by source, each fold scored
by a model that never saw its sources) give the band:

- ``sure_tolerant``: below it the first stage answers tolerant; the highest value that leaves
  at most ``1 - SURE_TOLERANT_RECALL`` of the precise prompts below it out of fold;
- ``sure_precise``: from it the first stage answers precise; the lowest value with at most
  ``1 - SURE_PRECISE_KEEP`` of the tolerant prompts at or above it out of fold;
- between them the second stage decides (a logistic regression over common/band_features.py's
  hashed features); its threshold is the highest that keeps the cascade's precise recall out of
  fold at ``TARGET_RECALL``.

Writes ``classifier/weights/band-model-v2.json`` and prints the thresholds for the policy.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.linear_model import LogisticRegression

from classifier.train import HEAD_CHARS, TAIL_CHARS, TRAIN, _cross_validate, _group, _matrix, _rows
from common.band_features import band_buckets
from common.prompt_features import features

ROOT = Path(__file__).resolve().parent.parent
FORMAT, FORMAT_VERSION = "model-optimizer/band-model", 1  # gateway/request/classify/band_model.py
BITS = 18
C_GRID = (1.0, 4.0, 16.0, 64.0)
TARGET_RECALL = 0.98
SURE_TOLERANT_RECALL = 0.995
SURE_PRECISE_KEEP = 0.98
MIN_WEIGHT = 1e-3


@dataclass(frozen=True)
class Options:
    data: Path = TRAIN
    first: Path = ROOT / "classifier" / "weights" / "prompt-model-v4.json"
    output: Path = ROOT / "classifier" / "weights" / "band-model-v2.json"
    version: int = 2
    folds: int = 5


def _band_matrix(texts: list[str]) -> csr_matrix:
    indices: list[int] = []
    data: list[float] = []
    indptr = [0]
    for text in texts:
        buckets = band_buckets(text, HEAD_CHARS, TAIL_CHARS, BITS)
        indices.extend(buckets)
        data.extend([len(buckets) ** -0.5] * len(buckets))
        indptr.append(len(indices))
    return csr_matrix((data, indices, indptr), shape=(len(texts), 1 << BITS))


def _first_stage(rows: list[dict[str, str]], first: Path, groups: np.ndarray, folds: int) -> Any:
    """The first stage's probabilities out of fold, with the shipped model's recipe."""
    cv = json.loads(first.read_text())["metadata"]["cross_validation"]
    found = [features(r["prompt"], HEAD_CHARS, TAIL_CHARS) for r in rows]
    names = [f.names() for f in found]
    counts = [f.count for f in found]
    df: dict[str, int] = {}
    for row in names:
        for n in set(row):
            df[n] = df.get(n, 0) + 1
    vocabulary = {n: j for j, n in enumerate(sorted(n for n, k in df.items() if k >= 3))}
    x = _matrix(names, counts, vocabulary, float(cv["norm_power"]))
    y = np.array([r["label"] != "tolerant" for r in rows], dtype=int)
    return _cross_validate(x, y, groups, folds, float(cv["C"]))


def _log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def choose(y: np.ndarray, p1: np.ndarray, p2: np.ndarray) -> dict[str, float]:
    """The cascade's thresholds from out-of-fold probabilities (see the module docstring)."""
    precise, tolerant = np.sort(p1[y == 1]), np.sort(p1[y == 0])
    sure_tolerant = float(precise[math.floor((1 - SURE_TOLERANT_RECALL) * len(precise))])
    sure_precise = float(
        tolerant[min(math.ceil(SURE_PRECISE_KEEP * len(tolerant)), len(tolerant) - 1)]
    )
    band = (p1 >= sure_tolerant) & (p1 < sure_precise)
    above = p1 >= sure_precise
    needed = math.ceil(TARGET_RECALL * (y == 1).sum()) - int((above & (y == 1)).sum())
    candidates = np.sort(p2[band & (y == 1)])[::-1]
    second = 1.0 if needed <= 0 else float(candidates[min(needed, len(candidates)) - 1])
    return {"sure_tolerant": sure_tolerant, "sure_precise": sure_precise, "second": second}


def cascade(y: np.ndarray, p1: np.ndarray, p2: np.ndarray, t: dict[str, float]) -> dict[str, float]:
    band = (p1 >= t["sure_tolerant"]) & (p1 < t["sure_precise"])
    predicted = (p1 >= t["sure_precise"]) | (band & (p2 >= t["second"]))
    return {
        "precise_recall": round(float(predicted[y == 1].mean()), 4),
        "tolerant_recall": round(float((~predicted)[y == 0].mean()), 4),
        "band_share": round(float(band.mean()), 4),
    }


def train(opts: Options, say: Any = print) -> dict[str, Any]:
    rows = _rows(opts.data)
    groups = np.array([_group(r["source"]) for r in rows])
    y = np.array([r["label"] != "tolerant" for r in rows], dtype=int)
    p1 = _first_stage(rows, opts.first, groups, opts.folds)
    x = _band_matrix([r["prompt"] for r in rows])
    scored = []
    for c in C_GRID:
        oof = _cross_validate(x, y, groups, opts.folds, c)
        scored.append((_log_loss(y, oof), c, oof))
        say(f"  second stage C={c:<5g} cross-validated log loss {scored[-1][0]:.4f}")
    loss, c_best, p2 = min(scored, key=lambda item: item[0])
    t = choose(y, p1, p2)
    figures = cascade(y, p1, p2, t)
    say(f"  thresholds {t}; out of fold {figures}")
    model = LogisticRegression(C=c_best, class_weight="balanced", solver="liblinear", max_iter=1000)
    model.fit(x, y)
    weights = {
        str(j): round(float(w), 4) for j, w in enumerate(model.coef_[0]) if abs(w) >= MIN_WEIGHT
    }
    out = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": "band-model",
        "version": opts.version,
        "window": {"head_chars": HEAD_CHARS, "tail_chars": TAIL_CHARS},
        "bits": BITS,
        "bias": round(float(model.intercept_[0]), 4),
        "weights": weights,
        "metadata": {
            "trained_on": str(opts.data.relative_to(ROOT)),
            "data_sha256": hashlib.sha256(opts.data.read_bytes()).hexdigest()[:12],
            "first_stage": opts.first.name,
            "cross_validation": {
                "C": c_best,
                "searched": {"C": list(C_GRID)},
                "log_loss": round(loss, 4),
                "folds": opts.folds,
                "grouped_by": "source (each fold scores sources its model never saw)",
                "thresholds": {k: round(v, 4) for k, v in t.items()},
                "cascade_out_of_fold": figures,
            },
        },
    }
    text = json.dumps(out, separators=(",", ":"))
    opts.output.write_text(text + "\n", encoding="utf-8")
    say(f"wrote {opts.output} ({len(text) / 1024:.0f} KiB, {len(weights)} weights)")
    return out


if __name__ == "__main__":
    train(Options())
