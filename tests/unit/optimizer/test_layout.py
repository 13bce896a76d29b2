"""Layouts from hand-written safetensors files shaped like compressed-tensors 0.19's output."""

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from optimizer.layout import LayoutError, build_layout, read_safetensors_header, write_layout

_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "I32": 4, "I64": 8}
Tensor = tuple[str, list[int], bytes | None]  # dtype, shape, explicit data


def write_safetensors(path: Path, tensors: dict[str, Tensor]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        size = math.prod(shape) * _SIZES[dtype]
        blob = data if data is not None else bytes(size)
        assert len(blob) == size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        blobs.append(blob)
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def _config(quant: dict[str, Any] | None) -> dict[str, Any]:
    config: dict[str, Any] = {"vocab_size": 64, "tie_word_embeddings": True, "dtype": "bfloat16"}
    if quant is not None:
        config["quantization_config"] = quant
    return config


def _common(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {
        "model.embed_tokens.weight": ("BF16", [64, 128], None),
        "model.layers.0.input_layernorm.weight": ("BF16", [128], None),
        "model.norm.weight": ("BF16", [128], None),
        **tensors,
    }


def _int4_folder(tmp_path: Path) -> Path:
    quant = {
        "config_groups": {
            "group_0": {
                "format": "pack-quantized",
                "targets": ["Linear"],
                "input_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": 64,
                },
            }
        },
        "format": "pack-quantized",
        "ignore": ["lm_head"],
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "version": "0.19.0",
    }
    shape = struct.pack("<2q", 32, 128)
    tensors = _common(
        {
            # down_proj: 256 -> 128, packed 8 int4 values per int32 along the input dim
            "model.layers.0.mlp.down_proj.weight_packed": ("I32", [128, 32], None),
            "model.layers.0.mlp.down_proj.weight_scale": ("BF16", [128, 4], None),
            "model.layers.0.mlp.down_proj.weight_shape": ("I64", [2], struct.pack("<2q", 128, 256)),
            "model.layers.0.self_attn.k_proj.weight_packed": ("I32", [32, 16], None),
            "model.layers.0.self_attn.k_proj.weight_scale": ("BF16", [32, 2], None),
            "model.layers.0.self_attn.k_proj.weight_shape": ("I64", [2], shape),
        }
    )
    folder = tmp_path / "int4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config(quant)))
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def _int8_quant() -> dict[str, Any]:
    return {
        "config_groups": {
            "group_0": {
                "format": "int-quantized",
                "targets": ["Linear"],
                "input_activations": {
                    "num_bits": 8,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "token",
                    "dynamic": True,
                },
                "weights": {
                    "num_bits": 8,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "channel",
                    "group_size": None,
                },
            }
        },
        "format": "int-quantized",
        "ignore": ["lm_head"],
        "quant_method": "compressed-tensors",
        "version": "0.19.0",
    }


def test_int4_pack_quantized_layout(tmp_path: Path) -> None:
    layout = build_layout(_int4_folder(tmp_path))
    names = [layer.name for layer in layout.layers]
    assert names == ["lm_head", "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.k_proj"]
    down = layout.layers[1]
    assert down.precision == "int4"
    assert down.format == "pack-quantized"
    assert down.group_size == 64
    assert down.dtype == "int32"
    assert down.packed_shape == [128, 32]
    assert down.shape == [128, 256]  # read from weight_shape's data
    assert down.tensors == ["weight_packed", "weight_scale", "weight_shape"]
    assert down.bytes == 128 * 32 * 4 + 128 * 4 * 2 + 16
    assert down.activations is None
    head = layout.layers[0]
    assert (head.precision, head.format, head.tied_to, head.bytes) == (
        "bf16",
        "dense",
        "model.embed_tokens",
        0,
    )
    assert layout.format == "pack-quantized"
    assert layout.compressed_tensors_version == "0.19.0"
    assert layout.summary.by_precision == {"bf16": 1, "int4": 2}
    assert layout.summary.weight_bytes == down.bytes + layout.layers[2].bytes


def test_int4_without_weight_shape_or_config_is_derived(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config(None)))
    write_safetensors(
        folder / "model.safetensors",
        {
            "model.layers.0.mlp.up_proj.weight_packed": ("I32", [256, 16], None),
            "model.layers.0.mlp.up_proj.weight_scale": ("BF16", [256, 4], None),
        },
    )
    (layer,) = build_layout(folder).layers
    assert (layer.precision, layer.shape, layer.group_size) == ("int4", [256, 128], 32)


def test_int8_int_quantized_layout(tmp_path: Path) -> None:
    folder = tmp_path / "int8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config(_int8_quant())))
    write_safetensors(
        folder / "model.safetensors",
        _common(
            {
                "model.layers.0.mlp.down_proj.weight": ("I8", [128, 256], None),
                "model.layers.0.mlp.down_proj.weight_scale": ("BF16", [128, 1], None),
                "lm_head.weight": ("BF16", [64, 128], None),
            }
        ),
    )
    layout = build_layout(folder)
    assert [layer.name for layer in layout.layers] == ["lm_head", "model.layers.0.mlp.down_proj"]
    head, down = layout.layers
    assert (head.precision, head.format, head.tied_to) == ("bf16", "dense", None)
    assert head.bytes == 64 * 128 * 2
    assert down.precision == "int8"
    assert down.format == "int-quantized"
    assert (down.strategy, down.group_size, down.symmetric) == ("channel", None, True)
    assert down.dtype == "int8"
    assert down.packed_shape == down.shape == [128, 256]
    assert down.activations == "int8 token dynamic"
    assert layout.summary.by_precision == {"bf16": 1, "int8": 1}
    assert layout.summary.checkpoint_bytes == (64 * 128 * 2) * 2 + 128 * 2 * 2 + 128 * 256 + 256


def test_sharded_checkpoint_and_written_json(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    write_safetensors(
        folder / "a.safetensors", {"model.layers.0.mlp.up_proj.weight": ("F16", [8, 4], None)}
    )
    write_safetensors(folder / "b.safetensors", {"lm_head.weight": ("F16", [16, 4], None)})
    index = {
        "weight_map": {
            "model.layers.0.mlp.up_proj.weight": "a.safetensors",
            "lm_head.weight": "b.safetensors",
        }
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    data = json.loads(write_layout(folder).read_text())
    assert [layer["precision"] for layer in data["layers"]] == ["fp16", "fp16"]
    assert data["summary"] == {
        "layers": 2,
        "by_precision": {"fp16": 2},
        "weight_bytes": 8 * 4 * 2 + 16 * 4 * 2,
        "checkpoint_bytes": 8 * 4 * 2 + 16 * 4 * 2,
    }
    assert data["quant_method"] is None


def test_corrupt_headers_are_one_line_errors(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01")
    with pytest.raises(LayoutError, match="shorter than 8 bytes"):
        read_safetensors_header(short)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(LayoutError, match="corrupt safetensors header"):
        read_safetensors_header(huge)
    outside = tmp_path / "outside.safetensors"
    raw = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    outside.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0\0")
    with pytest.raises(LayoutError, match="'w' lies outside the file"):
        read_safetensors_header(outside)
    with pytest.raises(LayoutError, match=r"config\.json: unreadable"):
        build_layout(tmp_path)
