"""layout.json for a GGUF variant: every linear layer's GGML type, block size and bytes.

The same shape as a safetensors variant's layout (optimizer/layout.py), read from the GGUF
file's tensor table with gguf-py (optimize environment). Layers carry the Hugging Face module
names of the original model (the recipe's and the precision check's names); ``format`` is the
GGML type (``Q4_0`` ...), ``group_size`` its block (32 weights; 256 for the K-quants).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from optimizer.gguf_plan import is_quantized_type, precision_of
from optimizer.gguf_table import TableEntry, read_table
from optimizer.layout import LayerLayout, Layout, LayoutSummary

# Types that store a per-block minimum beside the scale (asymmetric); the others scale only.
_WITH_MINIMUM = ("Q4_1", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K")


def gguf_layout(path: Path, modules: Mapping[str, str], file_type: str) -> Layout:
    """The layout of the GGUF at ``path``; ``modules`` maps GGUF tensor names (without
    ``.weight``) to module names. Tensors of no module (norms, embeddings) are left out, as in
    a safetensors layout; a tied output (no ``output.weight``) is listed as a tied lm_head."""
    tensors = {t.name: t for t in read_table(path).tensors}
    layers: list[LayerLayout] = []
    for name, tensor in tensors.items():
        base = name.removesuffix(".weight")
        module = modules.get(base)
        if module is None or not name.endswith(".weight") or len(tensor.shape) != 2:
            continue
        if base == "token_embd":
            continue
        layers.append(_layer(module, name, tensor))
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        embed = modules.get("token_embd", "model.embed_tokens")
        tied = _layer("lm_head", "token_embd.weight", tensors["token_embd.weight"])
        layers.append(LayerLayout(**{**tied.__dict__, "bytes": 0, "tensors": [], "tied_to": embed}))
    by_precision: dict[str, int] = {}
    for layer in layers:
        by_precision[layer.precision] = by_precision.get(layer.precision, 0) + 1
    return Layout(
        quant_method="gguf",
        format=file_type,
        compressed_tensors_version=None,
        layers=layers,
        summary=LayoutSummary(
            layers=len(layers),
            by_precision=dict(sorted(by_precision.items())),
            weight_bytes=sum(layer.bytes for layer in layers),
            checkpoint_bytes=path.stat().st_size,
        ),
    )


def type_name(type_id: int) -> str:
    import gguf  # optimize env only

    return str(gguf.GGMLQuantizationType(type_id).name)


def tensor_bytes(entry: TableEntry) -> int:
    """A tensor's bytes: its elements in blocks of its type."""
    import gguf  # optimize env only

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(entry.type_id)]
    elements = 1
    for n in entry.shape:
        elements *= n
    return elements // int(block) * int(size)


def _layer(module: str, name: str, tensor: TableEntry) -> LayerLayout:
    import gguf  # optimize env only

    kind = type_name(tensor.type_id)
    block = int(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor.type_id)][0])
    quantized = is_quantized_type(kind)
    columns, rows = tensor.shape  # GGUF lists the fastest-moving dimension first
    nbytes = tensor_bytes(tensor)
    return LayerLayout(
        name=module,
        precision=precision_of(kind),
        format=kind,
        group_size=block if quantized else None,
        strategy="block" if quantized else None,
        symmetric=(not kind.startswith(_WITH_MINIMUM)) if quantized else None,
        dtype=kind,
        packed_shape=[rows, nbytes // rows],
        shape=[rows, columns],
        bytes=nbytes,
        tensors=[name],
    )
