"""backends/llama_reset.py: slots erased, the probe's verdict, against a fake server."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from backends.llama_reset import PROBE_TOKENS, judge, probe_body, reset_slots, slot_ids


class FakeServer:
    """Two slots; a probe prompt is cached in a slot until that slot is erased."""

    def __init__(self, erase_works: bool = True) -> None:
        self.cached: dict[int, list[int]] = {0: [], 1: []}
        self.erase_works = erase_works
        self.calls: list[str] = []

    async def call(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        self.calls.append(f"{method} {path}")
        if path == "/slots":
            return [{"id": 0, "n_ctx": 2048}, {"id": 1, "n_ctx": 2048}]
        if path.startswith("/slots/"):
            slot = int(path.split("/")[2].split("?")[0])
            erased = len(self.cached[slot])
            if self.erase_works:
                self.cached[slot] = []
            return {"id_slot": slot, "n_erased": erased}
        assert body is not None
        prompt = list(body["prompt"])
        hit = len(prompt) - 1 if self.cached[0] == prompt else 0
        self.cached[0] = prompt
        return {"content": "x", "timings": {"cache_n": hit}}


def test_the_probe_is_exact_token_ids() -> None:
    body = probe_body()
    assert len(body["prompt"]) == PROBE_TOKENS and body["n_predict"] == 1
    assert all(isinstance(t, int) and t >= 1000 for t in body["prompt"])


def test_every_slot_is_erased_and_the_probe_proves_it() -> None:
    server = FakeServer()
    verified, detail = asyncio.run(reset_slots(server.call, verify=True))
    assert verified, detail
    assert "found 0 cached tokens" in detail and f"{PROBE_TOKENS - 1} cached" in detail
    assert "POST /slots/0?action=erase" in server.calls
    assert "POST /slots/1?action=erase" in server.calls


def test_an_erase_that_does_not_empty_the_cache_is_not_verified() -> None:
    verified, detail = asyncio.run(reset_slots(FakeServer(erase_works=False).call, True))
    assert not verified and "left 63 of the 64 probe tokens cached" in detail


def test_verdicts_and_slots() -> None:
    assert judge(63, 0, 64)[0]
    assert judge(0, 0, 64) == (
        False,
        "cannot verify: the probe was not cached even before the reset",
    )
    assert not judge(None, 0, 64)[0]
    assert slot_ids([{"id": 0}, {"id": "x"}, "junk", {"id": 3}]) == [0, 3]
    assert slot_ids({"id": 0}) == []
    verified, detail = asyncio.run(reset_slots(FakeServer().call, verify=False))
    assert not verified and detail.startswith("not verified")
