"""The shared record of measured figures: parsed or refused (logged once), merged per run."""

from __future__ import annotations

import logging

import pytest

from gateway.config import MeasuredTier
from gateway.control.figures_record import EndpointRecord, FiguresRecord, RecordParser, merge


def tier(tpot: float, quality: float = 1.0) -> MeasuredTier:
    return MeasuredTier(
        quality={"chat": quality, "code": quality, "math": quality},
        ttft_s=0.1,
        tpot_s=tpot,
        throughput_tok_s=50.0,
    )


def record(**tiers: MeasuredTier) -> FiguresRecord:
    return FiguresRecord(
        written_at=100.0, replica="a", token=3, reference="fp16", tiers=dict(tiers)
    )


def test_a_record_round_trips_through_its_text() -> None:
    first = record(fp16=tier(0.05), int8=tier(0.03, 0.9))
    assert RecordParser().parse(first.model_dump_json()) == first


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"written_at": 1}',
        '{"written_at": 1, "replica": "a", "token": -1, "reference": "fp16", "tiers": {}}',
        '{"written_at": 1, "replica": "a", "token": 1, "reference": "fp16", "tiers": '
        '{"int8": {"quality": {}, "ttft_s": -1, "tpot_s": 0, "throughput_tok_s": 0}}}',
    ],
)
def test_a_text_that_does_not_parse_is_no_record_and_is_logged_once(
    text: str, caplog: pytest.LogCaptureFixture
) -> None:
    parser = RecordParser()
    with caplog.at_level(logging.WARNING):
        assert parser.parse(text) is None
        assert parser.parse(text) is None
    assert len([r for r in caplog.records if "do not parse" in r.getMessage()]) == 1


def test_a_run_replaces_its_tiers_and_endpoints_and_keeps_the_others() -> None:
    old = FiguresRecord(
        written_at=1.0,
        replica="a",
        token=1,
        reference="fp16",
        tiers={"fp16": tier(0.05), "int8": tier(0.03), "int4": tier(0.02)},
        classes={"int4": ["tolerant"]},
        endpoints=[EndpointRecord(tier=t, url=f"http://{t}", at=1.0) for t in ("fp16", "int4")],
    )
    new = merge(
        old,
        reference="fp16",
        tiers={"fp16": tier(0.05), "int4": tier(0.04)},
        classes={"fp16": None, "int4": None},
        endpoints=[EndpointRecord(tier=t, url=f"http://{t}", at=9.0) for t in ("fp16", "int4")],
        now=9.0,
        replica="b",
        token=2,
    )
    assert new.tiers["int4"].tpot_s == 0.04 and new.tiers["int8"].tpot_s == 0.03
    assert new.classes == {}  # int4 now admitted for every class
    assert sorted((e.tier, e.at) for e in new.endpoints) == [("fp16", 9.0), ("int4", 9.0)]
    assert (new.replica, new.token, new.written_at) == ("b", 2, 9.0)
    assert not new.same_figures(old)
    assert new.same_figures(new.model_copy(update={"written_at": 50.0, "token": 7}))


def test_figures_against_another_reference_are_not_kept() -> None:
    old = record(fp16=tier(0.05), int8=tier(0.03))
    new = merge(old, reference="int8", tiers={"int8": tier(0.03)}, classes={}, endpoints=[],
                now=2.0, replica="a", token=4)  # fmt: skip
    assert list(new.tiers) == ["int8"]
