"""compose.yaml is valid where no Docker engine runs: structure, references, loopback rules, and
the gateway it runs is the one ``up`` runs (policy, tokenizer, Redis, keys required)."""

import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from backends.vllm_args import GUARD
from gateway.config import load_config
from gateway.policy.store import PolicyStore

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("tier-fp16", "tier-int8", "tier-int4")
_DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")
_REQUIRED = re.compile(r"\$\{(\w+):\?[^}]+\}")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _defaulted(text: str) -> str:
    """``text`` as compose reads it with no variable set: ``${VAR:-default}`` → default."""
    return _DEFAULT.sub(lambda m: m.group(2), text)


def _required(value: str) -> str | None:
    """The variable ``value`` requires (``${VAR:?message}``: compose refuses to start without
    it), else None."""
    match = _REQUIRED.fullmatch(value)
    return match.group(1) if match else None


def _mounted(service: dict[str, Any], container_path: str) -> Path | None:
    """The repository path a service sees at ``container_path`` through its volumes."""
    target = PurePosixPath(container_path)
    for volume in service.get("volumes", []):
        host, inside = volume.split(":")[:2]
        inside_path = PurePosixPath(inside)
        if target == inside_path or inside_path in target.parents:
            return ROOT / host / target.relative_to(inside_path)
    return None


def test_services_and_references_resolve() -> None:
    data = _compose()
    services = data["services"]
    assert {"redis", *TIERS, "gateway"} <= set(services)
    assert {"otel-collector", "jaeger"} <= set(services)
    for name, service in services.items():
        assert "image" in service, name
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
        for net in service.get("networks", []):
            assert net in data["networks"], f"{name} uses unknown network {net}"
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            assert (ROOT / host).exists() or host == "./variants", f"{name}: {host}"


def test_tiers_are_never_published_and_share_the_gpu_below_one() -> None:
    services = _compose()["services"]
    tiers = {k: v for k, v in services.items() if k.startswith("tier-")}
    assert set(tiers) == set(TIERS)
    shares = []
    for name, tier in tiers.items():
        assert "ports" not in tier, f"{name} must stay on the internal network"
        assert tier["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
        cmd = tier["command"]
        shares.append(float(cmd[cmd.index("--gpu-memory-utilization") + 1]))
    assert sum(shares) < 1.0


def test_every_published_port_binds_loopback_by_default() -> None:
    published = [
        (name, _defaulted(port))
        for name, service in _compose()["services"].items()
        for port in service.get("ports", [])
    ]
    assert ("gateway", "127.0.0.1:8000:8000") in published
    for name, port in published:
        assert port.startswith("127.0.0.1:"), (name, port)


def test_only_the_gateway_joins_the_tiers_internal_network() -> None:
    data = _compose()
    networks, services = data["networks"], data["services"]
    for name in TIERS:
        assert services[name]["networks"] == ["tiers"], name
    assert networks["tiers"] == {"internal": True}
    members = {name for name, s in services.items() if "tiers" in s.get("networks", [])}
    assert members == {*TIERS, "gateway"}
    # Redis and the collector are no one's but the gateway's either, and reach nothing outside.
    for name in ("redis", "otel-collector"):
        assert all(networks[net].get("internal") for net in services[name]["networks"]), name


def test_tiers_guard_their_routes_with_a_required_key_and_sleep_on_the_gpu() -> None:
    """vLLM's own key (VLLM_API_KEY) guards /v1 and friends; the tier guard (loaded from the
    mounted backends/) the dev-mode routes it leaves open; both the same required secret."""
    services = _compose()["services"]
    for name in TIERS:
        tier = services[name]
        cmd, env = tier["command"], tier["environment"]
        assert cmd[cmd.index("--middleware") + 1] == GUARD
        assert "--enable-sleep-mode" in cmd
        assert _required(env["VLLM_API_KEY"]) == "MO_TIER_API_KEY", name
        assert _required(env["MO_TIER_API_KEY"]) == "MO_TIER_API_KEY", name
        module = _mounted(tier, f"{env['PYTHONPATH']}/{GUARD.rsplit('.', 1)[0].replace('.', '/')}")
        assert module is not None and module.with_suffix(".py").is_file(), name


def test_the_gateway_runs_as_up_runs_it() -> None:
    """The policy, the fp16 tokenizer, Redis, a per-key rate limit, each tier's real
    max_model_len, the tiers' key, and API keys it cannot start without."""
    services = _compose()["services"]
    gateway = services["gateway"]
    command = gateway["command"][-1]
    assert "--host 0.0.0.0" in command  # inside its container; published on loopback
    assert "--config policies/deploy/compose-gateway.yaml" in command
    # SIGTERM reaches python (exec), which drains within its bound before compose's SIGKILL
    assert "&& exec python -m gateway " in command
    assert gateway["stop_grace_period"] == "30s"
    env = gateway["environment"]
    assert _required(env["MO_GATEWAY_API_KEYS"]) == "MO_GATEWAY_API_KEYS"
    assert _required(env["MO_TIER_API_KEY"]) == "MO_TIER_API_KEY"

    config = load_config(ROOT / "policies/deploy/compose-gateway.yaml")
    assert config.api_key_hashes == [] and all(t.api_key is None for t in config.tiers)
    assert config.redis_url == "redis://redis:6379/0"
    assert config.rate_limit_per_minute is not None
    policy = _mounted(gateway, f"{gateway['working_dir']}/{config.policy_path}")
    assert policy is not None and policy.is_file()
    PolicyStore(policy, [t.name for t in config.tiers]).load()
    assert config.tokenizer_dir is not None
    assert _mounted(gateway, config.tokenizer_dir) == ROOT / "variants" / "fp16"
    for tier in config.tiers:
        service = services[f"tier-{tier.name}"]
        assert tier.base_url == f"http://tier-{tier.name}:8000"
        cmd = service["command"]
        assert tier.max_model_len == int(cmd[cmd.index("--max-model-len") + 1]), tier.name
