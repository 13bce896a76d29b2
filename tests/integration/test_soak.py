"""The short soak: steady load through the real stack for a minute, a reset in the middle."""

from __future__ import annotations

import pytest

from model_optimizer.soak import render, soak
from tests.integration.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.integration
SECONDS = 60.0  # the long version: model-optimizer soak --minutes 30


@pytest.mark.slow
def test_a_minute_of_load_with_a_reset_loses_nothing(stack: Stack) -> None:
    result = soak(
        stack.gateway_url,
        "SmolLM2-135M-Instruct",
        clients=3,
        seconds=SECONDS,
        gateway_pid=stack.process.pid,  # `up` runs the gateway in its own process
        reset_tier="int4",
        admin_key=ADMIN_KEY,
    )
    print(render(result))
    assert result.sent >= 20, result
    assert result.lost == 0, result.statuses
    assert result.reset_outcome == "ok", result.reset_outcome
    # Flat memory: a minute of traffic may not grow the gateway process by more than 50 MB.
    assert result.rss_end_mb - result.rss_start_mb < 50, result
