"""A GGUF file's tensor table and scalar metadata, read without its vocabulary (pure Python).

gguf-py's ``GGUFReader`` builds every metadata field, and a tokenizer's 49,152 tokens and as
many merges take it 5-20 s per file on these 2-core machines; the optimizer reads each variant's
table several times. This reads the header (GGUF v2/v3: magic, version, tensor and key counts),
skips the key-value pairs (keeping the scalar ones), and reads the tensor infos (name,
dimensions, GGML type, offset). Byte sizes use gguf-py's block sizes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFTableError(ValueError):
    """Not a GGUF file this reader understands; one line naming it."""


@dataclass(frozen=True)
class TableEntry:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-moving dimension first
    type_id: int
    offset: int


@dataclass(frozen=True)
class GGUFTable:
    version: int
    metadata: dict[str, object]  # scalar and string values only (arrays are skipped)
    tensors: tuple[TableEntry, ...]
    data_start: int  # where the tensors' data begins (offsets count from here)

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> object:
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def u32(self) -> int:
        value = struct.unpack_from("<I", self.data, self.at)[0]
        self.at += 4
        return int(value)

    def u64(self) -> int:
        value = struct.unpack_from("<Q", self.data, self.at)[0]
        self.at += 8
        return int(value)

    def string(self) -> str:
        length = self.u64()
        text = self.data[self.at : self.at + length].decode("utf-8", errors="replace")
        self.at += length
        return text

    def skip_strings(self, count: int) -> None:
        data, at = self.data, self.at
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            at += 8 + unpack(data, at)[0]
        self.at = at

    def value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFTableError(f"unknown GGUF value type {kind}")
        inner, count = self.u32(), self.u64()
        if inner == _STRING:
            self.skip_strings(count)
        elif inner in _SCALARS:
            self.at += count * struct.calcsize(_SCALARS[inner])
        else:
            for _ in range(count):
                self.value(inner)
        return None


def read_table(path: Path, head_bytes: int = 64 << 20) -> GGUFTable:
    """The tensor table of the GGUF at ``path`` (its first ``head_bytes`` must hold the header,
    metadata and tensor infos: a 49k-token vocabulary takes about 2 MB)."""
    with path.open("rb") as fh:
        data = fh.read(head_bytes)
    if data[:4] != b"GGUF":
        raise GGUFTableError(f"{path}: not a GGUF file")
    cursor = _Cursor(data)
    cursor.at = 4
    try:
        version = cursor.u32()
        if version < 2:
            raise GGUFTableError(f"{path}: GGUF version {version} is too old")
        tensors, pairs = cursor.u64(), cursor.u64()
        metadata: dict[str, object] = {}
        for _ in range(pairs):
            key = cursor.string()
            value = cursor.value(cursor.u32())
            if value is not None:
                metadata[key] = value
        entries = []
        for _ in range(tensors):
            name = cursor.string()
            shape = tuple(cursor.u64() for _ in range(cursor.u32()))
            type_id = cursor.u32()
            entries.append(TableEntry(name, shape, type_id, cursor.u64()))
    except struct.error:
        raise GGUFTableError(f"{path}: truncated GGUF header") from None
    align = metadata.get("general.alignment", 32)
    align = align if isinstance(align, int) and align > 0 else 32
    start = -(-cursor.at // align) * align
    return GGUFTable(version, metadata, tuple(entries), start)
