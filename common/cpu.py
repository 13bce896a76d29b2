"""What CPU this is: its model name and flags, read from /proc/cpuinfo (standard library only).

Below every package: the engine rules (backends/platform.py), the admission cache key and the
llama.cpp build key (a native build runs only on CPUs with the flags it was compiled for) all
read it.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The ``flags`` of the first processor in /proc/cpuinfo's text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: str) -> str:
    """The ``model name`` of the first processor ("" when the text has none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return ""


def read_cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none)."""
    try:
        return CPUINFO.read_text()
    except OSError:
        return ""


def machine_flags() -> frozenset[str]:
    """This machine's CPU flags."""
    return cpu_flags(read_cpuinfo())
