"""optimizer/gguf_table.py reads a GGUF file's tensor table past its vocabulary (pure Python),
on a file written here by the format's rules."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from optimizer.gguf_table import GGUFTableError, read_table


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _gguf(tensors: list[tuple[str, tuple[int, ...], int]]) -> bytes:
    pairs = [
        _string("general.architecture") + struct.pack("<I", 8) + _string("llama"),
        _string("general.file_type") + struct.pack("<I", 4) + struct.pack("<I", 2),
        # an array of strings: the vocabulary the reader skips
        _string("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", 9, 8, 3)
        + b"".join(_string(t) for t in ("<s>", "a", "bb")),
        _string("tokenizer.ggml.scores")
        + struct.pack("<IIQ", 9, 6, 3)
        + struct.pack("<3f", 0, 1, 2),
    ]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(pairs)) + b"".join(pairs)
    offset = 0
    for name, shape, kind in tensors:
        out += _string(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", n) for n in shape) + struct.pack("<IQ", kind, offset)
        offset += 64
    return out + b"\0" * 32


def test_the_table_and_scalar_metadata_are_read(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(
        _gguf([("token_embd.weight", (576, 49152), 8), ("blk.0.attn_q.weight", (576, 576), 2)])
    )
    table = read_table(path)
    assert table.version == 3
    assert table.metadata == {"general.architecture": "llama", "general.file_type": 2}
    assert table.names() == ["token_embd.weight", "blk.0.attn_q.weight"]
    assert table.tensors[1].shape == (576, 576) and table.tensors[1].type_id == 2
    assert table.tensors[1].offset == 64
    assert table.data_start % 32 == 0 and table.data_start >= len(path.read_bytes()) - 32


def test_what_is_not_gguf_or_cut_short_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + b"\0" * 20)
    with pytest.raises(GGUFTableError, match="not a GGUF file"):
        read_table(path)
    path.write_bytes(_gguf([("a.weight", (2, 2), 0)])[:40])
    with pytest.raises(GGUFTableError, match="truncated GGUF header"):
        read_table(path)
