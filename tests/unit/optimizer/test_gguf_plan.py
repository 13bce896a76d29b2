"""optimizer/gguf_plan.py: GGML types, llama-quantize's overrides and command line, and the
choice among 4-bit candidates (pure)."""

from __future__ import annotations

import pytest

from optimizer.gguf_plan import (
    Candidate,
    GGUFPlanError,
    choice_reason,
    choose,
    precision_of,
    quantize_argv,
    tensor_overrides,
    type_of,
)

NAMES = {
    "model.embed_tokens": "token_embd.weight",
    "lm_head": "output.weight",
    "model.layers.0.self_attn.q_proj": "blk.0.attn_q.weight",
    "model.layers.0.mlp.down_proj": "blk.0.ffn_down.weight",
}
PRESENT = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight"]  # tied lm_head


def test_types_mean_recipe_precisions() -> None:
    assert [precision_of(t) for t in ("F16", "F32", "BF16", "Q8_0")] == [
        "fp16",
        "fp16",
        "bf16",
        "int8",
    ]
    # what a K-quant 4-bit file is made of counts as its int4
    assert {precision_of(t) for t in ("Q4_0", "Q4_K", "Q5_0", "Q6_K")} == {"int4"}
    assert type_of("float16", "Q4_0") == "F16" and type_of("int8", "Q4_0") == "Q8_0"
    assert type_of("int4", "Q4_K_M") == "Q4_K_M"  # an int4 override is the variant's own type


def test_overrides_become_anchored_tensor_types_and_a_tied_head_is_skipped() -> None:
    wanted = {"lm_head": "fp16", "model.layers.0.mlp.down_proj": "int8"}
    overrides = tensor_overrides(wanted, NAMES, "Q4_0", PRESENT)
    assert [(o.tensor, o.ggml_type) for o in overrides] == [("blk.0.ffn_down.weight", "Q8_0")]
    assert overrides[0].argument() == r"^blk\.0\.ffn_down\.weight$=q8_0"


def test_an_override_that_reaches_no_tensor_is_an_error() -> None:
    with pytest.raises(GGUFPlanError, match="lm_head name no tensor of the GGUF"):
        tensor_overrides({"lm_head": "fp16"}, NAMES, "Q4_0", PRESENT)
    assert tensor_overrides({}, NAMES, "Q4_0", PRESENT) == []


def test_the_quantizer_command_line() -> None:
    wanted = {"model.embed_tokens": "fp16", "model.layers.0.self_attn.q_proj": "int8"}
    overrides = tensor_overrides(wanted, NAMES, "Q4_0", PRESENT)
    argv = quantize_argv("/l/llama-quantize", "/w/base.gguf", "/w/q.gguf", "Q4_0", overrides)
    assert argv == [
        "/l/llama-quantize",
        "--token-embedding-type",
        "f16",
        "--tensor-type",
        r"^blk\.0\.attn_q\.weight$=q8_0",
        "/w/base.gguf",
        "/w/q.gguf",
        "Q4_0",
    ]


def _candidate(kind: str, speed: float, kl: float, passed: bool = True) -> Candidate:
    return Candidate(kind, passed, kl, 0.8, speed, 100)


def test_the_fastest_that_passed_wins_and_near_ties_go_to_the_lower_kl() -> None:
    q40, q4km = _candidate("Q4_0", 160.0, 0.30), _candidate("Q4_K_M", 100.0, 0.05)
    assert choose([q40, q4km], 0.1) is q40  # 60 % faster: speed wins
    close = _candidate("Q4_K_M", 150.0, 0.05)  # within 10 % of the fastest's time per token
    assert choose([q40, close], 0.1) is close
    assert choose([_candidate("Q4_0", 160.0, 0.3, passed=False), q4km], 0.1) is q4km
    with pytest.raises(GGUFPlanError, match="no 4-bit candidate passed"):
        choose([_candidate("Q4_0", 160.0, 0.9, passed=False)], 0.1)
    reason = choice_reason(q40, [q40, q4km], 0.1)
    assert reason.startswith("Q4_0 chosen") and "Q4_K_M: 100.0 tok/s, kl 0.050" in reason
