"""The in-engine admission check on a tier made to answer wrongly: it is kept out of every
class it fails, said at start, at /admin/tiers and in x-route-reason (its own stack: up with
pre-built llama.cpp variants, fp16 and a broken int8). The vLLM side's remedy (re-serving a
failing tier from its dequantized copy) is tested with plain values in
tests/unit/model_optimizer/test_admit.py."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from optimizer.gguf_table import read_table
from tests.integration.conftest import ADMIN_KEY, MODEL, Stack, start_stack, stop_stack

pytestmark = pytest.mark.integration
Q8_0, BLOCK_BYTES = 8, 34  # a Q8_0 block: an f16 scale, then 32 int8 weights


def _break_int8(model: Path, factor: float) -> int:
    """Multiply the scale of every block of every attention output projection of a Q8_0 GGUF:
    the weights the engine computes with are then ``factor`` times too large. The factor
    differs a little per run, so the file (and the admission cache's key) is new each time
    and the check really runs."""
    table = read_table(model)
    hit = [t for t in table.tensors if t.name.endswith(".attn_output.weight")]
    assert hit and all(t.type_id == Q8_0 for t in hit)
    for tensor in hit:
        blocks = tensor.shape[0] * tensor.shape[1] // 32
        start = table.data_start + tensor.offset
        data = np.memmap(model, dtype=np.uint8, mode="r+", offset=start, shape=(blocks, 34))
        scales = data[:, :2].copy().view(np.float16)
        data[:, :2] = (scales * np.float16(factor)).view(np.uint8)
        data.flush()
    return len(hit)


@pytest.mark.slow
def test_a_broken_tier_is_kept_out_of_every_class_it_fails(
    llama_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # `llama_stack` first: the session's up has built the variants this test copies.
    folder = tmp_path_factory.mktemp("broken")
    for tier in ("fp16", "int8"):
        shutil.copytree(llama_stack.variants / tier, folder / "variants" / tier)
    assert _break_int8(folder / "variants" / "int8" / "model.gguf", 20 + random.random()) > 0
    own = start_stack(
        folder / "up.log",
        ("fp16", "int8"),
        ("--variants", str(folder / "variants")),
        engine="llama.cpp",
    )
    try:
        log = own.log_text()
        assert "tier int8 (native) kept out of" in log, log[-3000:]
        assert "checking again" not in log  # llama.cpp tiers are never re-served emulated
        tiers = httpx.get(
            f"{own.gateway_url}/admin/tiers",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=10,
        ).json()["tiers"]
        int8 = tiers["int8"]
        assert int8["admission"].startswith("tier int8 (native) kept out of"), int8
        assert "tolerant" not in int8["classes"]
        assert tiers["fp16"]["classes"] is None
        answer = httpx.post(
            f"{own.gateway_url}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16,
                "temperature": 0,
            },
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-route-tier"] == "fp16"
        assert "Paris" in answer.json()["choices"][0]["message"]["content"]
        policy = httpx.get(
            f"{own.gateway_url}/admin/policy",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=10,
        ).json()
        # int8 is out of the derived tolerant route, which says why (below the floor, or not
        # admitted by the in-engine check).
        assert "int8" not in policy["policy"]["routes"]["tolerant"]["tiers"]
        why = policy["derived_routes"]["tolerant"]["reasons"]["int8"]
        assert "floor" in why or "not admitted" in why, why
    finally:
        stop_stack(own)
