"""Throwaway ``redis-server`` processes for tests that stop and restart Redis (loopback only)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis


def redis_command(port: int, folder: Path) -> list[str]:
    """The argv of a redis-server on 127.0.0.1:``port`` that keeps nothing but ``folder``."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    return [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(folder),
    ]


def ping(port: int) -> bool:
    """Whether a Redis answers PING on 127.0.0.1:``port``."""
    try:
        return bool(redis.Redis(port=port, socket_timeout=0.2).ping())
    except redis.exceptions.RedisError:
        return False


def start_redis(port: int, folder: Path) -> subprocess.Popen[bytes]:
    """Start one and wait (at most 5 s) until it answers."""
    proc = subprocess.Popen(redis_command(port, folder), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while not ping(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"redis-server did not start on port {port}")
        time.sleep(0.01)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=5)
