"""A process tree's resident memory, and the process listening on a port (psutil, I/O).

A tier is a tree of processes (vLLM's API server and its engine core, workers under them), so
its memory is the RSS of the root and every descendant, pages shared between them counted in
each. This module is the one implementation, used by

- the gateway's per-tier memory signals (gateway/control/tier_memory.py, once per scrape),
- ``model-optimizer bench``'s peak sampler (measure/memory.py),
- the benchmark scripts (benchmarks/bench_tiers.py).

It lives in ``backends`` rather than ``measure`` because ``backends`` is the one layer all three
already import and that imports none of them (it imports only itself and ``optimizer``): the
gateway then does not depend on the measuring package, and neither ``measure`` nor
``benchmarks`` gain an import of ``gateway`` or ``model_optimizer`` for it.
"""

from __future__ import annotations

import psutil


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants; empty when ``pid`` is gone or cannot be read."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int | None:
    """Total RSS of ``pid`` and its descendants; ``None`` if ``pid`` is gone or unreadable.

    A descendant that exits between the listing and its read is left out of the sum.
    """
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
        total = int(root.memory_info().rss)
    except psutil.Error:
        return None
    for child in children:
        try:
            total += int(child.memory_info().rss)
        except psutil.Error:
            continue
    return total


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` (any local address), if this user may see it."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return int(conn.pid) if conn.pid is not None else None
    return None
