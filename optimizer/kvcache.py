"""kv_cache_config.json: the KV-cache budget of one variant, from model geometry and the recipe.

bytes per token = 2 (K and V) × layers × kv heads × head dim × bytes per KV element;
memory = bytes per token × max_model_len × max_num_seqs × (1 + headroom), rounded up to whole
blocks of ``block_size`` tokens. The backends read the file instead of guessing. Pure: the caller
passes the parsed config.json.

Assumes full attention in every layer (no sliding-window or MLA savings): an upper bound for
models that have those.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from optimizer.recipe import KVCacheSection

MIB = 1 << 20
_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp16": 2,
    "bf16": 2,
}


class KVCacheError(ValueError):
    """A model config from which no KV budget can be computed; one line."""


@dataclass(frozen=True)
class KVCacheConfig:
    block_size: int
    kv_cache_dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    bytes_per_token: int
    num_blocks: int
    kv_cache_memory_bytes: int
    kv_cache_memory_mib: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def _text_config(model_config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = model_config.get("text_config")
    return inner if isinstance(inner, Mapping) else model_config


def _positive_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        raise KVCacheError(f"config.json: {key} must be a positive integer, found {value!r}")
    return value


def kv_dtype_bytes(kv_cache_dtype: str, model_config: Mapping[str, Any]) -> int:
    """Bytes per KV element: 1 for fp8, else the model's dtype (``dtype``/``torch_dtype``)."""
    if kv_cache_dtype.startswith("fp8"):
        return 1
    config = _text_config(model_config)
    name = config.get("dtype") or config.get("torch_dtype") or model_config.get("dtype")
    name = name or model_config.get("torch_dtype") or "bfloat16"
    key = str(name).removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise KVCacheError(f"config.json: unknown dtype {name!r} for the KV cache")
    return _DTYPE_BYTES[key]


def bytes_per_token(model_config: Mapping[str, Any], dtype_bytes: int) -> int:
    config = _text_config(model_config)
    layers = _positive_int(config, "num_hidden_layers")
    heads = _positive_int(config, "num_attention_heads")
    kv_heads = (
        _positive_int(config, "num_key_value_heads") if "num_key_value_heads" in config else heads
    )
    if config.get("head_dim") is not None:
        head_dim = _positive_int(config, "head_dim")
    else:
        hidden = _positive_int(config, "hidden_size")
        if hidden % heads:
            raise KVCacheError(
                f"config.json: hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}"
            )
        head_dim = hidden // heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_cache_config(
    model_config: Mapping[str, Any], kv: KVCacheSection, dtype_bytes: int
) -> KVCacheConfig:
    """The KV budget for ``kv.max_num_seqs`` sequences of ``kv.max_model_len`` tokens."""
    if dtype_bytes <= 0:
        raise KVCacheError(f"dtype_bytes must be positive, not {dtype_bytes}")
    config = _text_config(model_config)
    limit = config.get("max_position_embeddings")
    if type(limit) is int and kv.max_model_len > limit:
        raise KVCacheError(
            f"kv_cache.max_model_len {kv.max_model_len} exceeds the model's "
            f"max_position_embeddings {limit}"
        )
    per_token = bytes_per_token(model_config, dtype_bytes)
    # Fraction(str(...)) keeps 0.1 exact, so 18022.4 tokens round up to 1127 blocks, not more.
    tokens = Fraction(kv.max_model_len * kv.max_num_seqs) * (1 + Fraction(str(kv.headroom)))
    blocks = math.ceil(tokens / kv.block_size)
    memory = blocks * kv.block_size * per_token
    return KVCacheConfig(
        block_size=kv.block_size,
        kv_cache_dtype=kv.dtype,
        max_model_len=kv.max_model_len,
        max_num_seqs=kv.max_num_seqs,
        max_num_batched_tokens=kv.max_num_batched_tokens,
        bytes_per_token=per_token,
        num_blocks=blocks,
        kv_cache_memory_bytes=memory,
        kv_cache_memory_mib=round(memory / MIB, 2),
    )
