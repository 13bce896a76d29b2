"""model_optimizer/stack.py: the pure parts of ``up`` (no tier is started)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from backends.launch import TierLaunch
from backends.spec import AdmissionSpec
from measure.speed import TierSpeed
from model_optimizer.serving_check import Admission, cache_file
from model_optimizer.stack import (
    admission_time,
    gateway_config,
    gateway_measurement,
    measured_tiers,
    tier_key,
)
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


def test_a_tier_served_from_its_emulated_copy_is_flagged_for_the_derivation() -> None:
    speeds = {
        name: TierSpeed(name, 0.2, tpot, 30.0, 4, ttfts_s=(0.2, 0.21), tpots_s=(tpot, None))
        for name, tpot in (("fp16", 0.0366), ("int8", 0.0315))
    }
    admission = Admission("fp16", {}, speeds)
    launches = [
        TierLaunch(name="fp16", model_dir=Path("/v/fp16"), served_model_name="m", port=8101),
        TierLaunch(name="int8", model_dir=Path("/v.emulated/int8"), served_model_name="m", port=2),
    ]
    measured = measured_tiers(admission, launches)
    assert measured["int8"].emulated and not measured["fp16"].emulated
    assert measured["int8"].tpots_s == [0.0315, None] and measured["int8"].ttfts_s == [0.2, 0.21]
    assert "TPOT 31.5 ms alone (medians of 1 prompts);" in admission.lines()[1]
    older = Admission("fp16", {}, {"fp16": dataclasses.replace(speeds["fp16"], tpots_s=())})
    assert "TPOT 36.6 ms alone; 30 output tok/s at 4 at once" in older.lines()[0]
    own = dataclasses.replace(launches[1], model_dir=Path("/v/int8"))
    assert not measured_tiers(admission, [launches[0], own])["int8"].emulated


def test_the_gateway_goes_on_measuring_as_up_did_and_knows_when_up_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = AdmissionSpec(reference="fp16", max_tokens=24, floors={"chat": 0.6})
    settings = gateway_measurement(spec, {"fp16": "d1", "int8": "d2"}, tiers=2)
    assert settings.enabled and settings.reference == "fp16" and settings.max_tokens == 24
    assert settings.floors["chat"] == 0.6 and settings.digests == {"fp16": "d1", "int8": "d2"}
    assert not gateway_measurement(spec, {}, tiers=1).enabled
    assert not gateway_measurement(AdmissionSpec(enabled=False), {}, tiers=3).enabled

    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path))
    cached = Admission("fp16", {})
    path = cache_file("k")
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    os.utime(path, (1_000.0, 1_000.0))
    assert admission_time(cached, cached, "k") == 1_000.0  # cached: measured back then
    fresh = Admission("fp16", {})
    assert abs(admission_time(fresh, cached, "k") - time.time()) < 5  # measured just now
