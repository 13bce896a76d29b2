"""layout.json: every linear layer of a written variant, read back from the files without torch.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``name -> {dtype, shape, data_offsets}``) and the data; sharded checkpoints add
``model.safetensors.index.json``. ``config.json``'s ``quantization_config`` (compressed-tensors)
says each layer's format, bit width, strategy and group size.

What counts as a linear layer: a module ``M`` with a 2-D ``M.weight`` or a ``M.weight_packed``
whose name has no dotted segment containing ``embed`` (so ``model.embed_tokens`` is left out,
norms are 1-D). A tied ``lm_head`` (``tie_word_embeddings`` and no ``lm_head`` tensor) is listed
with ``tied_to`` and no bytes of its own.

Layouts compressed-tensors 0.19 writes (observed on SmolLM2-135M):

* pack-quantized int4 (W4A16, group 64): ``M.weight_packed`` I32 ``[out, in/8]``,
  ``M.weight_scale`` BF16 ``[out, in/64]``, ``M.weight_shape`` I64 ``[2]`` holding ``[out, in]``;
* int-quantized int8 (W8A8): ``M.weight`` I8 ``[out, in]``, ``M.weight_scale`` BF16 ``[out, 1]``;
* dense: ``M.weight`` BF16/F16/F32 ``[out, in]``.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LAYOUT_VERSION = 1
_MAX_HEADER = 100 << 20
_INDEX = "model.safetensors.index.json"
_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
_FLOAT_PRECISION = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
_INT_BYTES = {"I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8}
_WEIGHT_SUFFIXES = ("weight", "weight_packed")


class LayoutError(ValueError):
    """A variant folder whose weights cannot be read; one line naming the file."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry; ``start``/``end`` are absolute byte offsets in ``file``."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class LayerLayout:
    name: str
    precision: str
    format: str
    group_size: int | None
    strategy: str | None
    symmetric: bool | None
    dtype: str
    packed_shape: list[int]
    shape: list[int]
    bytes: int
    tensors: list[str]
    activations: str | None = None
    tied_to: str | None = None


@dataclass(frozen=True)
class LayoutSummary:
    layers: int
    by_precision: dict[str, int]
    weight_bytes: int
    checkpoint_bytes: int


@dataclass(frozen=True)
class Layout:
    quant_method: str | None
    format: str | None
    compressed_tensors_version: str | None
    layers: list[LayerLayout]
    summary: LayoutSummary
    version: int = LAYOUT_VERSION
    ignore: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


