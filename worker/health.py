"""The worker's probes on HEALTH_PORT: `/healthz` (alive) and `/readyz` (can serve).

`/healthz` answers 200 whenever the event loop does: a loop stuck in a
blocking call fails it, which a TCP check of the metrics port (served by the
Temporal runtime's own thread) never showed.

`/readyz` answers 200 when the replica can serve, else 503; both with a JSON
body saying why, which replica this is and whether it leads. A replica can
serve when its Temporal worker runs, the Temporal frontend answers its health
check, and Kubernetes answers: with leader election that is the elector's own
check (the API server answered about the Lease within the lease duration, and
a leader renewed within it: a leader whose renewal fails is not ready), without
it the pod watcher's list/watch. A standby is ready: it serves activities and
workflow tasks.

The server is a few lines of asyncio, not a web framework: two GET routes,
one short response per connection.
"""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Report = Callable[[], Awaitable["Readiness"]]


@dataclass(frozen=True)
class Readiness:
    problems: list[str]
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return not self.problems

    def body(self) -> dict[str, Any]:
        return {"ready": self.ready, "problems": self.problems, **self.detail}


class CachedCheck:
    """A remote health check asked at most every `interval` seconds, each bounded by `timeout`.

    Probes come every few seconds from the kubelet (and from anyone who curls
    the port): the remote side sees one request per interval, whatever the
    probe rate.
    """

    def __init__(
        self, name: str, check: Callable[[], Awaitable[object]], interval: float = 5.0, timeout: float = 3.0
    ) -> None:
        self.name = name
        self.check = check
        self.interval = interval
        self.timeout = timeout
        self._checked_at = float("-inf")
        self._problem: str | None = None
        self._lock = asyncio.Lock()

    async def problem(self) -> str | None:
        async with self._lock:
            if time.monotonic() - self._checked_at >= self.interval:
                self._problem = await self._ask()
                self._checked_at = time.monotonic()
            return self._problem

    async def _ask(self) -> str | None:
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self.check()
        except TimeoutError:
            return f"{self.name} did not answer within {self.timeout:g}s"
        except Exception as error:
            return f"{self.name} unreachable: {error}"
        return None if answer is not False else f"{self.name} reports itself unhealthy"


class HealthServer:
    """Serves `/healthz` and `/readyz` on `host:port` while entered."""

    def __init__(self, readiness: Report, port: int, host: str = "0.0.0.0") -> None:
        self.readiness = readiness
        self.port = port
        self.host = host
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> "HealthServer":
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        if self.port == 0:  # tests ask for any free port
            self.port = self._server.sockets[0].getsockname()[1]
        log.info("health probes on :%d (/healthz, /readyz)", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                request = await reader.readuntil(b"\r\n\r\n")
                status, body = await self._answer(request.split(b"\r\n", 1)[0].decode("latin-1"))
            payload = json.dumps(body).encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that went away or never finished its request
        finally:
            writer.close()

    async def _answer(self, request_line: str) -> tuple[str, dict[str, Any]]:
        method, _, rest = request_line.partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", {"error": "GET only"}
        if path in ("/healthz", "/livez"):
            return "200 OK", {"alive": True}
        if path == "/readyz":
            try:
                readiness = await self.readiness()
            except Exception as error:  # a probe must answer, whatever went wrong
                log.exception("readiness check failed")
                readiness = Readiness([f"readiness check failed: {type(error).__name__}: {error}"])
            return ("200 OK" if readiness.ready else "503 Service Unavailable"), readiness.body()
        return "404 Not Found", {"error": f"no {path}: /healthz or /readyz"}
