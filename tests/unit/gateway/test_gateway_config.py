"""GatewayConfig validation and YAML loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config import (
    ConfigError,
    GatewayConfig,
    TierEndpoint,
    keys_from_environment,
    load_config,
)


def test_defaults_and_url_normalisation() -> None:
    config = GatewayConfig(
        model_name="m", tiers=[TierEndpoint(name="fp16", base_url=" http://127.0.0.1:8001/ ")]
    )
    assert config.tiers[0].base_url == "http://127.0.0.1:8001"
    assert (config.connect_timeout, config.read_timeout, config.max_body_bytes) == (
        5.0,
        600.0,
        1_000_000,
    )


def test_needs_at_least_one_tier() -> None:
    with pytest.raises(ValidationError, match="tiers"):
        GatewayConfig(model_name="m", tiers=[])


def test_tier_names_must_be_unique() -> None:
    tier = TierEndpoint(name="fp16", base_url="http://127.0.0.1:8001")
    with pytest.raises(ValidationError, match="repeated: fp16"):
        GatewayConfig(model_name="m", tiers=[tier, tier])


def test_base_url_needs_a_scheme() -> None:
    with pytest.raises(ValidationError, match="http://"):
        TierEndpoint(name="fp16", base_url="127.0.0.1:8001")


@pytest.mark.parametrize("field", ["connect_timeout", "read_timeout", "max_body_bytes"])
def test_limits_must_be_positive(field: str) -> None:
    tier = TierEndpoint(name="fp16", base_url="http://127.0.0.1:8001")
    with pytest.raises(ValidationError, match=field):
        GatewayConfig.model_validate({"model_name": "m", "tiers": [tier], field: 0})


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="extra"):
        GatewayConfig.model_validate(
            {"model_name": "m", "tiers": [{"name": "a", "base_url": "http://x"}], "typo": 1}
        )


def test_load_config_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "model_name: smollm2\n"
        "read_timeout: 30\n"
        "tiers:\n"
        "  - {name: fp16, base_url: 'http://127.0.0.1:8001'}\n"
        "  - {name: int4, base_url: 'http://127.0.0.1:8003'}\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.model_name == "smollm2"
    assert config.read_timeout == 30
    assert [tier.name for tier in config.tiers] == ["fp16", "int4"]


def test_load_config_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "absent.yaml")
    assert "absent.yaml" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model_name: [unclosed\n", ":2: invalid YAML: "),
        ("- just\n- a list\n", r":1: \(top level\): must be a YAML mapping"),
        ("model_name: m\ntiers: []\n", ":2: tiers: List should have at least 1 item"),
        (
            "model_name: m\ntypo: 1\ntiers: [{name: a, base_url: 'http://x'}]\n",
            r":2: typo: unknown field \(allowed: model_name, tiers, ",
        ),
    ],
)
def test_load_config_rejects_bad_content(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=expected) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}:")
    assert "\n" not in str(caught.value)


def test_the_tier_key_comes_from_the_environment_for_tiers_without_one() -> None:
    config = GatewayConfig(
        model_name="m",
        tiers=[
            TierEndpoint(name="a", base_url="http://127.0.0.1:1"),
            TierEndpoint(name="b", base_url="http://127.0.0.1:2", api_key="own"),
        ],
    )
    keyed = keys_from_environment(config, {"MO_TIER_API_KEY": "from-env"})
    assert [t.api_key for t in keyed.tiers] == ["from-env", "own"]
    assert keys_from_environment(config, {}).tiers[0].api_key is None
    assert "from-env" not in repr(keyed)


def test_a_tier_is_a_pool_of_endpoints_or_a_dns_name() -> None:
    static = TierEndpoint.model_validate(
        {"name": "fp16", "endpoints": ["http://10.0.0.1:8000/", "http://10.0.0.2:8000"]}
    )
    assert static.pool() == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert static.base_url == "http://10.0.0.1:8000"  # where one URL stands for the tier
    named = TierEndpoint.model_validate({"name": "int8", "dns": "tier-int8.ns.svc:8000"})
    assert (named.dns, named.base_url) == ("http://tier-int8.ns.svc:8000",) * 2
    assert TierEndpoint.model_validate({"name": "a", "dns": "https://h:443"}).dns == "https://h:443"
    single = TierEndpoint(name="a", base_url="http://x:1")
    assert (single.pool(), single.dns, single.endpoints) == (["http://x:1"], None, None)


def test_a_pool_loads_back_from_its_own_dump() -> None:
    """A config written by model_dump (as tests and tools hand gateways their config) carries
    each pool's derived base_url; it loads back as it was. A base_url that differs from the
    pool's is still two sources, refused."""
    for fields in (
        {"endpoints": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]},
        {"dns": "tier-int8.ns.svc:8000"},
    ):
        pool = TierEndpoint.model_validate({"name": "int8", **fields})
        assert TierEndpoint.model_validate(pool.model_dump(mode="json")) == pool
        with pytest.raises(ValidationError, match="got base_url, "):
            TierEndpoint.model_validate({"name": "int8", "base_url": "http://other:1", **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of base_url, endpoints, dns \\(got none\\)"),
        ({"base_url": "http://x", "dns": "h:1"}, "got base_url, dns"),
        ({"endpoints": []}, "at least 1 item"),
        ({"endpoints": ["http://a", "10.0.0.2:8000"]}, "endpoints must start with http://"),
        ({"endpoints": ["http://a", "http://a/"]}, "repeated: http://a"),
        ({"dns": "tier-int8"}, "dns must be host:port"),
        ({"dns": "h:0"}, "dns must be host:port"),
        ({"dns": "h:80/path"}, "dns must be host:port"),
    ],
)
def test_pool_mistakes_are_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TierEndpoint.model_validate({"name": "fp16", **fields})


def test_a_pool_in_a_file_points_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "model_name: m\ntiers:\n  - name: fp16\n    endpoints: [http://a:1, b:2]\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"gateway.yaml:\d+: tiers.0.*endpoints must start"):
        load_config(path)
