"""What a benchmark points at: a gateway or one tier (vLLM or llama-server), on loopback, and
its backends.

``resolve_targets`` checks the URL (loopback http only), asks it for its model id, tells a
gateway (it answers ``/readyz``) from a tier (vLLM has no such route), and finds the vLLM
servers whose memory the run samples (``measure.memory``). ``--tier NAME`` picks tiers of the
stack behind a gateway target by their variant folder's name; ``gateway`` names the target
itself. Every problem is a ``TargetError`` with a one-line message (the CLI exits 2).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import httpx

from backends.process_tree import listening_pid
from measure.memory import Backend, backends_of

GATEWAY = "gateway"


class TargetError(ValueError):
    """A target that cannot be benchmarked; ``str()`` is one line."""


@dataclass(frozen=True)
class Target:
    label: str  # the line's name in tables and plots: "gateway", "fp16", ...
    url: str  # base URL, no trailing slash
    kind: Literal["gateway", "tier"]
    backends: list[Backend] = field(default_factory=list)  # vLLM servers whose memory is sampled


def check_loopback(url: str) -> tuple[str, int]:
    """(base URL, port) of a loopback ``http://`` URL; ``TargetError`` otherwise (pure)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "http" or not host:
        raise TargetError(f"--target must be an http://127.0.0.1:PORT URL, not {url!r}")
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise TargetError(f"--target {url} is not on loopback (bench only loads local servers)")
    try:
        port = parts.port or 80
    except ValueError:
        raise TargetError(f"--target {url} has a bad port") from None
    return url.rstrip("/").removesuffix("/v1"), port


def parse_tiers(text: str) -> list[str]:
    """``"fp16,int8,gateway"`` → names, in order, each once (pure)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise TargetError(f"--tier names a tier twice: {text}")
    return names


def model_id(client: httpx.Client, url: str) -> str:
    """The first model ``url`` serves (``GET /v1/models``)."""
    try:
        answer = client.get(f"{url}/v1/models")
        answer.raise_for_status()
        return str(answer.json()["data"][0]["id"])
    except httpx.HTTPError as exc:
        raise TargetError(f"target {url} is unreachable: {' '.join(str(exc).split())}") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise TargetError(f"target {url} does not list a model at /v1/models") from None


def resolve_targets(url: str, tiers: list[str]) -> tuple[str, list[Target]]:
    """The served model id and the targets to run, in the order asked (the target alone when
    ``tiers`` is empty)."""
    base, port = check_loopback(url)
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        model = model_id(client, base)
        try:
            is_gateway = client.get(f"{base}/readyz").status_code != 404
        except httpx.HTTPError as exc:
            raise TargetError(f"target {base} is unreachable: {exc}") from None
    pid = listening_pid(port)
    backends = backends_of(pid) if pid is not None else []
    own = Target(GATEWAY, base, "gateway", backends) if is_gateway else None
    if own is None:
        name = backends[0].name if len(backends) == 1 else f"tier:{port}"
        own = Target(name, base, "tier", backends)
        if tiers and tiers != [name]:
            raise TargetError(f"--tier needs a gateway --target; {base} is a tier")
        return model, [own]
    if not tiers:
        return model, [own]
    by_name = {b.name: b for b in backends}
    out = []
    for name in tiers:
        if name == GATEWAY:
            out.append(own)
        elif name in by_name:
            b = by_name[name]
            out.append(Target(name, f"http://127.0.0.1:{b.port}", "tier", [b]))
        else:
            known = ", ".join([*by_name, GATEWAY])
            raise TargetError(f"unknown tier {name!r} (the stack at {base} has {known})")
    return model, out
