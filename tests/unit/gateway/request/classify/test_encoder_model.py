"""The encoder second stage (gateway/request/classify/encoder_model.py): the head's arithmetic on a
stand-in session, and an unusable head or runtime leaving the first stage serving."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.classes import SecondStageRule
from gateway.request.classify.encoder_model import EncoderModel
from gateway.request.classify.prompt_model import ModelError
from gateway.request.classify.second_stage import SecondStage


class _Encoded:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class _Tokenizer:
    def __init__(self) -> None:
        self.read: list[str] = []

    def encode(self, text: str) -> _Encoded:
        self.read.append(text)
        return _Encoded([101, *range(1000, 1000 + len(text.split())), 102])


class _Session:
    def __init__(self) -> None:
        self.fed: list[Any] = []

    def run(self, _names: object, feed: dict[str, Any]) -> list[list[list[float]]]:
        self.fed.append(feed["input_ids"].tolist())
        return [[[0.5, -1.0, 2.0]]]


def _model(tokens: int) -> EncoderModel:
    return EncoderModel(
        "head", 1, "x", tokens, 0.25, (1.0, 2.0, 0.5), _Session(), _Tokenizer()
    )  # fmt: skip


def test_the_head_scores_the_embedding_of_the_first_tokens() -> None:
    model = _model(tokens=4)
    p = model.p_precise("one two three four five six " * 10)
    assert p == pytest.approx(1 / (1 + math.exp(-(0.25 + 0.5 - 2.0 + 1.0))))
    assert model.session.fed == [[[101, 1000, 1001, 102]]]  # cut to 4, ending with [SEP]
    assert len(model.tokenizer.read[0]) == 32  # at most 8 characters a token are read
    short = _model(tokens=8)
    short.p_precise("hi there")
    assert short.session.fed == [[[101, 1000, 1001, 102]]]


def _head(folder: Path, **change: object) -> Path:
    head = {
        "format": "model-optimizer/encoder-head",
        "onnx": "missing.onnx",
        "tokenizer": "tokenizer.json",
        "tokens": 32,
        "dimensions": 3,
        "bias": 0.0,
        "weights": [0.1, 0.2, 0.3],
    } | change
    path = folder / "encoder-head.json"
    path.write_text(json.dumps(head))
    return path


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"weights": [0.1]}, "'weights' must hold 'dimensions' numbers"),
        ({"format": "other"}, "'format' must be"),
        ({"tokens": 1}, "'tokens' must be in"),
    ],
)
def test_a_bad_head_is_one_line(tmp_path: Path, change: dict[str, object], said: str) -> None:
    with pytest.raises(ModelError, match=said) as error:
        EncoderModel.load(_head(tmp_path, **change))
    assert "\n" not in str(error.value) and "encoder-head.json" in str(error.value)


def test_a_missing_runtime_or_graph_leaves_the_first_stage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Without onnxruntime (the gateway environment's case) the runtime is missing; with it, the
    # graph the head names is: either way the stage is not loaded and one line says why.
    rule = SecondStageRule(
        weights="encoder-head.json", kind="encoder", threshold=0.5,
        sure_tolerant=0.1, sure_precise=0.9,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="gateway.request.classify.second_stage"):
        stage = SecondStage.load(rule, _head(tmp_path))
    assert stage is None
    logger = "gateway.request.classify.second_stage"
    lines = [r.getMessage() for r in caplog.records if r.name == logger]
    assert len(lines) == 1 and "encoder-head.json" in lines[0] and "\n" not in lines[0]
    assert "onnxruntime" in lines[0] or "cannot open the encoder" in lines[0]
