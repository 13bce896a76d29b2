"""The gateway measures its tiers itself (issue 32), on real llama.cpp tiers: two gateway
processes sharing Redis, as two Kubernetes replicas are, with int4 a pool of two servers (the
stack's and a second one started from the same argv on another loopback port); one of them
(the leader) runs the admission check and the speed calibration of every endpoint, both route
on the figures it wrote."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import hash_key
from tests.integration.conftest import (
    Stack,
    gateway_config,
    gateway_processes,
    pooled,
    second_server,
    wait_until,
)

pytestmark = pytest.mark.integration
KEY = "measures-admin-key"


def _routes(url: str) -> dict[str, Any]:
    response = httpx.get(
        f"{url}/admin/routes", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def _measured_endpoints(url: str) -> set[tuple[str, str]]:
    """The endpoints the shared record holds, as this replica shows it (none before a run)."""
    measurement = _routes(url).get("measurement") or {}
    if measurement.get("source") != "gateway" or measurement.get("written_at") is None:
        return set()
    return {(e["tier"], e["url"]) for e in measurement.get("endpoints", [])}


def test_two_replicas_route_on_the_figures_one_of_them_measured(
    llama_stack: Stack, tmp_path: Path
) -> None:
    """Neither replica is handed figures: the leader measures every endpoint of every tier (a
    small calibration, to keep the suite short; the pool's second endpoint in a second run),
    writes them to Redis under its fencing token, and both replicas then show the same record
    and derive the same chains from it."""
    config = gateway_config(
        llama_stack,
        redis_url="redis://127.0.0.1:6379/0",
        redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
        admin_key_hashes=[hash_key(KEY)],
        measurement={
            "enabled": True,
            "tick_s": 1.0,
            "max_tokens": 16,
            "speed_requests": 4,
            "speed_concurrency": 2,
            "speed_output_len": 16,
        },
    )
    with second_server(llama_stack, "int4", tmp_path) as extra:
        pool = [llama_stack.tier_urls["int4"], extra]
        config = pooled(config, "int4", pool)
        every = {(n, u) for n, u in llama_stack.tier_urls.items() if n != "int4"}
        every |= {("int4", url) for url in pool}
        with gateway_processes(config, tmp_path, 2) as running:
            urls = [url for url, _ in running]
            wait_until(lambda: all(_measured_endpoints(url) == every for url in urls), 600)
            first, second = (_routes(url) for url in urls)
    logs = [(tmp_path / f"gateway{i}.log").read_text(errors="replace") for i in range(2)]
    measured, other = first["measurement"], second["measurement"]
    # One record, written by one replica: the same time, writer and token on both.
    for field in ("written_at", "replica", "token"):
        assert measured[field] == other[field], field
    assert {(e["tier"], e["url"]) for e in measured["endpoints"]} == every
    assert sum("measuring " in log for log in logs) == 1, "exactly one replica measured"
    # Both route on it: the figures behind every class and the chains derived from them agree.
    assert first["tiers"].keys() == second["tiers"].keys() == set(llama_stack.tier_urls)
    for name, tier in first["tiers"].items():
        assert tier["calibration"] is not None, name
        assert tier["calibration"] == second["tiers"][name]["calibration"], name

    def chains(document: dict[str, Any]) -> dict[str, tuple[str, list[str], list[str]]]:
        return {
            cls: (entry["how"], entry["tiers"], entry["overflow"])
            for cls, entry in document["classes"].items()
        }

    assert chains(first) == chains(second)
    assert any(how == "derived" for how, _, _ in chains(first).values()), chains(first)
