"""The trained prompt model: text → P(precise) and code-vs-math, in pure Python (no numpy).

Two logistic regressions over the same sparse features, trained offline by
``model-optimizer classifier train`` (classifier/train.py) and shipped as one JSON weights file
(``classifier/weights/``) that the routing policy names:

- ``precise``: P(the prompt asks for code or math), against ``tolerant``;
- ``code``: P(code | precise), against ``math``.

Features: common/prompt_features.py (shared with the training, so both see the same ones).

A text's score is ``bias + sum(weight of each present feature) / n ** norm_power`` where ``n``
is the number of features present (unknown features count in the norm but weigh nothing) and
``norm_power`` is the weights file's (0.5, a square root, in a ``format_version`` 1 file), the
probability its logistic. The sums are C-level set intersections and ``map`` over dicts: a
1,000-token prompt costs tens of microseconds (benchmarks/bench_classifier.py).

``TextScore.top`` names the features that pushed a score most, for ``x-route-reason``.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from common.prompt_features import Features, feature_key, feature_name, features

FORMAT = "model-optimizer/prompt-model"
FORMAT_VERSION = 2  # 1: the norm is a square root; 2: the file names its ``norm_power``


T = TypeVar("T")


class ModelError(Exception):
    """A weights file that cannot be used; ``str()`` is one line naming the file."""


@dataclass(frozen=True, slots=True)
class Tables:
    """Both regressions' weights, one index per feature kind: a feature present is looked up
    once (one set intersection per kind) and gives its row in ``precise`` and ``code``."""

    words: Mapping[bytes, int]
    marks: Mapping[int, int]
    keys: tuple[object, ...]  # row -> feature key
    precise: tuple[float, ...]
    code: tuple[float, ...]
    precise_bias: float
    code_bias: float

    @classmethod
    def from_json(cls, precise: Mapping[str, object], code: Mapping[str, object]) -> Tables:
        biases = []
        tables = []
        for part in (precise, code):
            bias, weights = part["bias"], part["weights"]
            if not isinstance(bias, int | float) or not isinstance(weights, Mapping):
                raise ValueError("a model needs a numeric 'bias' and a 'weights' mapping")
            for name, weight in weights.items():
                if not isinstance(weight, int | float):
                    raise ValueError(f"feature {name!r}: weight {weight!r} is not a number")
            biases.append(float(bias))
            tables.append(weights)
        names = sorted(set(tables[0]) | set(tables[1]))
        keys = tuple(feature_key(n) for n in names)
        index: dict[str, dict[object, int]] = {"w": {}, "c": {}}
        for row, (name, key) in enumerate(zip(names, keys, strict=True)):
            index[name.partition(":")[0]][key] = row
        return cls(
            words=index["w"],  # type: ignore[arg-type]
            marks=index["c"],  # type: ignore[arg-type]
            keys=keys,
            precise=tuple(float(tables[0].get(n, 0.0)) for n in names),
            code=tuple(float(tables[1].get(n, 0.0)) for n in names),
            precise_bias=biases[0],
            code_bias=biases[1],
        )

    def rows(self, found: Features) -> list[int]:
        """The rows of the known features present in ``found``."""
        rows: list[int] = []
        words = self.words.keys() & found.words
        if words:
            rows.extend(map(self.words.__getitem__, words))
        marks = self.marks.keys() & found.marks
        if marks:
            rows.extend(map(self.marks.__getitem__, marks))
        return rows


def sigmoid(logit: float) -> float:
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    e = math.exp(logit)
    return e / (1.0 + e)


@dataclass(frozen=True, slots=True)
class TextScore:
    """The model's view of one text: the log-odds of precise (against tolerant), and what is
    needed to tell code from math and to explain it, computed only when asked."""

    precise: float  # logit
    rows: tuple[int, ...]  # known features present
    norm: float  # 1 / (features present) ** norm_power
    tables: Tables

    @property
    def p_precise(self) -> float:
        return sigmoid(self.precise)

    @property
    def code(self) -> float:
        """The log-odds of code against math (meaningful for a precise text)."""
        code = self.tables.code
        return self.tables.code_bias + sum(map(code.__getitem__, self.rows)) * self.norm

    def top(self, toward_precise: bool, count: int = 3) -> list[str]:
        """The ``count`` features present that pushed most toward precise (or, when
        ``toward_precise`` is false, toward tolerant), strongest first: ``+python``."""
        weights = self.tables.precise
        pick = heapq.nlargest if toward_precise else heapq.nsmallest
        best = pick(count, self.rows, key=weights.__getitem__)
        keys = self.tables.keys
        return [
            f"{'+' if weights[r] > 0 else '-'}{feature_name(keys[r])}"
            for r in best
            if (weights[r] > 0) == toward_precise and weights[r] != 0
        ]


def read_weights(path: Path, what: str, kind: str, parse: Callable[[bytes], T]) -> T:
    """``parse`` of the file's bytes, for both stages' weights files (band_model.py too): a
    file that cannot be read or parsed is a ``ModelError``, one line naming it."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        return parse(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"{path}: not a usable {kind}: {exc}") from None


@dataclass(frozen=True)
class PromptModel:
    """A loaded weights file (see the module docstring)."""

    name: str
    version: int
    digest: str  # sha256 of the file's bytes, first 12 hex digits
    head_chars: int
    tail_chars: int
    tables: Tables
    metadata: Mapping[str, object]
    norm_power: float = 0.5

    @classmethod
    def load(cls, path: str | Path) -> PromptModel:
        """Read a weights file; ``ModelError`` (one line naming it) on any problem."""
        return read_weights(Path(path), "the model weights", "prompt-model file", cls.parse)

    @classmethod
    def parse(cls, raw: bytes) -> PromptModel:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"'format' must be {FORMAT!r}")
        version = data.get("format_version")
        if version not in (1, FORMAT_VERSION) or isinstance(version, bool):
            raise ValueError(f"'format_version' must be 1 or {FORMAT_VERSION}")
        power = 0.5 if version == 1 else data["norm_power"]
        if isinstance(power, bool) or not isinstance(power, int | float) or not 0 < power <= 2:
            raise ValueError("'norm_power' must be a number in (0, 2]")
        window_ = data["window"]
        head, tail = int(window_["head_chars"]), int(window_["tail_chars"])
        if head <= 0 or tail < 0:
            raise ValueError("window: head_chars must be > 0 and tail_chars >= 0")
        return cls(
            name=str(data["name"]),
            version=int(data["version"]),
            digest=hashlib.sha256(raw).hexdigest()[:12],
            head_chars=head,
            tail_chars=tail,
            tables=Tables.from_json(data["precise"], data["code"]),
            metadata=data.get("metadata", {}),
            norm_power=float(power),
        )

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def features(self, text: str) -> Features:
        return features(text, self.head_chars, self.tail_chars)

    def score(self, text: str) -> TextScore:
        found = self.features(text)
        tables = self.tables
        rows = tuple(tables.rows(found))
        count = found.count
        if not count:
            norm = 0.0
        elif self.norm_power == 0.5:  # format 1: exactly as before
            norm = 1.0 / math.sqrt(count)
        else:
            norm = count**-self.norm_power
        precise = tables.precise
        logit = tables.precise_bias + sum(map(precise.__getitem__, rows)) * norm
        return TextScore(logit, rows, norm, tables)


def combine(logits: Iterable[tuple[float, float]]) -> float:
    """The weighted mean of (logit, weight) pairs (weights > 0)."""
    total = weight_sum = 0.0
    for logit, weight in logits:
        total += logit * weight
        weight_sum += weight
    return total / weight_sum if weight_sum else 0.0
