"""Seconds per phase of a reset (gateway/control/phase_clock.py)."""

from __future__ import annotations

import time

from gateway.control.phase_clock import PhaseClock


def test_each_phase_ends_when_the_next_begins_and_stop_counts_the_running_one() -> None:
    clock = PhaseClock()
    assert clock.stop() == {}  # nothing begun, nothing spent
    clock.begin("drain")
    time.sleep(0.02)
    clock.begin("reset")
    time.sleep(0.01)
    spent = clock.stop()  # the reset phase never finished on its own: counted anyway
    assert list(spent) == ["drain", "reset"]
    assert spent["drain"] >= 0.02 and spent["reset"] >= 0.01
    assert clock.stop() == spent  # a second stop changes nothing
