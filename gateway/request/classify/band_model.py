"""The cascade's second-stage model: text → P(precise), in pure Python (no numpy).

A logistic regression over common/band_features.py's hashed features, trained offline by
classifier/train_band.py and shipped as one JSON weights file (``classifier/weights/``) that
the policy's ``classes.model.second_stage.weights`` names. It reads only the prompts the first
stage is unsure of (gateway/request/classify/second_stage.py runs it off the event loop).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.band_features import band_buckets
from gateway.request.classify.prompt_model import read_weights, sigmoid

FORMAT = "model-optimizer/band-model"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class BandModel:
    """A loaded second-stage weights file."""

    name: str
    version: int
    digest: str  # sha256 of the file's bytes, first 12 hex digits
    head_chars: int
    tail_chars: int
    bits: int
    bias: float
    weights: Mapping[int, float]

    @classmethod
    def load(cls, path: str | Path) -> BandModel:
        """Read a weights file; ``ModelError`` (one line naming it) on any problem."""
        return read_weights(Path(path), "the second-stage weights", "band-model file", cls.parse)

    @classmethod
    def parse(cls, raw: bytes) -> BandModel:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"'format' must be {FORMAT!r}")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"'format_version' must be {FORMAT_VERSION}")
        bits = data["bits"]
        if not isinstance(bits, int) or not 8 <= bits <= 24:
            raise ValueError("'bits' must be an integer in [8, 24]")
        weights = {int(k): float(v) for k, v in data["weights"].items()}
        if any(not 0 <= k < 1 << bits for k in weights):
            raise ValueError("a weight's bucket is outside [0, 2 ** bits)")
        window = data["window"]
        return cls(
            name=str(data["name"]),
            version=int(data["version"]),
            digest=hashlib.sha256(raw).hexdigest()[:12],
            head_chars=int(window["head_chars"]),
            tail_chars=int(window["tail_chars"]),
            bits=bits,
            bias=float(data["bias"]),
            weights=weights,
        )

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def p_precise(self, text: str) -> float:
        buckets = band_buckets(text, self.head_chars, self.tail_chars, self.bits)
        if not buckets:
            return sigmoid(self.bias)
        get = self.weights.get
        total = sum(get(b, 0.0) for b in buckets)
        return sigmoid(self.bias + total * len(buckets) ** -0.5)
