"""A GGUF variant's folder, written whole: ``model.gguf``, the tokenizer files the gateway counts
with, ``generation_config.json`` (the sampling defaults llama-server is started with),
``layout.json``, ``kv_cache_config.json`` and ``metadata.json``; staged and renamed, so it is
complete or absent. Optimize environment.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.variant_folder import METADATA, failed_report_path
from optimizer import artifacts
from optimizer.artifacts import InputKey
from optimizer.gguf_layout import gguf_layout
from optimizer.gguf_plan import GGUF_FILE
from optimizer.kvcache import kv_cache_config, kv_dtype_bytes
from optimizer.pipeline import Job, Progress, VariantResult

FORMAT = "gguf"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
)


@dataclass(frozen=True)
class Made:
    """One variant's GGUF as built: its file, type, check, how it was chosen, its overrides."""

    file: Path
    file_type: str
    check: dict[str, Any]
    choice: dict[str, Any] | None
    overrides: dict[str, str]


def write_variant(
    job: Job,
    variant: str,
    key: InputKey,
    made: Made,
    names: Mapping[str, str],
    started: float,
    say: Progress,
) -> VariantResult:
    """The variant's folder, staged and renamed; a failed check leaves only its report."""
    final = job.outputs[variant]
    file, file_type, check = made.file, made.file_type, made.check
    metadata: dict[str, Any] = {}
    try:
        with artifacts.staging(final) as folder:
            shutil.copyfile(file, folder / GGUF_FILE)
            for name in TOKENIZER_FILES:
                if (job.model_dir / name).is_file():
                    shutil.copyfile(job.model_dir / name, folder / name)
            layout = gguf_layout(folder / GGUF_FILE, names, file_type)
            (folder / "layout.json").write_text(layout.to_json())
            config = json.loads((job.model_dir / "config.json").read_text())
            kv = job.recipe.kv_cache
            # llama.cpp keeps its KV cache in F16 (2 bytes), whatever the weights.
            kv_config = kv_cache_config(config, kv, kv_dtype_bytes("auto", {"dtype": "float16"}))
            artifacts.write_json(folder / "kv_cache_config.json", json.loads(kv_config.to_json()))
            metadata = metadata_for(job, variant, key, made, layout, folder)
            metadata["durations_s"] = {"build_and_check": round(time.monotonic() - started, 2)}
            artifacts.write_json(folder / METADATA, metadata)
            if not check["passed"]:
                raise _Discard()
    except _Discard:
        artifacts.write_json(failed_report_path(final), metadata)
        say(f"[{variant}] {check['message'].splitlines()[0]}")
        return VariantResult(variant, final, skipped=False, passed=False, metadata=metadata)
    report = check["report"]
    say(
        f"[{variant}] ok: {file_type}, kl {report['mean_kl']:.4f}, top-1 {report['top1']:.3f}, "
        f"{metadata['sizes']['variant_bytes'] / 1e6:.0f} MB"
    )
    return VariantResult(variant, final, skipped=False, passed=True, metadata=metadata)


class _Discard(Exception):
    """Leave the staging folder behind unrenamed (it is removed)."""


def metadata_for(
    job: Job, variant: str, key: InputKey, made: Made, layout: Any, folder: Path
) -> dict[str, Any]:
    return {
        "variant": variant,
        "passed": made.check["passed"],
        "format": FORMAT,
        "file": GGUF_FILE,
        "input_key": {**key.as_dict(), "digest": key.digest()},
        "source": {
            "kind": job.source.kind,
            "path": str(job.source.path),
            "name": job.source.name,
            "fingerprint": key.source_fingerprint,
        },
        "recipe": {"path": job.recipe_path, "hash": key.recipe_hash},
        "target": {"framework": key.target_framework, "compile_level": None},
        "precision": {
            "variant": variant,
            "ggml_type": made.file_type,
            "layers": layout.summary.by_precision,
            "group_size": None,
            "overrides": made.overrides,
        },
        "gguf_choice": made.choice,
        "check": made.check,
        "sizes": {"variant_bytes": artifacts.folder_bytes(folder)},
        "tool_versions": dict(key.tool_versions),
    }
