"""``unless_client_leaves`` (gateway/request/stream/relay.py): the work's answer, or None once the
client disconnects, with the watcher gone either way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from gateway.request.stream.relay import unless_client_leaves


def _request(disconnect: asyncio.Event) -> Request:
    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def _watchers() -> int:
    current = asyncio.current_task()
    return sum(1 for task in asyncio.all_tasks() if task is not current and not task.done())


def test_the_work_answers_and_the_watcher_goes() -> None:
    async def main() -> tuple[str | None, int]:
        async def work() -> str:
            await asyncio.sleep(0.01)
            return "answer"

        got = await unless_client_leaves(_request(asyncio.Event()), work)
        await asyncio.sleep(0)  # the cancelled watcher finishes
        return got, _watchers()

    assert asyncio.run(main()) == ("answer", 0)


def test_a_disconnect_cancels_the_work() -> None:
    async def main() -> tuple[str | None, bool, float]:
        left = asyncio.Event()
        cancelled = False

        async def work() -> str:
            nonlocal cancelled
            asyncio.get_running_loop().call_later(0.05, left.set)
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled = True
                raise
            return "too late"

        started = asyncio.get_running_loop().time()
        got = await unless_client_leaves(_request(left), work)
        return got, cancelled, asyncio.get_running_loop().time() - started

    got, cancelled, took = asyncio.run(main())
    assert got is None and cancelled
    assert took < 5


def test_the_works_error_propagates_and_the_watcher_goes() -> None:
    async def main() -> int:
        async def work() -> str:
            raise ValueError("tier said no")

        with pytest.raises(ValueError, match="tier said no"):
            await unless_client_leaves(_request(asyncio.Event()), work)
        await asyncio.sleep(0)
        return _watchers()

    assert asyncio.run(main()) == 0


def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    """Cancelled from outside (the server shutting down), the call does not return None as if
    the client had left: the cancellation goes on."""

    async def main() -> None:
        async def work() -> str:
            await asyncio.sleep(10)
            return "never"

        task = asyncio.ensure_future(unless_client_leaves(_request(asyncio.Event()), work))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
