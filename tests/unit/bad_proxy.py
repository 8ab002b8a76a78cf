"""A proxy between the bridge and the fake API server that sometimes answers by itself.

What sits in front of an API server (a load balancer, an authenticating proxy, a
tunnel) may answer in its own words: an HTML error page, a body cut short, a
watch stream cut mid-line or carrying a line that is not JSON. `BadProxy` passes
every request on to the fake API server, except the ones a test scripted an
answer for (`answer_next`): those get the scripted bytes, written as they are,
since no well-behaved server would send them.

Every answer ends its connection (`Connection: close`), so the bytes of a scripted
answer can never run into the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import aiohttp
from kubernetes.aio import client as kclient

# Headers passed on to the API server: who asks and what is sent; no hop-by-hop ones.
FORWARDED_REQUEST_HEADERS = ("authorization", "content-type", "accept")


def answer(
    status: int,
    reason: str,
    body: bytes,
    content_type: str = "text/html",
    *,
    length: int | None = None,
) -> bytes:
    """One whole HTTP answer; a `length` above len(body) promises more than is sent (a body cut short)."""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def stream(*chunks: bytes, end: bool = True) -> bytes:
    """A 200 chunked JSON answer, as a watch stream is; without `end` it is cut (no last chunk)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    return head + b"Connection: close\r\n\r\n" + body + (b"0\r\n\r\n" if end else b"")


@dataclass
class Scripted:
    """The next `remaining` requests matching `method` and `pattern` (searched in `path?query`)."""

    method: str
    pattern: re.Pattern[str]
    answer: bytes
    remaining: int
    used: int = 0


class BadProxy:
    def __init__(self, upstream: str, token: str | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.token = token
        self.requests: list[str] = []  # "METHOD path?query", every request in arrival order
        self._scripts: list[Scripted] = []
        self._changed = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> BadProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        assert self._session is not None
        self._server.close()
        # Forwarded watch streams wait on the fake API server: end them, or they outlive the test.
        for handler in list(self._handlers):
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        await self._session.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def configuration(self) -> kclient.Configuration:
        """The bridge's client configuration, pointed at this proxy."""
        configuration = kclient.Configuration(host=self.url)
        if self.token:
            configuration.api_key = {"authorization": f"Bearer {self.token}"}
        return configuration

    def answer_next(self, method: str, pattern: str, raw: bytes, count: int = 1) -> Scripted:
        """Answer the next `count` requests of `method` whose `path?query` matches `pattern` with `raw`."""
        script = Scripted(method.upper(), re.compile(pattern), raw, count)
        self._scripts.append(script)
        return script

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Until `predicate()` holds, checked again after every request this proxy answered."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    # -- serving ---------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._answer(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, aiohttp.ClientError):
            pass  # the client, or the fake API server, went away
        except asyncio.CancelledError:
            # Only __aexit__ cancels a handler (a forwarded watch still open): it ends quietly,
            # since asyncio logs a connection callback whose task ended cancelled as an error.
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            async with self._changed:
                self._changed.notify_all()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *header_lines = head.split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        self.requests.append(f"{method} {target}")
        script = self._take(method, target)
        if script is not None:
            writer.write(script.answer)
            await writer.drain()
            return
        await self._forward(method, target, headers, body, writer)

    def _take(self, method: str, target: str) -> Scripted | None:
        for script in self._scripts:
            if script.remaining > 0 and script.method == method and script.pattern.search(target):
                script.remaining -= 1
                script.used += 1
                return script
        return None

    async def _forward(
        self, method: str, target: str, headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter
    ) -> None:
        assert self._session is not None
        sent = {name: headers[name] for name in FORWARDED_REQUEST_HEADERS if name in headers}
        async with self._session.request(
            method, self.upstream + target, headers=sent, data=body or None
        ) as upstream:
            head = f"HTTP/1.1 {upstream.status} {upstream.reason}\r\n"
            for name in ("Content-Type", "Retry-After"):
                if name in upstream.headers:
                    head += f"{name}: {upstream.headers[name]}\r\n"
            writer.write(f"{head}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode())
            # Passed on as it comes: a watch stream's events reach the client one by one.
            async for chunk in upstream.content.iter_any():
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
