"""model_optimizer/serving_check.py's record of what up measured (gateway/measured.py's file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import GatewayConfig, MeasuredTier, TierEndpoint
from gateway.measured import measured_path, read_measured
from model_optimizer.serving_check import record_measurements

FP16 = MeasuredTier(
    quality={"chat": 1.0, "code": 1.0, "math": 1.0}, ttft_s=0.1, tpot_s=0.02, throughput_tok_s=60
)
INT4 = MeasuredTier(
    quality={"chat": 0.7, "code": 0.4, "math": 0.8}, ttft_s=0.2, tpot_s=0.03, throughput_tok_s=40
)


def _config(measured: dict[str, MeasuredTier]) -> GatewayConfig:
    return GatewayConfig(
        model_name="m",
        tiers=[
            TierEndpoint(name="fp16", base_url="http://127.0.0.1:8101"),
            TierEndpoint(name="int4", base_url="http://127.0.0.1:8102", classes=["tolerant"]),
        ],
        measured=measured,
        reference_tier="fp16" if measured else None,
    )


def test_up_records_its_measurements_per_gateway_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path))
    assert measured_path(18000) == tmp_path / "measured" / "gateway-18000.json"
    written = record_measurements(18000, _config({"fp16": FP16, "int4": INT4}), {"code": 0.5})
    assert written == measured_path(18000)
    got = read_measured(written)
    assert got is not None
    assert (got.gateway_port, got.reference, got.floors) == (18000, "fp16", {"code": 0.5})
    assert got.tiers == {"fp16": FP16, "int4": INT4}
    assert got.classes == {"int4": ["tolerant"]}  # fp16 serves every class: not listed
    assert got.tier_urls["int4"] == "http://127.0.0.1:8102"
    assert "128 tokens" in got.speed and got.written_at.startswith("20")
    # a later up on the same port that measured nothing leaves no stale figures behind
    assert record_measurements(18000, _config({}), {}) is None
    assert not measured_path(18000).exists()
