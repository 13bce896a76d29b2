"""model_optimizer/stack.py: the pure parts of ``up`` (no tier is started)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from backends.launch import TierLaunch
from model_optimizer.stack import gateway_config, tier_key
from model_optimizer.tier_setup import UpOptions


def test_each_run_gets_its_own_tier_key_unless_one_is_given() -> None:
    first, second = tier_key({}), tier_key({})
    assert first != second and len(first) >= 40
    assert tier_key({"MO_TIER_API_KEY": " given "}) == "given"


def test_the_gateway_sends_each_tier_its_key() -> None:
    launch = TierLaunch(name="fp16", model_dir=Path("/v/fp16"), served_model_name="m", port=8101)
    launches = [dataclasses.replace(launch, api_key="run-key")]
    config = gateway_config(UpOptions(), "m", launches)
    assert [t.api_key for t in config.tiers] == ["run-key"]
    assert "run-key" not in repr(config)
