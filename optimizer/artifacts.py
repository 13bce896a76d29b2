"""Variant folders on disk: the output-folder rules, the input key, atomic writes, metadata.

A variant folder is complete or absent: it is written under a temporary name beside its final
place and renamed when everything (weights, tokenizer, layout.json, kv_cache_config.json,
metadata.json) is in it. Standard library only, so the CLI can validate before any torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.variant_folder import FAILED_SUFFIX, METADATA, failed_report_path

TMP_PREFIX = ".tmp-"


class OutputError(ValueError):
    """An output folder we must not write into; one line naming it."""


@dataclass(frozen=True)
class InputKey:
    """Everything that decides a variant's bytes. Equal keys mean the variant is up to date."""

    source_fingerprint: str
    recipe_hash: str
    variant: str
    tool_versions: Mapping[str, str]
    target_framework: str
    compile_level: int

    def digest(self) -> str:
        payload = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {
            "source_fingerprint": self.source_fingerprint,
            "recipe_hash": self.recipe_hash,
            "variant": self.variant,
            "tool_versions": dict(sorted(self.tool_versions.items())),
            "target_framework": self.target_framework,
            "compile_level": self.compile_level,
        }


def is_variant_folder(path: Path) -> bool:
    """A folder this tool wrote: it has our metadata.json with an input key."""
    meta = path / METADATA
    if not meta.is_file():
        return False
    try:
        return "input_key" in json.loads(meta.read_text())
    except (OSError, ValueError):
        return False


def check_output(output: Path, variant_dirs: Mapping[str, Path]) -> None:
    """Refuse an output folder that holds anything but our own variants (nothing is written).

    ``variant_dirs`` maps variant name to its final folder: ``output/NAME`` for a recipe run,
    ``output`` itself for the single-variant form.
    """
    if output.exists() and not output.is_dir():
        raise OutputError(f"output {output} exists and is not a folder")
    if not output.exists():
        if not output.parent.exists():
            raise OutputError(f"output's parent folder {output.parent} does not exist")
        return
    ours = {p.resolve() for p in variant_dirs.values()}
    if output.resolve() in ours:
        if any(output.iterdir()) and not is_variant_folder(output):
            raise OutputError(f"output {output} exists with other content; choose an empty folder")
        return
    for entry in output.iterdir():
        name = entry.name
        if entry.resolve() in ours and (is_variant_folder(entry) or not any(entry.iterdir())):
            continue
        if name.startswith(TMP_PREFIX) or name.endswith(f"{FAILED_SUFFIX}.json"):
            continue  # our own leftovers from an interrupted or failed run
        raise OutputError(
            f"output {output} exists with other content ({name}); choose an empty folder"
        )


def up_to_date(folder: Path, key: InputKey) -> bool:
    """True when ``folder`` holds a variant built from exactly ``key`` that passed its check."""
    if not is_variant_folder(folder):
        return False
    meta = json.loads((folder / METADATA).read_text())
    return bool(meta.get("input_key", {}).get("digest") == key.digest() and meta.get("passed"))


@contextmanager
def staging(final: Path) -> Iterator[Path]:
    """A temporary folder beside ``final``; on success it replaces ``final`` in one rename.

    On any exception the temporary folder is removed: nothing half-written is left behind.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}-", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        if final.exists():
            # Replace an outdated variant: move it aside first so the swap is quick.
            old = final.with_name(f"{TMP_PREFIX}{final.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        failed = failed_report_path(final)
        if failed.exists():
            failed.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON through a temporary file and rename (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def folder_bytes(folder: Path) -> int:
    """Total size of the files in ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
