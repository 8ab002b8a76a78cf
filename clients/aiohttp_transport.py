"""httpx's requests sent over aiohttp's connection pool: the Slurm client's way to slurmrestd.

The Slurm client speaks httpx (its tests and the benchmarks hand it their own transports),
but httpx's own pool (httpcore) costs CPU that grows with the connections it keeps: before
every request it hands out, and again as every answer is done, it asks each idle connection's
socket whether the server closed it (a `getpeername` and a `poll`, each a system call). In a
burst of 1,000 placements, with the pool at its 20 kept-alive connections, that check was
about a third of httpx's share of the worker's event loop, and httpx a third of the loop. An
aiohttp pool learns of a closed connection from the event loop instead, for nothing, and
parses HTTP in C; the Kubernetes client already runs on it. bench/slurm_transport.py
measures the two side by side.

What the Slurm client relies on holds as with httpx's transport:

- failures are httpx's: no connection is `ConnectError` (or `ConnectTimeout`), a connection
  that broke or an answer that is not HTTP (bytes out of step, a body cut short) is
  `RemoteProtocolError`, a read that timed out is `ReadTimeout`; the client asks a read again
  on `RemoteProtocolError` and sends no write twice;
- the request goes out as httpx built it (URL left as encoded, headers as given), and the
  answer's body is read here, within the request's read timeout;
- proxies and CA certificates follow the environment as httpx's do (`HTTP_PROXY`,
  `HTTPS_PROXY`, `NO_PROXY`, `SSL_CERT_FILE`, `SSL_CERT_DIR`); the proxy is looked up once
  per server (aiohttp's own `trust_env` would look it up, and for a `.netrc`, in a thread on
  every request).

aiohttp itself sends an idempotent request (GET, DELETE) once more when a kept-alive connection
turns out closed before the answer came; for the Slurm client that is a read, or a cancel,
which Slurm takes twice as once.
"""

import asyncio
import ssl
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

# As httpx's transport: at most 100 connections, an idle one kept for 5 s.
MAX_CONNECTIONS = 100
KEEPALIVE_SECONDS = 5.0


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport whose connections are aiohttp's (HTTP/1.1)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ssl: ssl.SSLContext | None = None
        self._proxies: dict[tuple[str, str, int | None], str | None] = {}  # by server: the proxy, or None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session_for_this_loop()
        timeout = request.extensions.get("timeout") or {}
        body = await request.aread()
        with _as_httpx_errors(request):
            async with session.request(
                request.method,
                URL(str(request.url), encoded=True),
                headers=list(request.headers.multi_items()),
                data=body or None,
                allow_redirects=False,
                proxy=self._proxy_for(request.url),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            ) as answer:
                content = await answer.read()
                headers = list(answer.raw_headers)
                status, reason = answer.status, answer.reason or ""
        return httpx.Response(
            status,
            headers=headers,
            # A stream, not `content`: httpx reads it through whatever wraps this transport.
            stream=httpx.ByteStream(content),
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason.encode("latin-1", "replace")},
        )

    async def aclose(self) -> None:
        session, self._session, self._loop = self._session, None, None
        if session is not None:
            await session.close()

    def _session_for_this_loop(self) -> aiohttp.ClientSession:
        # An aiohttp session belongs to the event loop it was made on; a client used from
        # another loop (a CLI's second asyncio.run) gets a session of its own there.
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()  # certifi or SSL_CERT_FILE, as httpx
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_SECONDS, ssl=self._ssl
                ),
                # httpx decodes a compressed answer itself, from its headers, and keeps the cookies.
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._loop = loop
        return self._session

    def _proxy_for(self, url: httpx.URL) -> str | None:
        server = (url.scheme, url.host, url.port)
        if server not in self._proxies:
            bypassed = urllib.request.proxy_bypass(url.host)  # NO_PROXY
            self._proxies[server] = None if bypassed else urllib.request.getproxies().get(url.scheme)
        return self._proxies[server]


@contextmanager
def _as_httpx_errors(request: httpx.Request) -> Iterator[None]:
    """aiohttp's failures as the httpx failures they are (the most specific first)."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as error:
        raise httpx.ConnectTimeout(_said(error, "connecting timed out"), request=request) from error
    except aiohttp.ClientConnectorError as error:
        raise httpx.ConnectError(_said(error, "cannot connect"), request=request) from error
    except (aiohttp.ServerTimeoutError, TimeoutError) as error:
        raise httpx.ReadTimeout(_said(error, "no answer in time"), request=request) from error
    except (
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientPayloadError,
        aiohttp.ClientResponseError,
        HttpProcessingError,
    ) as error:
        # Closed before the answer was whole, or an answer that is not HTTP: the connection
        # was out of step, and a read may be asked again on another.
        raise httpx.RemoteProtocolError(_said(error, "answer broken off"), request=request) from error
    except (aiohttp.ClientError, OSError) as error:
        raise httpx.ReadError(_said(error, "connection failed"), request=request) from error


def _said(error: BaseException, otherwise: str) -> str:
    """The error's words on one line (aiohttp's parser quotes the bad bytes over several)."""
    words: Any = error.message if isinstance(error, aiohttp.ClientResponseError) else str(error)
    return " ".join(str(words).split()) or otherwise
