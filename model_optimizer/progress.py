"""Progress of the CLI's long steps, for a person at a terminal or for a log (I/O: a stream).

On a terminal (the stream's ``isatty()``, i.e. ``sys.stderr.isatty()`` for the CLI) a step is
one tqdm bar redrawn in place. Anywhere else (a log file, a pipe, CI) it is a few whole lines,
so a log reads top to bottom without carriage returns:

- ``optimize``: the optimizer (a child process in the optimize env, its stdout piped to us)
  reports every quantized layer as ``optimize: [int4] quantize 17/210 <layer>``.
  ``StepRelay`` turns those into one bar per stage, or into lines at 25%, 50% and 75% and a
  ``done in Ns`` line; every other line passes through unchanged. The child cannot draw the
  bar itself: its stdout is our pipe and its stderr a log file, neither is the terminal.
- ``up``: ``TierStarts`` takes the supervisor's once-a-second ticks while tiers start, as one
  bar over the tiers, or as ``up: tier fp16 starting`` then ``up: tier fp16 ready in 43s``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

# "<who>: [<variant>] <stage> <done>/<total> <item>", e.g. a layer GPTQ has just quantized.
STEP = re.compile(
    r"^(?P<label>\S+: \[[^\]]+\] \w+) (?P<done>\d+)/(?P<total>\d+)(?: (?P<item>.*))?$"
)
QUARTERS = (25, 50, 75)
UNITS = {"quantize": "layer"}

Clock = Callable[[], float]


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


@dataclass
class _Stage:
    label: str
    total: int
    started: float
    bar: Any = None  # a tqdm bar, on a terminal
    next_quarter: int = QUARTERS[0]


class StepRelay:
    """Copy a child's report lines to ``stream``, condensing its step lines (see the module)."""

    def __init__(
        self, stream: TextIO, terminal: bool | None = None, clock: Clock = time.monotonic
    ) -> None:
        self._stream = stream
        self._terminal = is_terminal(stream) if terminal is None else terminal
        self._clock = clock
        self._stage: _Stage | None = None
        self._announced = clock()  # when the last other line came: the next stage's start

    def feed(self, line: str) -> None:
        text = line.rstrip("\n")
        match = STEP.match(text)
        if match is None:
            self.close()
            self._write(text)
            self._announced = self._clock()
            return
        label, done, total = match["label"], int(match["done"]), int(match["total"])
        stage = self._stage
        if stage is None or stage.label != label or stage.total != total:
            self.close()
            stage = self._stage = self._open(label, total)
        if stage.bar is not None:
            stage.bar.update(done - stage.bar.n)
            stage.bar.set_postfix_str(match["item"] or "", refresh=True)
        elif done < total:
            percent = done * 100 // total
            if percent >= stage.next_quarter:
                self._write(f"{label} {done}/{total} ({percent}%) after {self._seconds(stage)}")
                stage.next_quarter = (percent // 25 + 1) * 25
        if done >= total:
            if stage.bar is not None:
                stage.bar.set_postfix_str("", refresh=True)
            else:
                self._write(f"{label} {done}/{total} done in {self._seconds(stage)}")
            self.close()

    def close(self) -> None:
        """End the current stage's bar (left on screen as it stands), if any."""
        stage, self._stage = self._stage, None
        if stage is not None and stage.bar is not None:
            stage.bar.close()

    def _open(self, label: str, total: int) -> _Stage:
        stage = _Stage(label, total, self._announced)
        if self._terminal:
            unit = UNITS.get(label.rsplit(" ", 1)[-1], "step")
            stage.bar = tqdm(
                total=total, desc=label, unit=unit, file=self._stream, dynamic_ncols=True
            )
        return stage

    def _seconds(self, stage: _Stage) -> str:
        return f"{self._clock() - stage.started:.0f}s"

    def _write(self, text: str) -> None:
        print(text, file=self._stream, flush=True)


class TierStarts:
    """``with TierStarts(stderr, total=3) as starts: supervisor.start_all(on_tick=starts.tick)``.

    The supervisor starts tiers one after another and ticks about once a second while one is
    not healthy yet (``name``, seconds since its process started); a tier is ready (healthy and
    warmed up) when the next one ticks or the block ends without an error.
    """

    def __init__(
        self,
        stream: TextIO,
        total: int,
        terminal: bool | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._stream = stream
        self._total = total
        self._terminal = is_terminal(stream) if terminal is None else terminal
        self._clock = clock
        self._bar: Any = None
        self._current: tuple[str, float] | None = None  # tier starting, when it started
        self._seen = 0

    def __enter__(self) -> TierStarts:
        if self._terminal:
            self._bar = tqdm(
                total=self._total, desc="up: tiers", unit="tier", file=self._stream, leave=True
            )
        return self

    def tick(self, name: str, elapsed: float) -> None:
        now = self._clock()
        if self._current is None or self._current[0] != name:
            self._ready(now)
            self._current = (name, now - elapsed)
            self._seen += 1
            if self._bar is None:
                self._write(f"up: tier {name} starting")
        if self._bar is not None:
            self._bar.set_description(f"up: tier {name} starting", refresh=False)
            self._bar.set_postfix_str(f"{elapsed:.0f}s", refresh=False)
            self._bar.update(self._seen - 1 - self._bar.n)
            self._bar.refresh()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self._ready(self._clock())
        if self._bar is not None:
            if kind is None:
                self._bar.set_description("up: tiers ready", refresh=False)
                self._bar.set_postfix_str("", refresh=False)
                self._bar.update(self._total - self._bar.n)
            self._bar.close()

    def _ready(self, now: float) -> None:
        if self._current is not None and self._bar is None:
            name, started = self._current
            self._write(f"up: tier {name} ready in {now - started:.0f}s")
        self._current = None

    def _write(self, text: str) -> None:
        print(text, file=self._stream, flush=True)
