from pathlib import Path

import pytest

from gateway.policy.schema import PolicyError, RoutingPolicy, load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[4]
DEFAULT = ROOT / "policies" / "routing.yaml"
MINIMAL = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: [int4, int8, fp16]
  code: [fp16, int8]
  math: [fp16, int8]
  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}
"""


def _error(text: str) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "t.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_shipped_policy_loads() -> None:
    policy = load_policy(DEFAULT)
    assert policy.tiers == ["fp16", "int8", "int4"]
    assert policy.routes.tolerant.tiers == ["int4", "int8", "fp16"]
    assert policy.routes.tolerant.strategy == "ordered"
    assert policy.routes.code.tiers == ["fp16", "int8"]
    assert policy.routes.long.tiers == ["fp16", "int8", "int4"]
    # every class's order is derived from the measurements where the gateway has them
    for cls in ("tolerant", "code", "math", "long"):
        route = policy.routes.for_class(cls)
        assert route is not None and route.derive is not None, cls
    assert policy.routes.code.derive is not None and policy.routes.code.derive.floor == 0.9
    assert policy.classes.long.min_tokens == 1024
    assert policy.classes.model is not None and 0 < policy.classes.model.threshold < 0.5
    assert [o.name for o in policy.classes.overrides] == ["fenced_block"]
    assert policy.limits.on_input_too_long == "reject"
    assert policy.limits.on_max_tokens_too_large == "clamp"
    assert policy.pinning.allow is False


def test_a_minimal_policy_takes_the_defaults() -> None:
    policy = parse_policy(MINIMAL, "t.yaml")
    assert policy.saturation.max_kv_usage == 0.9
    assert policy.saturation.max_requests_waiting == 4
    assert policy.limits.max_input_tokens is None
    assert policy.classes.code.keywords == []
    assert policy.pinning.header == "x-route-tier"


def test_routes_by_class() -> None:
    policy = parse_policy(MINIMAL, "t.yaml")
    assert policy.routes.for_class("math") is policy.routes.math
    assert policy.routes.for_class("poetry") is None
    assert policy.routes.for_class("for_class") is None


def test_an_unknown_tier_in_a_route_names_file_line_and_field() -> None:
    text = MINIMAL.replace("code: [fp16, int8]", "code: [fp16, fp8]")
    assert _error(text) == "t.yaml:4: routes.code[1]: unknown tier fp8 (tiers: fp16, int8, int4)"


def test_an_unknown_tier_in_a_block_list_gets_its_own_line() -> None:
    text = MINIMAL.replace(
        "  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}",
        "  long:\n    strategy: most_free_kv\n    tiers:\n      - fp16\n      - int2\n",
    )
    assert (
        _error(text)
        == "t.yaml:10: routes.long.tiers[1]: unknown tier int2 (tiers: fp16, int8, int4)"
    )


def test_an_unknown_tier_in_the_limits() -> None:
    text = MINIMAL + "limits:\n  tier_max_input_tokens: {int4: 512, int3: 100}\n"
    message = _error(text)
    assert message.startswith("t.yaml:8: limits.tier_max_input_tokens.int3: unknown tier int3")


def test_a_tier_not_declared_is_unknown_even_if_deployed_elsewhere() -> None:
    text = MINIMAL.replace("tiers: [fp16, int8, int4]", "tiers: [fp16, int8]", 1)
    assert _error(text) == "t.yaml:3: routes.tolerant[0]: unknown tier int4 (tiers: fp16, int8)"


def test_an_unknown_field_lists_the_allowed_ones() -> None:
    text = MINIMAL + "saturation:\n  max_kv: 0.8\n"
    assert _error(text) == (
        "t.yaml:8: saturation.max_kv: unknown field (allowed: max_requests_waiting, max_kv_usage)"
    )


def test_an_unknown_class_in_routes() -> None:
    text = MINIMAL + "  poetry: [int4]\n"
    assert _error(text).startswith("t.yaml:7: routes.poetry: unknown field (allowed: tolerant,")


def test_a_missing_route() -> None:
    text = MINIMAL.replace("  math: [fp16, int8]\n", "")
    assert _error(text) == "t.yaml:2: routes.math: required field is missing"


def test_missing_tiers() -> None:
    assert _error(MINIMAL.split("\n", 1)[1]) == "t.yaml:1: tiers: required field is missing"


def test_a_bad_regular_expression_points_at_its_line() -> None:
    text = MINIMAL + (
        "classes:\n  code:\n    patterns:\n"
        "      - {name: ok, regex: 'def '}\n"
        "      - {name: broken, regex: 'def ('}\n"
    )
    message = _error(text)
    assert message.startswith("t.yaml:11: classes.code.patterns[1].regex: bad regular expression")


def test_a_pattern_name_must_be_header_safe() -> None:
    text = MINIMAL + "classes:\n  math:\n    patterns: [{name: 'x y', regex: 'x'}]\n"
    assert "classes.math.patterns[0].name: pattern name 'x y'" in _error(text)


def test_a_keyword_listed_twice() -> None:
    text = MINIMAL + "classes:\n  code:\n    keywords: [python, Python]\n"
    assert _error(text) == "t.yaml:9: classes.code.keywords: keyword 'Python' is listed twice"


def test_task_words_are_single_words() -> None:
    text = MINIMAL + ("classes:\n  code:\n    task: {verbs: [write], objects: [unit test]}\n")
    assert "classes.code.task.objects: 'unit test': give single words here" in _error(text)


def test_keywords_are_folded_to_lower_case_and_single_spaces() -> None:
    text = MINIMAL + "classes:\n  math:\n    keywords: ['Square   Root', Prime]\n"
    assert parse_policy(text, "t.yaml").classes.math.keywords == ["square root", "prime"]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("saturation:\n  max_kv_usage: 1.5\n", "saturation.max_kv_usage: Input should be less"),
        ("saturation:\n  max_requests_waiting: -1\n", "saturation.max_requests_waiting: Input"),
        ("limits:\n  on_input_too_long: truncate\n", "limits.on_input_too_long: Input should be"),
        ("limits:\n  on_max_tokens_too_large: ignore\n", "limits.on_max_tokens_too_large:"),
        ("limits:\n  max_input_tokens: 0\n", "limits.max_input_tokens: Input should be greater"),
        ("classes:\n  long:\n    min_tokens: '100'\n", "classes.long.min_tokens: Input should be"),
        ("pinning:\n  allow: perhaps\n", "pinning.allow: Input should be a valid boolean"),
    ],
)
def test_bad_values(section: str, message: str) -> None:
    assert message in _error(MINIMAL + section)


def test_a_route_with_a_tier_twice() -> None:
    text = MINIMAL.replace("code: [fp16, int8]", "code: [fp16, fp16]")
    assert _error(text) == "t.yaml:4: routes.code: tier fp16 is listed twice"


def test_a_route_with_an_unknown_strategy() -> None:
    text = MINIMAL.replace("most_free_kv", "random")
    assert _error(text).startswith("t.yaml:6: routes.long.strategy: Input should be 'ordered'")


def test_duplicate_keys_are_refused() -> None:
    text = MINIMAL + "pinning:\n  allow: true\n  allow: false\n"
    assert _error(text) == "t.yaml:9: pinning.allow: duplicate key"


def test_invalid_yaml_names_its_line() -> None:
    assert _error(MINIMAL + "limits: [\n").startswith("t.yaml:8: invalid YAML:")


def test_a_file_that_is_not_a_mapping() -> None:
    assert _error("- fp16\n") == "t.yaml:1: (top level): must be a mapping of sections"


def test_the_pinning_header_is_lower_cased() -> None:
    policy = parse_policy(MINIMAL + "pinning: {allow: true, header: X-Pin-Tier}\n", "t.yaml")
    assert policy.pinning.header == "x-pin-tier"


def test_load_policy_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "nope.yaml")
    assert (
        str(info.value)
        == f"{tmp_path / 'nope.yaml'}: cannot read routing policy: No such file or directory"
    )


def test_load_policy_names_the_file_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(MINIMAL.replace("[fp16, int8]\n  math", "[fp16, int9]\n  math"))
    with pytest.raises(PolicyError, match=rf"^{path}:4: routes.code\[1\]: unknown tier int9"):
        load_policy(path)


def test_policies_are_frozen() -> None:
    policy = parse_policy(MINIMAL, "t.yaml")
    assert isinstance(policy, RoutingPolicy)
    with pytest.raises(ValueError):
        policy.tiers = ["fp16"]
