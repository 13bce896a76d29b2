"""compose.yaml is valid where no Docker engine runs: structure, references, loopback rules."""

from pathlib import Path
from typing import Any

import yaml

from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_services_and_references_resolve() -> None:
    data = _compose()
    services = data["services"]
    assert {"redis", "tier-fp16", "tier-int8", "tier-int4", "gateway"} <= set(services)
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
    assert len(tiers) == 3
    shares = []
    for name, tier in tiers.items():
        assert "ports" not in tier, f"{name} must stay on the internal network"
        assert tier["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
        cmd = tier["command"]
        shares.append(float(cmd[cmd.index("--gpu-memory-utilization") + 1]))
    assert sum(shares) < 1.0
    for name, service in services.items():
        for port in service.get("ports", []):
            assert name == "gateway" or port.startswith("127.0.0.1:"), (name, port)


def test_gateway_config_for_compose_loads() -> None:
    config = load_config(ROOT / "policies/deploy/compose-gateway.yaml")
    assert {t.name for t in config.tiers} == {"fp16", "int8", "int4"}
