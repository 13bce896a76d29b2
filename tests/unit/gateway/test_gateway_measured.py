"""gateway/measured.py: the file up writes with what it measured."""

from __future__ import annotations

import json
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


def test_per_prompt_samples_and_the_emulated_flag_reach_the_derivation(tmp_path: Path) -> None:
    sampled = INT4.model_copy(
        update={"ttfts_s": [0.2, None, 0.21], "tpots_s": [0.03, 0.031, None], "emulated": True}
    )
    stack = MeasuredStack(
        written_at="2026-12-06T03:00:00+00:00",
        gateway_port=8000,
        reference="fp16",
        tiers={"fp16": FP16, "int4": sampled},
    )
    path = tmp_path / "m.json"
    write_measured(path, stack)
    figures = read_measured(path).figures()  # type: ignore[union-attr]
    assert figures["int4"].ttfts_s == (0.2, None, 0.21)
    assert figures["int4"].tpots_s == (0.03, 0.031, None)
    assert figures["int4"].emulated and not figures["fp16"].emulated
    assert figures["fp16"].ttfts_s == ()


def test_a_file_written_before_samples_were_kept_still_loads(tmp_path: Path) -> None:
    old = {
        "written_at": "2026-12-03T10:00:00+00:00",
        "gateway_port": 8000,
        "reference": "fp16",
        "tiers": {
            name: {"quality": {"chat": 1.0}, "ttft_s": 0.1, "tpot_s": 0.02, "throughput_tok_s": 50}
            for name in ("fp16", "int8")
        },
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    figures = read_measured(path).figures()  # type: ignore[union-attr]
    assert figures["int8"].ttfts_s == () and not figures["int8"].emulated
    assert figures["int8"].tpot_s == 0.02
