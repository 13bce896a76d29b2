import pytest

from optimizer.layers import (
    LinearInfo,
    PlanError,
    choose_group_size,
    fused_siblings,
    matches,
    plan_variant,
    resolve_overrides,
)
from optimizer.recipe import LayerOverride


def _block(index: int, hidden: int = 576, inter: int = 1536, kv: int = 192) -> list[LinearInfo]:
    prefix = f"model.layers.{index}"
    return [
        LinearInfo(f"{prefix}.self_attn.q_proj", hidden, hidden),
        LinearInfo(f"{prefix}.self_attn.k_proj", hidden, kv),
        LinearInfo(f"{prefix}.self_attn.v_proj", hidden, kv),
        LinearInfo(f"{prefix}.self_attn.o_proj", hidden, hidden),
        LinearInfo(f"{prefix}.mlp.gate_proj", hidden, inter),
        LinearInfo(f"{prefix}.mlp.up_proj", hidden, inter),
        LinearInfo(f"{prefix}.mlp.down_proj", inter, hidden),
    ]


LINEARS = [*_block(0), *_block(1), LinearInfo("lm_head", 576, 49152)]
MODULES = [
    "",
    "model",
    "model.embed_tokens",
    "model.layers",
    "model.layers.0",
    "model.layers.0.self_attn",
    "model.layers.1",
    "model.norm",
    *(linear.name for linear in LINEARS),
]


def _override(layers: list[str], precision: str) -> LayerOverride:
    return LayerOverride.model_validate({"layers": layers, "precision": precision})


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("lm_head", "lm_head", True),
        ("embed_tokens", "model.embed_tokens", True),
        ("self_attn.q_proj", "model.layers.3.self_attn.q_proj", True),
        ("proj", "model.layers.3.self_attn.q_proj", False),
        ("q_proj", "model.layers.3.self_attn.q_proj.weight", False),
        ("model.layers.3", "model.layers.3.self_attn.q_proj", False),
        ("layers.1", "model.layers.11", False),
        (r"re:.*\.q_proj", "model.layers.3.self_attn.q_proj", True),
        ("re:q_proj", "model.layers.3.self_attn.q_proj", False),
        (r"re:model\.layers\.1", "model.layers.11", False),
        (r"re:model\.layers\.(0|1)\..*", "model.layers.1.mlp.up_proj", True),
    ],
)
def test_matches(pattern: str, name: str, expected: bool) -> None:
    assert matches(pattern, name) is expected


def test_resolve_overrides_maps_every_match_and_later_entries_win() -> None:
    overrides = [
        _override([r"re:.*\.mlp\..*_proj", "embed_tokens"], "int8"),
        _override(["model.layers.1.mlp.down_proj"], "float16"),
    ]
    resolved = resolve_overrides(overrides, MODULES)
    assert resolved["model.embed_tokens"] == "int8"
    assert resolved["model.layers.0.mlp.down_proj"] == "int8"
    assert resolved["model.layers.1.mlp.down_proj"] == "fp16"
    assert "model.layers.0.self_attn.q_proj" not in resolved


def test_override_matching_nothing_is_named() -> None:
    overrides = [_override(["lm_head"], "fp16"), _override(["lm_head", "embed_token"], "fp16")]
    with pytest.raises(PlanError) as info:
        resolve_overrides(overrides, MODULES)
    message = str(info.value)
    assert message.startswith("quantization.layer_overrides[1]: 'embed_token' matches no layer")
    assert "did you mean embed_tokens?" in message
    with pytest.raises(PlanError) as info:
        resolve_overrides([_override([r"re:.*\.qkv"], "int8")], MODULES)
    assert str(info.value) == (
        "quantization.layer_overrides[0]: 're:.*\\.qkv' matches no layer of the model"
    )


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [([576, 1536], 64), ([768, 3072], 128), ([96, 576], 32)],
)
def test_choose_group_size(sizes: list[int], expected: int) -> None:
    layers = [LinearInfo(f"l{i}", size, 10) for i, size in enumerate(sizes)]
    assert choose_group_size(layers) == expected


def test_choose_group_size_fails_when_nothing_divides() -> None:
    with pytest.raises(PlanError, match=r"128/64/32 .*\(odd has 100\)"):
        choose_group_size([LinearInfo("fine", 576, 1), LinearInfo("odd", 100, 1)])
    with pytest.raises(PlanError):
        choose_group_size([])


def test_plan_int8_ignores_lm_head_by_default() -> None:
    plan = plan_variant("int8", LINEARS, ignore=["lm_head"], overrides={})
    assert plan.precision == "int8"
    assert plan.ignore == ("lm_head",)
    assert plan.group_size is None
    assert plan.counts() == {"int8": 14, "fp16": 1}
    assert plan.targets("int8")[0] == "model.layers.0.self_attn.q_proj"


def test_plan_int4_with_overrides_and_group_size() -> None:
    overrides = resolve_overrides(
        [
            _override(["lm_head", "embed_tokens"], "float16"),
            _override(["model.layers.1.mlp.down_proj"], "int8"),
        ],
        MODULES,
    )
    plan = plan_variant("int4", LINEARS, ignore=[], overrides=overrides, float_precision="bf16")
    by_name = {layer.name: layer.precision for layer in plan.layers}
    assert by_name["lm_head"] == "bf16"
    assert by_name["model.layers.1.mlp.down_proj"] == "int8"
    assert by_name["model.layers.0.mlp.down_proj"] == "int4"
    assert plan.ignore == ("lm_head",)
    assert plan.group_size == 64
    assert plan.overridden == {"lm_head": "bf16", "model.layers.1.mlp.down_proj": "int8"}


def test_plan_unquantized_variant_is_a_plain_cast() -> None:
    plan = plan_variant("bfloat16", LINEARS, ignore=["lm_head"], overrides={"lm_head": "int8"})
    assert {layer.precision for layer in plan.layers} == {"bf16"}
    assert plan.ignore == ()
    assert plan.group_size is None


def test_plan_fixed_group_size_must_divide() -> None:
    plan = plan_variant("int4", LINEARS, group_size=32)
    assert plan.group_size == 32
    with pytest.raises(PlanError, match=r"group_size: 256 does not divide .*q_proj \(576\)"):
        plan_variant("int4", LINEARS, group_size=256)


def test_plan_refuses_split_fused_shards() -> None:
    overrides = {"model.layers.0.self_attn.k_proj": "fp16"}
    with pytest.raises(PlanError, match=r"^model\.layers\.0\.self_attn\.qkv_proj: vLLM fuses "):
        plan_variant("int8", LINEARS, overrides=overrides)  # type: ignore[arg-type]


def test_fused_siblings_widen_a_layer_list() -> None:
    names = [linear.name for linear in LINEARS]
    widened = fused_siblings(["model.layers.1.mlp.up_proj", "lm_head"], names)
    assert widened == ["model.layers.1.mlp.up_proj", "lm_head", "model.layers.1.mlp.gate_proj"]
