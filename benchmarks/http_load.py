"""A lean HTTP/1.1 load client for the benchmarks: keep-alive connections over asyncio streams.

Why not httpx (the gateway's own client): on a 2-core machine the load generator shares the
CPU with the servers it measures, and httpx spends ~1 ms of CPU per request on its own
bookkeeping — more than the proxies it measures in front of a stub. A client that costs less
leaves the CPU to the servers, so their differences show instead of the client's cost. This
one sends a prebuilt request and reads the answer's framing (Content-Length or chunked) and
nothing more; it times the first body byte (a stream's first event) and the end.

``Pool`` hands out connections to ``host:port`` (at most ``size`` open; each used by one
request at a time, kept open after a complete answer, dropped after any error).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


class LoadError(Exception):
    """The server closed, timed out or sent something that is not HTTP/1.1 framing."""


@dataclass(frozen=True)
class Answer:
    status: int
    first: float  # perf_counter when the first body byte arrived (the end, with no body)
    done: float  # perf_counter when the answer was complete
    tail: bytes  # the body's last 64 bytes


def post_bytes(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A whole HTTP/1.1 POST request, ready to write."""
    head = [f"POST {path} HTTP/1.1", f"host: {host}:{port}", f"content-length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, request: bytes) -> Answer:
        """Send ``request``, read the whole answer."""
        self.writer.write(request)
        reader = self.reader
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise LoadError("no answer head") from exc
        status_line, _, rest = head.partition(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise LoadError(f"not an HTTP answer: {status_line[:60]!r}")
        length, chunked, close = -1, False, False
        for line in rest.split(b"\r\n"):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        if chunked:
            first, tail = await self._chunks()
        elif length >= 0:
            body = await reader.readexactly(length) if length else b""
            first, tail = time.perf_counter(), body[-64:]
        else:  # the body runs to the connection's end
            body = await reader.read()
            first, tail, close = time.perf_counter(), body[-64:], True
        if close:
            self.close()
        return Answer(int(parts[1]), first, time.perf_counter(), tail)

    async def _chunks(self) -> tuple[float, bytes]:
        reader, first, tail = self.reader, 0.0, b""
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise LoadError("connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return first or time.perf_counter(), tail
            data = await reader.readexactly(size + 2)
            if not first:
                first = time.perf_counter()
            tail = (tail + data[:-2])[-64:]

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections to one server, at most ``size`` open."""

    def __init__(self, host: str, port: int, size: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._idle: list[Connection] = []
        self._slots = asyncio.Semaphore(size)

    async def request(self, raw: bytes) -> Answer:
        """One exchange on an idle connection (or a new one), within ``timeout`` seconds."""
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            try:
                async with asyncio.timeout(self.timeout):
                    if conn is None:
                        reader, writer = await asyncio.open_connection(self.host, self.port)
                        conn = Connection(reader, writer)
                    answer = await conn.exchange(raw)
            except BaseException:
                if conn is not None:
                    conn.close()
                raise
            if not conn.writer.is_closing():
                self._idle.append(conn)
            return answer

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
