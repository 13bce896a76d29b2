"""The in-engine admission check on a tier made to answer wrongly: it is kept out of every
class it fails, said at start, at /admin/tiers and in x-route-reason (its own stack: up with
pre-built variants, fp16 and a broken int8)."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from backends.platform import native_precisions
from common.cpu import machine_flags
from model_optimizer.envs import cache_root, env_python
from tests.integration.conftest import ADMIN_KEY, MODEL, Stack, start_stack, stop_stack

pytestmark = pytest.mark.integration

# Multiply every attention output projection's int8 weight scales: the weights the engine
# computes with are then ~20x too large. Run in the optimize env (it has torch). The factor
# differs a little per run, so the weights (and the admission cache's key) are new each time
# and the check really runs.
BREAK = """
import sys
from safetensors.torch import load_file, save_file
path, factor = sys.argv[1], float(sys.argv[2])
tensors = load_file(path)
hit = [k for k in tensors if k.endswith("self_attn.o_proj.weight_scale")]
assert hit, "no o_proj weight scales"
for k in hit:
    tensors[k] = tensors[k] * factor
save_file(tensors, path, metadata={"format": "pt"})
print(len(hit))
"""


def _broken_variants(folder: Path) -> Path:
    built = cache_root() / "variants" / MODEL
    shutil.copytree(built / "fp16", folder / "fp16")
    shutil.copytree(built / "int8", folder / "int8")
    weights = folder / "int8" / "model.safetensors"
    done = subprocess.run(
        [str(env_python("optimize")), "-c", BREAK, str(weights), str(20 + random.random())],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and int(done.stdout) > 0, done.stderr
    return folder


@pytest.mark.slow
def test_a_broken_tier_is_kept_out_of_every_class_it_fails(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # `stack` first: the session's up has built the variants this test copies.
    folder = tmp_path_factory.mktemp("broken")
    variants = _broken_variants(folder / "variants")
    own = start_stack(folder / "up.log", ("fp16", "int8"), ("--variants", str(variants)))
    try:
        log = own.log_text()
        if "int8" in native_precisions("cpu", machine_flags()):
            assert "tier int8 (native) kept out of" in log, log[-3000:]
            assert "serving it emulated and checking again" in log  # the remedy was tried
        else:  # the platform rule serves int8 emulated from the start (AMX): checked once
            assert "tier int8 (emulated) kept out of" in log, log[-3000:]
            assert "checking again" not in log, log[-3000:]
        tiers = httpx.get(
            f"{own.gateway_url}/admin/tiers",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=10,
        ).json()["tiers"]
        int8 = tiers["int8"]
        # Emulating weights that are broken does not help: a tie goes back to native kernels.
        mode = "native" if "back to the native kernels" in log else "emulated"
        assert int8["admission"].startswith(f"tier int8 ({mode}) kept out of"), int8
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
        # The derived tolerant route leaves int8 out and says why.
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
