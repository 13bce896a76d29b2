from pathlib import Path

import pytest

from optimizer.recipe import (
    DEFAULT_THRESHOLDS,
    Recipe,
    RecipeError,
    is_quantized,
    load_recipe,
    normalize_precision,
    parse_recipe,
    recipe_hash,
    single_variant_recipe,
)

ROOT = Path(__file__).resolve().parents[3]


def _error(text: str) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_shipped_default_recipe_loads() -> None:
    recipe = load_recipe(ROOT / "policies" / "recipes" / "default.yaml")
    assert list(recipe.variants) == ["fp16", "int8", "int4"]
    # The shipped file and the code's defaults agree (operators read the file).
    for name, limits in recipe.variants.items():
        assert limits.check.model_dump() == DEFAULT_THRESHOLDS[name]
    assert recipe.quantization.ignore == ["lm_head"]
    override = recipe.quantization.layer_overrides[0]
    assert override.layers == ["lm_head", "embed_tokens"]
    assert override.precision == "fp16"
    assert recipe.kv_cache.max_num_seqs == 8
    assert recipe.calibration.dataset is None


def test_empty_recipe_is_all_defaults() -> None:
    recipe = parse_recipe("{}", "r.yaml")
    assert recipe == parse_recipe("", "r.yaml")
    assert list(recipe.variants) == ["fp16", "int8", "int4"]
    assert recipe.variants["int8"].check.max_kl == 0.1
    assert recipe.quantization.default_precision == "int8"
    assert recipe.quantization.group_size == "auto"
    assert recipe.kv_cache.block_size == 16


def test_yaml_syntax_error_names_file_and_line() -> None:
    message = _error("variants:\n  fp16: {}\nquantization:\n  ignore: [lm_head\n")
    assert message.startswith("r.yaml:5: invalid YAML: ")
    assert _error("kv_cache:\n  block_size: 16\n  dtype: a: b\n").startswith("r.yaml:3: ")


def test_wrong_type_on_nested_field_names_its_line_and_path() -> None:
    text = "variants:\n  int8:\n    check:\n      min_top1: 0.9\n      max_kl: lots\n"
    message = _error(text)
    assert message.startswith("r.yaml:5: variants.int8.check.max_kl: ")
    assert "valid number" in message


def test_list_items_are_named_with_their_index() -> None:
    text = (
        "quantization:\n"
        "  layer_overrides:\n"
        "    - layers: [lm_head]\n"
        "      precision: fp16\n"
        "    - layers: [q_proj]\n"
        "      precision: int2\n"
    )
    message = _error(text)
    assert message.startswith("r.yaml:6: quantization.layer_overrides[1].precision: ")
    assert "unknown precision 'int2'" in message


def test_missing_field_falls_back_to_the_parent_line() -> None:
    text = "quantization:\n  layer_overrides:\n    - layers: [lm_head]\n"
    assert _error(text) == (
        "r.yaml:3: quantization.layer_overrides[0].precision: required field is missing"
    )


def test_unknown_field_is_rejected_with_a_hint() -> None:
    message = _error("calibration:\n  num_samples: 8\n  max_seq_len: 128\n")
    assert (
        message == "r.yaml:3: calibration.max_seq_len: unknown field (did you mean max_seq_length?)"
    )
    message = _error("surprise: 1\n")
    assert message.startswith("r.yaml:1: surprise: unknown field (allowed: variants, ")


def test_duplicate_keys_are_rejected() -> None:
    assert _error("kv_cache:\n  block_size: 16\n  block_size: 32\n") == (
        "r.yaml:3: kv_cache.block_size: duplicate key"
    )


def test_precision_aliases_are_normalized() -> None:
    text = (
        "variants: {float16: {}, int4: {check: {max_kl: 0.4}}}\n"
        "quantization:\n"
        "  default_precision: bfloat16\n"
        "  layer_overrides: [{layers: [lm_head], precision: float16}]\n"
    )
    recipe = parse_recipe(text, "r.yaml")
    assert list(recipe.variants) == ["fp16", "int4"]
    assert recipe.quantization.default_precision == "bf16"
    assert recipe.quantization.layer_overrides[0].precision == "fp16"
    # a partial check keeps that variant's other default thresholds
    assert recipe.variants["int4"].check.max_kl == 0.4
    assert recipe.variants["int4"].check.min_top1 == DEFAULT_THRESHOLDS["int4"]["min_top1"]
    assert normalize_precision("BFloat16") == "bf16"
    assert not is_quantized("float16") and is_quantized("int4")


def test_a_variant_named_twice_through_an_alias_is_an_error() -> None:
    assert "fp16 is named twice" in _error("variants: {fp16: {}, float16: {}}\n")


