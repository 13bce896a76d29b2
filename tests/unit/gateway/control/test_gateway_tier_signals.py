"""Per-tier signals: derivations from a real vLLM scrape, the peak tracker, process-tree memory
sampling, and their export on the gateway's /metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.metrics import parse_metrics
from backends.process_tree import listening_pid
from gateway.config import TierEndpoint
from gateway.control.tier_memory import TierMemory, loopback_port, tree_sample
from gateway.control.tier_signals import (
    MemorySample,
    PeakMemory,
    derive_signals,
    kv_tokens_per_request,
)
from tests.unit.gateway.conftest import MODEL, StubTier

DATA = Path(__file__).parents[2] / "backends" / "data"


def scrape(name: str, model: str = "m") -> str:
    return (
        (DATA / f"vllm-0.32-{name}.txt")
        .read_text()
        .replace('model_name="m"', f'model_name="{model}"')
    )


def test_signals_of_a_real_scrape_with_one_request_running() -> None:
    metrics = parse_metrics(scrape("cpu-running"), "m")
    signals = derive_signals(metrics, MemorySample(pid=7, rss_bytes=1000), peak=1500)
    assert signals.kv_usage == pytest.approx(1 / 21)
    assert signals.kv_capacity_tokens == 21 * 128  # 22 blocks less the null block, 128 tokens
    # One 128-token block in use, one request running.
    assert signals.kv_tokens_per_request == pytest.approx(128.0)
    assert signals.preemptions == 0.0
    assert (signals.memory_bytes, signals.peak_memory_bytes) == (1000, 1500)


def test_kv_per_request_is_undefined_while_nothing_runs() -> None:
    idle = derive_signals(parse_metrics(scrape("cpu-idle"), "m"), None, None)
    assert idle.kv_usage == 0.0 and idle.kv_tokens_per_request is None
    assert idle.memory_bytes is None and idle.peak_memory_bytes is None
    assert kv_tokens_per_request(0.5, 1000, 4) == 125.0
    assert kv_tokens_per_request(0.5, None, 4) is None
    assert kv_tokens_per_request(None, 1000, 4) is None


def test_two_engines_share_out_both_pools() -> None:
    signals = derive_signals(parse_metrics(scrape("two-engines"), "m"), None, None)
    usage = (1 / 21 + 0.25) / 2
    assert signals.kv_capacity_tokens == 42 * 128
    assert signals.kv_tokens_per_request == pytest.approx(usage * 42 * 128 / 3)
    assert signals.preemptions == 3.0


def test_families_missing_from_the_scrape_are_unknown_not_zero() -> None:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n'
    signals = derive_signals(parse_metrics(text, "m"), None, None)
    assert signals.kv_usage is None and signals.preemptions is None
    assert signals.kv_capacity_tokens is None and signals.kv_tokens_per_request is None
    assert derive_signals(None, MemorySample(1, 5), 5).kv_usage is None


def test_peak_keeps_the_largest_sample_and_restarts_with_the_process() -> None:
    peaks = PeakMemory()
    assert peaks.peak("int4") is None
    assert [peaks.observe("int4", MemorySample(10, rss)) for rss in (5, 9, 7)] == [5, 9, 9]
    assert peaks.observe("int4", MemorySample(11, 3)) == 3  # restarted: a new root process
    assert peaks.observe("int8", MemorySample(12, 4)) == 4 and peaks.peak("int4") == 3


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A child process holding ~40 MB resident, so the tree's RSS grows measurably."""
    code = "import sys, time\nheld = b'x' * (40 * 2**20)\nprint('ok', flush=True)\ntime.sleep(60)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ok\n"
    yield process
    process.kill()
    process.wait(timeout=10)


def test_a_tree_sample_is_rooted_at_its_process(child: subprocess.Popen[bytes]) -> None:
    # The sum itself is tested with backends/process_tree.py.
    sample = tree_sample(os.getpid())
    assert sample is not None and sample.pid == os.getpid()
    assert sample.rss_bytes > psutil.Process(child.pid).memory_info().rss
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    assert tree_sample(dead.pid) is None


@pytest.fixture
def listener() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def test_a_loopback_tier_is_found_by_its_listening_port(listener: int) -> None:
    assert listening_pid(listener) == os.getpid()
    tier = TierEndpoint(name="t0", base_url=f"http://127.0.0.1:{listener}")
    far = TierEndpoint(name="t1", base_url="http://10.1.2.3:8000")
    assert loopback_port(tier) == listener and loopback_port(far) is None
    memory = TierMemory([tier, far])
    anyio.run(memory.sample)
    found = memory.latest("t0")
    assert found is not None and found.pid == os.getpid() and found.rss_bytes > 0
    assert memory.latest("t1") is None and memory.peak("t0") == found.rss_bytes


def test_pids_given_by_the_supervisor_win(child: subprocess.Popen[bytes], listener: int) -> None:
    tier = TierEndpoint(name="t0", base_url=f"http://127.0.0.1:{listener}")
    pids = {"t0": child.pid}
    memory = TierMemory([tier], lambda: pids)
    anyio.run(memory.sample)
    sample = memory.latest("t0")
    assert sample is not None and sample.pid == child.pid
    pids.clear()  # the supervisor has no process for it now (down): found by port instead
    anyio.run(memory.sample)
    sample = memory.latest("t0")
    assert sample is not None and sample.pid == os.getpid()


def test_gateway_exports_the_signals_of_each_tier(
    make_stub: Callable[[], StubTier],
    start_gateway: Callable[..., str],
    client: httpx.Client,
) -> None:
    scraped, plain = make_stub(), make_stub()
    scraped.metrics_text = scrape("cpu-running", MODEL)
    gateway = start_gateway(scraped.url, plain.url, metrics_interval=0.2)
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(client.get(f"{gateway}/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("gateway_tier_") and "tier" in sample.labels:
                found[(sample.name, sample.labels["tier"])] = sample.value
    assert found[("gateway_tier_kv_usage_ratio", "t0")] == pytest.approx(1 / 21)
    assert found[("gateway_tier_kv_capacity_tokens", "t0")] == 2688
    assert found[("gateway_tier_kv_tokens_per_request", "t0")] == pytest.approx(128)
    assert found[("gateway_tier_preemptions_total", "t0")] == 0
    # Both stubs listen in this process: found by port, this process's RSS.
    assert found[("gateway_tier_memory_bytes", "t1")] > 0
    assert (
        found[("gateway_tier_peak_memory_bytes", "t1")]
        >= found[("gateway_tier_memory_bytes", "t1")]
    )
    # The plain stub has no /metrics: no KV series for it rather than zeros.
    assert ("gateway_tier_kv_usage_ratio", "t1") not in found


def test_a_drain_counts_what_the_tier_itself_still_runs() -> None:
    """The shared count can read 0 while Redis is away (this replica's alone); the tier's own
    running count from its scrape still holds the other replica's request."""
    from backends.metrics import TierMetrics
    from gateway.control.tier_signals import still_running

    running = TierMetrics(requests_running=1.0)
    assert still_running({}, "int4", running) == 1.0
    assert still_running({"int4": 2}, "int4", running) == 2.0
    assert still_running({"int8": 1}, "int4", None) == 0.0
    assert still_running({"int4": 0}, "int4", TierMetrics()) == 0.0
