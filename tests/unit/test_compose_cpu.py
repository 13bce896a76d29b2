"""compose.cpu.yaml (llama.cpp tiers on a CPU host) is valid where no Docker engine runs: the
tiers run backends/llama_args.py's command lines, never published, their key required; the
gateway runs as ``up`` runs it over llama.cpp tiers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from backends.launch import TierLaunch
from backends.llama_args import build_argv
from gateway.config import load_config
from gateway.policy.store import PolicyStore

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("tier-fp16", "tier-int8", "tier-int4")
_REQUIRED = re.compile(r"\$\{(\w+):\?[^}]+\}")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.cpu.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_each_tier_runs_the_command_up_would_give_it() -> None:
    services = _compose()["services"]
    for service in TIERS:
        name = service.removeprefix("tier-")
        tier = services[service]
        launch = TierLaunch(
            name=name,
            model_dir=Path("/variants") / name,
            served_model_name="default",
            port=8000,
            host="0.0.0.0",
            engine="llama.cpp",
            max_model_len=4096,
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            sampling={"temperature": 0.2, "top_p": 0.9},
            slot_dir=Path("/slots"),
        )
        assert [*tier["entrypoint"], *tier["command"]] == build_argv(
            Path("/app/llama-server"), launch
        ), service
        assert "ports" not in tier and tier["networks"] == ["tiers"]
        assert _REQUIRED.fullmatch(tier["environment"]["LLAMA_API_KEY"]), service
        assert "/slots" in tier["tmpfs"]


def test_the_gateway_runs_over_llama_cpp_tiers_with_their_real_lengths() -> None:
    data = _compose()
    gateway = data["services"]["gateway"]
    assert "--config policies/deploy/compose-gateway-cpu.yaml" in gateway["command"][-1]
    assert _REQUIRED.fullmatch(gateway["environment"]["MO_GATEWAY_API_KEYS"])
    config = load_config(ROOT / "policies/deploy/compose-gateway-cpu.yaml")
    assert {t.engine for t in config.tiers} == {"llama.cpp"}
    assert config.api_key_hashes == [] and all(t.api_key is None for t in config.tiers)
    PolicyStore(ROOT / "policies" / "routing.yaml", [t.name for t in config.tiers]).load()
    for tier in config.tiers:
        command = data["services"][f"tier-{tier.name}"]["command"]
        slots = int(command[command.index("--parallel") + 1])
        assert tier.max_model_len * slots == int(command[command.index("--ctx-size") + 1])
    assert data["networks"]["tiers"] == {"internal": True}
    published = [p for s in data["services"].values() for p in s.get("ports", [])]
    assert all(p.startswith(("127.0.0.1:", "${MO_GATEWAY_PUBLISH:-127.0.0.1}")) for p in published)
