"""gateway/measured.py: the file up writes with what it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import MeasuredTier
from gateway.measured import (
    MeasuredError,
    MeasuredStack,
    read_measured,
    write_measured,
)

FP16 = MeasuredTier(
    quality={"chat": 1.0, "code": 1.0, "math": 1.0}, ttft_s=0.1, tpot_s=0.02, throughput_tok_s=60
)
INT4 = MeasuredTier(
    quality={"chat": 0.7, "code": 0.4, "math": 0.8}, ttft_s=0.2, tpot_s=0.03, throughput_tok_s=40
)


def test_written_and_read_back(tmp_path: Path) -> None:
    stack = MeasuredStack(
        written_at="2026-12-03T10:00:00+00:00",
        gateway_port=8000,
        reference="fp16",
        tiers={"fp16": FP16, "int4": INT4},
        classes={"int4": ["tolerant"]},
    )
    path = tmp_path / "sub" / "m.json"
    write_measured(path, stack)
    assert read_measured(path) == stack
    assert [p.name for p in path.parent.iterdir()] == ["m.json"]  # no temporary left
    figures = stack.figures()
    assert figures["int4"].classes == frozenset({"tolerant"}) and figures["fp16"].classes is None
    assert figures["int4"].quality_for("code") == 0.4 and figures["int4"].tpot_s == 0.03


def test_no_file_is_none_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    assert read_measured(tmp_path / "absent.json") is None
    bad = tmp_path / "bad.json"
    for text in ("{", '{"reference": "fp16"}', "[]"):
        bad.write_text(text)
        with pytest.raises(MeasuredError) as info:
            read_measured(bad)
        assert str(info.value).startswith(f"{bad}: not a measurement file written by up: ")
        assert "\n" not in str(info.value)