# --------------------------------------------------------------------------- safetensors


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor entries of one ``.safetensors`` file (``__metadata__`` dropped)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise LayoutError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(_MAX_HEADER, size - 8):
                raise LayoutError(f"{path}: corrupt safetensors header (length {length})")
            raw = fh.read(length)
    except OSError as exc:
        raise LayoutError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise LayoutError(f"{path}: corrupt safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise LayoutError(f"{path}: corrupt safetensors header: not a JSON object")
    base = 8 + length
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(entry["dtype"])
            shape = tuple(int(d) for d in entry["shape"])
            start, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise LayoutError(f"{path}: corrupt safetensors entry for {name!r}") from None
        if not 0 <= start <= end or base + end > size:
            raise LayoutError(f"{path}: {name!r} lies outside the file")
        out[name] = TensorInfo(path, dtype, shape, base + start, base + end)
    return out


def read_checkpoint(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of a variant folder: one file, an index of shards, or all ``*.safetensors``."""
    index = folder / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({str(f) for f in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LayoutError(f"{index}: unreadable shard index: {exc}") from None
        paths = [folder / name for name in files]
    else:
        paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise LayoutError(f"{folder}: no safetensors weights")
    tensors: dict[str, TensorInfo] = {}
    for path in paths:
        for name, info in read_safetensors_header(path).items():
            if name in tensors:
                raise LayoutError(f"{path}: tensor {name!r} also in {tensors[name].file.name}")
            tensors[name] = info
    return tensors


def read_int_values(info: TensorInfo) -> list[int]:
    """The values of a small integer tensor (e.g. ``weight_shape``), read from the data."""
    if info.dtype not in _INT_BYTES or info.nbytes > 1024:
        raise LayoutError(f"{info.file}: cannot read {info.dtype} tensor of {info.nbytes} bytes")
    width = _INT_BYTES[info.dtype]
    code = {1: "b", 2: "h", 4: "i", 8: "q"}[width]
    code = code.upper() if info.dtype.startswith("U") else code
    with info.file.open("rb") as fh:
        fh.seek(info.start)
        raw = fh.read(info.nbytes)
    if len(raw) != info.nbytes or info.nbytes % width:
        raise LayoutError(f"{info.file}: truncated tensor data")
    return list(struct.unpack(f"<{info.nbytes // width}{code}", raw))


# --------------------------------------------------------------------------- layers


def _natural(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p]


def _is_embedding(module: str) -> bool:
    return any("embed" in segment for segment in module.split("."))


def linear_modules(tensors: Mapping[str, TensorInfo]) -> list[str]:
    """Names of the linear layers (see the module docstring), sorted with numbers as numbers.

    Headers do not keep the model's module order, so ``layers.2`` comes before ``layers.10``
    and ``mlp`` before ``self_attn``.
    """
    found: set[str] = set()
    for name, info in tensors.items():
        module, _, leaf = name.rpartition(".")
        if not module or _is_embedding(module):
            continue
        if (leaf == "weight" and len(info.shape) == 2) or leaf == "weight_packed":
            found.add(module)
    return sorted(found, key=_natural)


def _target_matches(target: str, module: str) -> bool:
    # compressed-tensors' rule: "re:" is re.match, a class name (no dot, capitalised) matches
    # every layer of that class, which for the layers listed here means "Linear".
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    if "." not in target and target[:1].isupper():
        return target.endswith("Linear")
    return target == module


def _group_for(
    module: str, quant: Mapping[str, Any]
) -> tuple[Mapping[str, Any] | None, str | None]:
    """The config group quantizing ``module`` and its format, or ``(None, None)``."""
    ignore = [str(t) for t in quant.get("ignore") or []]
    if any(_target_matches(t, module) for t in ignore):
        return None, None
    groups = quant.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, Mapping) else []:
        if isinstance(group, Mapping) and any(
            _target_matches(str(t), module) for t in group.get("targets") or []
        ):
            fmt = group.get("format") or quant.get("format")
            return group, str(fmt) if fmt else None
    return None, None


def _layer(module: str, tensors: Mapping[str, TensorInfo], quant: Mapping[str, Any]) -> LayerLayout:
    own = {
        name.rpartition(".")[2]: info
        for name, info in tensors.items()
        if name.rpartition(".")[0] == module
    }
    packed = own.get("weight_packed")
    stored = packed if packed is not None else own["weight"]
    group, fmt = _group_for(module, quant)
    weights: Mapping[str, Any] = (group or {}).get("weights") or {}
    bits = weights.get("num_bits")
    strategy = weights.get("strategy")
    symmetric = weights.get("symmetric")
    shape = list(stored.shape)
    if packed is not None:
        shape = _logical_shape(module, packed, own.get("weight_shape"), bits)
        bits = bits or _packed_bits(packed, shape)
        precision = f"int{bits}"
        fmt = fmt or "pack-quantized"
    elif stored.dtype in _FLOAT_PRECISION:
        precision, fmt, strategy, symmetric = _FLOAT_PRECISION[stored.dtype], "dense", None, None
    elif stored.dtype.startswith("F8"):
        precision, fmt = "fp8", fmt or "float-quantized"
    elif stored.dtype in ("I8", "U8"):
        precision, fmt = f"int{bits or 8}", fmt or "int-quantized"
    else:
        raise LayoutError(f"{module}: unexpected weight dtype {stored.dtype}")
    group_size = weights.get("group_size") if strategy == "group" else None
    scale = own.get("weight_scale")
    if group_size is None and precision.startswith("int") and scale is not None:
        cols = scale.shape[1] if len(scale.shape) == 2 else 1
        group_size = shape[1] // cols if 1 < cols < shape[1] and shape[1] % cols == 0 else None
    return LayerLayout(
        name=module,
        precision=precision,
        format=fmt,
        group_size=int(group_size) if group_size is not None else None,
        strategy=str(strategy) if strategy is not None else None,
        symmetric=bool(symmetric) if symmetric is not None else None,
        dtype=_DTYPES.get(stored.dtype, stored.dtype),
        packed_shape=list(stored.shape),
        shape=shape,
        bytes=sum(info.nbytes for info in own.values()),
        tensors=sorted(own),
        activations=None if fmt == "dense" else _activations(group),
    )


def _activations(group: Mapping[str, Any] | None) -> str | None:
    """``"int8 token dynamic"`` for W8A8's input activations; ``None`` when weight-only."""
    spec = (group or {}).get("input_activations")
    if not isinstance(spec, Mapping) or not spec.get("num_bits"):
        return None
    kind = "fp" if spec.get("type") == "float" else "int"
    parts = [f"{kind}{spec['num_bits']}", str(spec.get("strategy") or "tensor")]
    parts.append("dynamic" if spec.get("dynamic") else "static")
    return " ".join(parts)


def _packed_bits(packed: TensorInfo, shape: Sequence[int]) -> int:
    """Bits per value of an int32-packed weight without a config group: its width tells."""
    for bits in (4, 8, 2):
        if len(packed.shape) == 2 and packed.shape[1] == -(-shape[1] * bits // 32):
            return bits
    raise LayoutError(f"cannot tell the bit width of a {list(packed.shape)} packed weight")


def _logical_shape(
    module: str, packed: TensorInfo, weight_shape: TensorInfo | None, bits: Any
) -> list[int]:
    if weight_shape is not None:
        values = read_int_values(weight_shape)
        if len(values) == 2 and all(v > 0 for v in values):
            return values
        raise LayoutError(f"{module}.weight_shape: expected [out, in], found {values}")
    if len(packed.shape) != 2 or packed.dtype != "I32":
        raise LayoutError(f"{module}.weight_packed: expected a 2-D int32 tensor")
    per_word = 32 // int(bits) if bits else 8
    return [packed.shape[0], packed.shape[1] * per_word]


def _tied_lm_head(
    modules: Sequence[str], tensors: Mapping[str, TensorInfo], config: Mapping[str, Any]
) -> LayerLayout | None:
    if config.get("tie_word_embeddings") is not True or any(
        m == "lm_head" or m.endswith(".lm_head") for m in modules
    ):
        return None
    embeddings = [
        name
        for name, info in tensors.items()
        if name.endswith(".weight") and _is_embedding(name) and len(info.shape) == 2
    ]
    vocab = config.get("vocab_size")
    chosen = [n for n in embeddings if tensors[n].shape[0] == vocab] or embeddings
    if not chosen:
        return None
    source = sorted(chosen, key=_natural)[0]
    info = tensors[source]
    return LayerLayout(
        name="lm_head",
        precision=_FLOAT_PRECISION.get(info.dtype, _DTYPES.get(info.dtype, info.dtype)),
        format="dense",
        group_size=None,
        strategy=None,
        symmetric=None,
        dtype=_DTYPES.get(info.dtype, info.dtype),
        packed_shape=list(info.shape),
        shape=list(info.shape),
        bytes=0,
        tensors=[],
        tied_to=source.removesuffix(".weight"),
    )


def build_layout(folder: str | Path) -> Layout:
    """Read ``folder``'s config.json and safetensors headers into a ``Layout``."""
    folder = Path(folder)
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise LayoutError(f"{config_path}: unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise LayoutError(f"{config_path}: not a JSON object")
    quant = config.get("quantization_config") or {}
    if not isinstance(quant, dict):
        raise LayoutError(f"{config_path}: quantization_config is not an object")
    tensors = read_checkpoint(folder)
    modules = linear_modules(tensors)
    layers = [_layer(module, tensors, quant) for module in modules]
    tied = _tied_lm_head(modules, tensors, config)
    if tied is not None:
        layers = sorted([*layers, tied], key=lambda layer: _natural(layer.name))
    by_precision: dict[str, int] = {}
    for layer in layers:
        by_precision[layer.precision] = by_precision.get(layer.precision, 0) + 1
    summary = LayoutSummary(
        layers=len(layers),
        by_precision=dict(sorted(by_precision.items())),
        weight_bytes=sum(layer.bytes for layer in layers),
        checkpoint_bytes=sum(info.nbytes for info in tensors.values()),
    )
    version = quant.get("version")
    return Layout(
        quant_method=quant.get("quant_method"),
        format=quant.get("format"),
        compressed_tensors_version=str(version) if version is not None else None,
        layers=layers,
        summary=summary,
        ignore=[str(t) for t in quant.get("ignore") or []],
    )


def write_layout(folder: str | Path) -> Path:
    """Build the layout of ``folder`` and write ``folder/layout.json``."""
    folder = Path(folder)
    target = folder / "layout.json"
    target.write_text(build_layout(folder).to_json())
    return target
