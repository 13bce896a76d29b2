"""Names in a variant folder: what the optimizer writes and the deployment spec reads.

Here, below both, so backends/ never imports the offline optimizer package. Standard library only.
"""

from __future__ import annotations

from pathlib import Path

METADATA = "metadata.json"
FAILED_SUFFIX = ".failed"


def failed_report_path(final: Path) -> Path:
    """Where a variant that failed its check leaves its metadata (no weights)."""
    return final.with_name(f"{final.name}{FAILED_SUFFIX}.json")
