"""A real uvicorn server for tests: an ASGI app on 127.0.0.1 (a free port) in a thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

WAIT = 10.0  # upper bound for starting or stopping


def port_is_free(port: int) -> bool:
    """Whether a plain bind (no SO_REUSEADDR, as another program's would be) gets ``port`` on
    127.0.0.1 now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ServerThread:
    """Runs an ASGI app with uvicorn on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app: Any, graceful: float | None = 1, **options: Any) -> None:
        """``options``: more ``uvicorn.Config`` settings (the gateway's: gateway/server.py);
        ``graceful``: uvicorn's ``timeout_graceful_shutdown``, 1 s whatever ``options`` say so
        that a test's open streams do not slow its teardown (None: as ``options`` say)."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        settings = {"log_level": "warning", "lifespan": "on", **options}
        if graceful is not None:
            settings["timeout_graceful_shutdown"] = graceful
        config = uvicorn.Config(app, **settings)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:  # uvicorn exposes no event for this
            assert self.thread.is_alive(), "uvicorn exited during startup"
            assert time.monotonic() < deadline, "uvicorn did not start in time"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(WAIT)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"
