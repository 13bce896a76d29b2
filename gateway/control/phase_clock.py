"""Where a reset spends its time: seconds per named phase, the running one included."""

from __future__ import annotations

import time


class PhaseClock:
    """Seconds spent per phase of one reset; ``stop`` also counts the phase still running."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._running: tuple[str, float] | None = None

    def begin(self, name: str) -> None:
        self.stop()
        self._running = (name, time.monotonic())

    def stop(self) -> dict[str, float]:
        if self._running is not None:
            name, started = self._running
            self.spent[name] = time.monotonic() - started
            self._running = None
        return dict(self.spent)
