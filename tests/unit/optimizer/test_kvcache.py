import json
from typing import Any

import pytest

from optimizer.kvcache import KVCacheError, bytes_per_token, kv_cache_config, kv_dtype_bytes
from optimizer.recipe import KVCacheSection

SMOLLM2: dict[str, Any] = {
    "dtype": "bfloat16",
    "head_dim": 64,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
}


def test_smollm2_bytes_per_token() -> None:
    assert bytes_per_token(SMOLLM2, 2) == 23040
    without_head_dim = {k: v for k, v in SMOLLM2.items() if k != "head_dim"}
    assert bytes_per_token(without_head_dim, 2) == 23040  # 576 / 9 = 64
    assert bytes_per_token({**SMOLLM2, "head_dim": None}, 1) == 11520
    no_gqa = {k: v for k, v in SMOLLM2.items() if k != "num_key_value_heads"}
    assert bytes_per_token(no_gqa, 2) == 23040 * 3


def test_budget_rounds_up_to_whole_blocks() -> None:
    kv = KVCacheSection()  # 2048 tokens x 8 seqs x 1.1, blocks of 16
    config = kv_cache_config(SMOLLM2, kv, 2)
    assert config.bytes_per_token == 23040
    assert config.num_blocks == 1127  # ceil(18022.4 / 16)
    assert config.kv_cache_memory_bytes == 1127 * 16 * 23040
    assert config.kv_cache_memory_mib == pytest.approx(396.21, abs=0.01)
    assert (config.block_size, config.kv_cache_dtype) == (16, "auto")
    exact = kv_cache_config(SMOLLM2, KVCacheSection(headroom=0, max_num_seqs=1), 2)
    assert exact.kv_cache_memory_bytes == 23040 * 2048


def test_to_json_carries_every_field() -> None:
    kv = KVCacheSection(dtype="fp8", max_model_len=1024, max_num_seqs=4)
    data = json.loads(kv_cache_config(SMOLLM2, kv, 1).to_json())
    assert data["kv_cache_dtype"] == "fp8"
    assert data["bytes_per_token"] == 11520
    assert data["max_model_len"] == 1024
    assert data["max_num_seqs"] == 4
    assert data["max_num_batched_tokens"] == 2048
    assert set(data) >= {"block_size", "kv_cache_memory_bytes"}


def test_dtype_bytes() -> None:
    assert kv_dtype_bytes("fp8", SMOLLM2) == 1
    assert kv_dtype_bytes("auto", SMOLLM2) == 2
    assert kv_dtype_bytes("auto", {"torch_dtype": "float32"}) == 4
    with pytest.raises(KVCacheError, match="unknown dtype 'int3'"):
        kv_dtype_bytes("auto", {"dtype": "int3"})


def test_bad_geometry_and_too_long_context() -> None:
    with pytest.raises(KVCacheError, match="num_hidden_layers must be a positive integer"):
        bytes_per_token({**SMOLLM2, "num_hidden_layers": 0}, 2)
    with pytest.raises(KVCacheError, match="exceeds the model's max_position_embeddings 8192"):
        kv_cache_config(SMOLLM2, KVCacheSection(max_model_len=16384), 2)


def test_nested_text_config_is_used() -> None:
    assert bytes_per_token({"text_config": SMOLLM2, "hidden_size": 1}, 2) == 23040
