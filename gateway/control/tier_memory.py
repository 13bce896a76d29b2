"""Sampling each tier's memory: the RSS of its process tree, where its process is known (I/O).

A tier's root process comes from whoever started it: ``model-optimizer up`` passes its
supervisor's PIDs (``tier_pids``). A gateway started on its own finds a loopback tier's process
by the TCP port it listens on (psutil); a remote tier's memory is not known here. The tree's
RSS (root and every descendant: vLLM's API server and its engine core) is read in a worker
thread once per scrape, by backends/process_tree.py (shared with ``measure`` and the benchmark
scripts, so the gateway does not import the measuring package); the definitions are in
gateway/control/tier_signals.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

import anyio.to_thread

from backends.process_tree import listening_pid, tree_rss_bytes
from gateway.config import TierEndpoint
from gateway.control.tier_signals import MemorySample, PeakMemory

logger = logging.getLogger(__name__)

TierPids = Callable[[], Mapping[str, int]]
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def tree_sample(pid: int) -> MemorySample | None:
    """The RSS of ``pid``'s process tree as a sample; ``None`` if ``pid`` is gone or unreadable."""
    total = tree_rss_bytes(pid)
    return None if total is None else MemorySample(pid, total)


def loopback_port(tier: TierEndpoint) -> int | None:
    """The port of a loopback tier's URL (``None``: the tier is on another host)."""
    parts = urlsplit(tier.base_url)
    if parts.hostname not in LOOPBACK:
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


class TierMemory:
    """The latest memory sample and the peak of each tier."""

    def __init__(self, tiers: Sequence[TierEndpoint], tier_pids: TierPids | None = None) -> None:
        self._ports = {tier.name: loopback_port(tier) for tier in tiers}
        self._tier_pids = tier_pids
        self._found: dict[str, int] = {}  # PIDs discovered by port
        self._latest: dict[str, MemorySample] = {}
        self._peaks = PeakMemory()

    def latest(self, tier: str) -> MemorySample | None:
        return self._latest.get(tier)

    def peak(self, tier: str) -> int | None:
        return self._peaks.peak(tier)

    async def sample(self) -> None:
        """Sample every tier (in a worker thread: psutil reads /proc synchronously)."""
        pids = dict(self._tier_pids()) if self._tier_pids is not None else {}
        seen = await anyio.to_thread.run_sync(self._sample_all, pids)
        for name in self._ports:
            sample = seen.get(name)
            if sample is None:
                self._latest.pop(name, None)
            else:
                self._latest[name] = sample
                self._peaks.observe(name, sample)

    def _sample_all(self, pids: Mapping[str, int]) -> dict[str, MemorySample]:
        out: dict[str, MemorySample] = {}
        for name, port in self._ports.items():
            pid = pids.get(name) or self._found.get(name)
            sample = tree_sample(pid) if pid else None
            if sample is None and name not in pids and port is not None:
                self._found.pop(name, None)
                found = listening_pid(port)
                if found:
                    self._found[name] = found
                    sample = tree_sample(found)
            if sample is not None:
                out[name] = sample
        return out