def test_unknown_variant_and_empty_variants_are_errors() -> None:
    assert _error("variants:\n  int3: {}\n").startswith(
        "r.yaml:2: variants.int3: unknown precision"
    )
    assert "names no variant" in _error("variants: {}\n")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("quantization: {group_size: 0}\n", "quantization.group_size"),
        ("quantization: {group_size: many}\n", "quantization.group_size"),
        ("calibration: {num_samples: true}\n", "calibration.num_samples"),
        ("kv_cache: {dtype: fp4}\n", "kv_cache.dtype"),
        ("kv_cache: {headroom: -0.5}\n", "kv_cache.headroom"),
        ("variants: {int8: {check: {min_top1: 1.5}}}\n", "variants.int8.check.min_top1"),
        (
            "quantization: {layer_overrides: [{layers: ['re:('], precision: fp16}]}\n",
            "quantization.layer_overrides[0].layers",
        ),
    ],
)
def test_out_of_range_values_name_their_field(text: str, field: str) -> None:
    assert _error(text).startswith(f"r.yaml:1: {field}: ")


def test_group_size_accepts_an_integer() -> None:
    assert parse_recipe("quantization: {group_size: 32}\n").quantization.group_size == 32


def test_batch_must_hold_every_sequence() -> None:
    message = _error("kv_cache:\n  max_num_seqs: 64\n  max_num_batched_tokens: 32\n")
    assert message.startswith("r.yaml:1: kv_cache: max_num_batched_tokens (32)")


def test_load_recipe_reports_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"nope.yaml: cannot read recipe"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("variants:\n  fp16:\n    check: {max_kl: x}\n")
    with pytest.raises(RecipeError, match=rf"^{bad}:3: variants.fp16.check.max_kl: "):
        load_recipe(bad)


def test_recipe_hash_is_canonical() -> None:
    base = parse_recipe("{}")
    spelled_out = parse_recipe("quantization: {default_precision: int8, ignore: [lm_head]}\n")
    assert recipe_hash(base) == recipe_hash(spelled_out)
    assert len(recipe_hash(base)) == 16
    int(recipe_hash(base), 16)
    assert recipe_hash(base) != recipe_hash(parse_recipe("calibration: {seed: 1}\n"))
    aliased = parse_recipe("variants: [float16]\n")
    assert recipe_hash(aliased) == recipe_hash(parse_recipe("variants: [fp16]\n"))


def test_single_variant_recipe() -> None:
    base = parse_recipe("variants: {int8: {check: {max_kl: 0.3}}}\nkv_cache: {max_num_seqs: 4}\n")
    one = single_variant_recipe("int8", base)
    assert list(one.variants) == ["int8"]
    assert one.variants["int8"].check.max_kl == 0.3
    assert one.kv_cache.max_num_seqs == 4
    four = single_variant_recipe("int4", base)
    assert list(four.variants) == ["int4"]
    assert four.variants["int4"].check.max_kl == DEFAULT_THRESHOLDS["int4"]["max_kl"]
    assert four.quantization.default_precision == "int4"
    assert list(single_variant_recipe("float16", base).variants) == ["fp16"]
    assert list(single_variant_recipe(None, Recipe()).variants) == ["int8"]
    with pytest.raises(RecipeError, match=r"^--quantize: unknown precision 'int3'"):
        single_variant_recipe("int3", base)


def test_the_gguf_section_has_defaults_and_rejects_a_repeated_candidate() -> None:
    gguf = parse_recipe("variants: [fp16]\n").gguf
    assert (gguf.fp16, gguf.int8, gguf.int4) == ("BF16", "Q8_0", ["Q4_0", "Q4_K_M"])
    assert gguf.layer_overrides is None  # quantization's ignore and overrides apply
    with pytest.raises(RecipeError, match=r"gguf.int4: .*names Q4_0 twice"):
        parse_recipe("gguf: {int4: [Q4_0, Q4_0]}\n")
    with pytest.raises(RecipeError, match=r"gguf\.int4"):
        parse_recipe("gguf: {int4: [Q3_K]}\n")


def test_each_format_hashes_only_the_parts_its_variants_depend_on() -> None:
    base = parse_recipe("variants: [int4]\n")
    other_gguf = parse_recipe("variants: [int4]\ngguf: {int4: [Q4_K_M]}\n")
    other_calibration = parse_recipe("variants: [int4]\ncalibration: {seed: 7}\n")
    assert recipe_hash(base) == recipe_hash(other_gguf)  # vLLM variants stay up to date
    assert recipe_hash(base, "gguf") != recipe_hash(other_gguf, "gguf")
    assert recipe_hash(base, "gguf") == recipe_hash(other_calibration, "gguf")
    assert recipe_hash(base) != recipe_hash(other_calibration)
