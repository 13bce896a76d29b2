"""Held-aside probe prompts for the precision check (chat, code, math).

The shipped set lives in ``optimizer/data/probes.jsonl``, one JSON object a line:
``{"category": ..., "text": ..., "source": ...}``. Sources and licenses are in
``optimizer/data/LICENSES.md``. Calibration data must not contain these texts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PROBES = Path(__file__).parent / "data" / "probes.jsonl"


class ProbeError(ValueError):
    """A probe file that cannot be used; the message is one line naming file and line."""


@dataclass(frozen=True)
class Probe:
    """One probe prompt: its category (chat, code, math, ...) and its plain text."""

    category: str
    text: str
    source: str = ""


def parse_probe(line: str, where: str) -> Probe:
    """One JSONL line as a Probe; ``where`` (file:line) names it in errors."""
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise ProbeError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(row, dict):
        raise ProbeError(f"{where}: expected a JSON object")
    for field in ("category", "text"):
        value = row.get(field)
        if not isinstance(value, str) or not value.strip():
            raise ProbeError(f"{where}: field {field!r} must be a non-empty string")
    source = row.get("source", "")
    return Probe(row["category"], row["text"], source if isinstance(source, str) else "")


def load_probes(path: str | Path | None = None) -> list[Probe]:
    """Read probes from ``path`` (default: the shipped set), skipping blank lines."""
    file = Path(path) if path is not None else DEFAULT_PROBES
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ProbeError(f"cannot read probes: {file}: {exc.strerror or exc}") from exc
    probes = [
        parse_probe(line, f"{file}:{number}")
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not probes:
        raise ProbeError(f"no probes in {file}")
    return probes
