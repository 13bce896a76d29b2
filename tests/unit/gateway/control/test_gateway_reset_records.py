"""The shapes the reset coordinator keeps in shared state, read back leniently."""

from __future__ import annotations

import pytest

from gateway.control.reset_records import Forced, int_or, number


def test_a_queued_reset_now_round_trips() -> None:
    for forced in (Forced("int4", 1_800_000_000.5), Forced("int4", 1.8e9, 1.9e9)):
        assert Forced.decode(forced.encode(), now=2e9) == forced
    assert Forced("int4", 5.0, bare=True).encode() == "int4"  # as an older replica wrote it


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("int8", Forced("int8", 7.0, bare=True)),  # an older replica queued the bare name
        ('{"tier": "int8"}', Forced("int8", 7.0)),  # no time: asked now
        ('{"tier": "int8", "asked_at": "soon"}', Forced("int8", 7.0)),
        ('{"tier": 5}', Forced('{"tier": 5}', 7.0, bare=True)),  # no known tier matches
        ("[1, 2]", Forced("[1, 2]", 7.0, bare=True)),
        ('{"tier": "int8", "asked_at": 5, "refused_at": 6}', Forced("int8", 5.0, 6.0)),
        ('{"tier": "int8", "asked_at": 5, "refused_at": "x"}', Forced("int8", 5.0, 7.0)),
        ('{"tier": "int8", "asked_at": 5}', Forced("int8", 5.0)),
        ('{"tier": "int8", "asked_at": 99}', Forced("int8", 7.0)),  # a clock ahead: now
        ('{"tier": "int8", "asked_at": Infinity}', Forced("int8", 7.0)),
        ('{"tier": "int8", "asked_at": NaN}', Forced("int8", 7.0)),
    ],
)
def test_queued_values_are_read_leniently(raw: str, expected: Forced) -> None:
    assert Forced.decode(raw, now=7.0) == expected


def test_numbers_read_back_from_shared_state() -> None:
    assert (int_or(3, 0), int_or(True, 0), int_or("3", 9)) == (3, 0, 9)
    assert (number(2), number(2.5), number(False), number(None)) == (2.0, 2.5, 0.0, 0.0)
