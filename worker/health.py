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

Served with Starlette and uvicorn in the worker's own event loop, as the
webhook serves its app (webhook/command.py): so a stuck loop shows in
`/healthz`, and the server starts and stops with the worker (`HealthServer` is
entered by worker/main.py's `run_worker`). Every answer is JSON (`json.dumps`,
`Content-Type: application/json`, `Connection: close`): 405 for any method but
GET or HEAD whatever the path, 404 naming the path as it was sent. Only what is
not HTTP (nor an HTTP/1.1 request without its Host header) gets uvicorn's own
400.
"""

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

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


def answer(status: int, body: dict[str, Any]) -> Response:
    # Not JSONResponse: its compact separators and raw UTF-8 would change the bytes the
    # probes have always answered (json.dumps' ", " and ": ", non-ASCII escaped).
    return Response(json.dumps(body), status, media_type="application/json", headers={"Connection": "close"})


def probe_app(readiness: Report) -> Starlette:
    """`/healthz` (and `/livez`) and `/readyz`, GET or HEAD; anything else is answered in JSON too."""

    async def alive(_: Request) -> Response:
        return answer(200, {"alive": True})

    async def ready(_: Request) -> Response:
        try:
            report = await readiness()
        except Exception as error:  # a probe must answer, whatever went wrong
            log.exception("readiness check failed")
            report = Readiness([f"readiness check failed: {type(error).__name__}: {error}"])
        return answer(200 if report.ready else 503, report.body())

    async def refused(request: Request, _: Exception) -> Response:
        # Starlette's 404 (no such path) and 405 (not GET or HEAD) in the probes' own JSON. The
        # method is judged first, so a POST anywhere is a 405; the path is named as it was sent
        # (raw_path: percent-escapes kept).
        if request.method not in ("GET", "HEAD"):
            return answer(405, {"error": "GET only"})
        path = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
        return answer(404, {"error": f"no {path}: /healthz or /readyz"})

    app = Starlette(
        routes=[Route("/healthz", alive), Route("/livez", alive), Route("/readyz", ready)],
        exception_handlers={404: refused, 405: refused},
    )
    app.router.redirect_slashes = False  # /healthz/ is a 404 naming it, not a redirect to /healthz
    return app


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound here rather than by uvicorn.

    uvicorn logs a failed bind and calls sys.exit. Bound here, a port already
    taken raises an OSError worded as asyncio's start_server words it, which
    `slurm-bridge worker` prints as its one line ("worker stopped: [Errno 98]
    error while attempting to bind on address ('0.0.0.0', 9465): address already
    in use"), exit status 2.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted worker rebinds at once
        try:
            sock.bind((host, port))
        except OSError as error:
            reason = (error.strerror or str(error)).lower()
            raise OSError(
                error.errno, f"error while attempting to bind on address {(host, port)!r}: {reason}"
            ) from None
    except BaseException:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers.

    The process's SIGTERM and SIGINT stop the worker (worker/cli.py), and the
    worker stops this server on its way out; uvicorn's own handlers would stop
    the probes first, then raise the signal again.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HealthServer:
    """Serves `/healthz` and `/readyz` on `host:port` while entered."""

    def __init__(self, readiness: Report, port: int, host: str = "0.0.0.0") -> None:
        self.readiness = readiness
        self.port = port
        self.host = host
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "HealthServer":
        sock = listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]  # tests ask for any free port (0)
        config = uvicorn.Config(
            probe_app(self.readiness),
            host=self.host,
            port=self.port,
            lifespan="off",
            ws="none",  # an Upgrade header is ignored: the request is answered as plain HTTP
            log_config=None,  # keep the process's logging setup
            # uvicorn's loggers are process-wide (the worker runs no other uvicorn): at ERROR,
            # its start and stop lines and its warning for each malformed request (a port
            # scan) stay out of the worker's log, which has the probes' own lines.
            log_level=logging.ERROR,
            access_log=False,  # the kubelet probes every few seconds
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=5,  # a /readyz under way ends within its checks' timeouts
        )
        server = _Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="health probes")
        try:
            # The socket is bound, not yet listening: return once it is (a few turns of the loop).
            while not server.started:
                if serving.done():
                    await serving  # raises what stopped it
                    raise RuntimeError("the health server stopped while starting")
                await asyncio.sleep(0.01)
        except BaseException:
            serving.cancel()
            sock.close()
            raise
        self._server, self._serving = server, serving
        log.info("health probes on :%d (/healthz, /readyz)", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await self._serving
