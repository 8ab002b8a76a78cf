"""The Slurm client's transport (httpx over aiohttp) on a real socket.

Each test runs the client against a small server that records the bytes it was sent and
answers with scripted bytes, as a slurmrestd, or what stands in front of one, might: the
requests must leave as httpx's own transport sends them, and every broken answer must
come back as the httpx failure the Slurm client tells apart (a read asked again, a write
never sent twice), never as an aiohttp exception.
"""

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import trustme

from bridge.slurm_api import JobDescMsg, UpdateNodeMsg
from clients.aiohttp_transport import AiohttpTransport
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmError, SlurmUnavailable
from tests.unit.scripted_server import Request, Script, ScriptedServer, whole

PINGS = json.dumps(
    {"pings": [{"hostname": "ctld", "pinged": "UP", "responding": True}], "errors": [], "warnings": []}
).encode()
STATES = json.dumps(
    {"jobs": [{"job_id": "5", "state": ["RUNNING"]}, {"job_id": "6", "state": ["PENDING"]}], "errors": []}
).encode()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., ScriptedServer]]:
    started: list[ScriptedServer] = []

    def make(script: Script, close_after_answer: bool = False) -> ScriptedServer:
        server = ScriptedServer(script, close_after_answer)
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    path.write_text("SLURM_JWT=the-token\n")
    return path


def client(
    url: str, token: Path, transport: httpx.AsyncBaseTransport | None = None, timeout: float = 10.0
) -> SlurmClient:
    return SlurmClient(url, user_name="slurm", token_file=token, transport=transport, timeout=timeout)


async def test_requests_leave_as_httpx_itself_sends_them(
    serve: Callable[..., ScriptedServer], token: Path
) -> None:
    """The same calls through httpx's own transport and through aiohttp's: the same bytes arrive."""
    seen: dict[str, list[Request]] = {}
    address = ""
    for name, transport in (("httpx", httpx.AsyncHTTPTransport()), ("aiohttp", AiohttpTransport())):
        server = serve(lambda n: whole(STATES if n == 1 else PINGS))
        url = await server.start()
        address = url.removeprefix("http://")
        async with client(url, token, transport) as slurm:
            assert await slurm.job_states([6, 5]) == {5: ["RUNNING"], 6: ["PENDING"]}
            with pytest.raises(SlurmError):  # the pings answer has no job id
                await slurm.submit_job(slurm_job())
            await slurm.update_node("n/1", UpdateNodeMsg(state=["DRAIN"], reason="wire"))
        seen[name] = server.requests
    ours, theirs = seen["aiohttp"], seen["httpx"]
    assert [r.line for r in ours] == [r.line for r in theirs]
    assert ours[0].line == "GET /slurm/v0.0.44/jobs/state/?job_id=5&job_id=6 HTTP/1.1"
    assert ours[2].line == "POST /slurm/v0.0.44/node/n%2F1 HTTP/1.1"  # left as encoded
    assert [r.body for r in ours] == [r.body for r in theirs]
    assert json.loads(ours[1].body)["job"]["name"] == "wire"
    for mine, httpx_own in zip(ours, theirs, strict=True):
        names = [name for name, _ in mine.headers]
        assert len(names) == len(set(names)), f"a header sent twice: {names}"
        assert dict(mine.headers)["host"] == address
        wanted = (
            "accept",
            "content-type",
            "content-length",
            "x-slurm-user-name",
            "x-slurm-user-token",
        )
        assert {k: v for k, v in mine.headers if k in wanted} == {
            k: v for k, v in httpx_own.headers if k in wanted
        }


def slurm_job() -> JobDescMsg:
    return JobDescMsg(name="wire", partition="p", flags=["EXTERNAL_JOB"])


async def test_a_body_cut_short_is_a_protocol_error_a_read_is_asked_again_a_write_not(
    serve: Callable[..., ScriptedServer], token: Path
) -> None:
    cut = whole(PINGS)[: len(whole(PINGS)) - 10]  # promises more than it sends, then closes
    server = serve(lambda n: cut, close_after_answer=True)
    async with client(await server.start(), token) as slurm:
        with pytest.raises(SlurmUnavailable, match="RemoteProtocolError"):
            await slurm.ping()
        reads = len(server.requests)
        with pytest.raises(SlurmUnavailable, match="RemoteProtocolError"):
            await slurm.submit_job(slurm_job())
    assert reads == 2  # the client's one more try
    assert [r.line.split()[0] for r in server.requests] == ["GET", "GET", "POST"]


async def test_no_answer_in_time_is_a_read_timeout(serve: Callable[..., ScriptedServer], token: Path) -> None:
    server = serve(lambda n: None)
    async with client(await server.start(), token, timeout=0.2) as slurm:
        with pytest.raises(SlurmUnavailable, match="ReadTimeout"):
            await slurm.cancel_job(7)
    assert [r.line.split()[0] for r in server.requests] == ["DELETE"]


async def test_a_proxy_page_is_quoted_with_its_status(
    serve: Callable[..., ScriptedServer], token: Path
) -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    server = serve(lambda n: whole(page, "502 Bad Gateway", "text/html"))
    async with client(await server.start(), token) as slurm:
        with pytest.raises(SlurmUnavailable, match="502 Bad Gateway") as caught:
            await slurm.ping()
    assert caught.value.status == 502


async def test_a_client_serves_one_event_loop_after_another(
    serve: Callable[..., ScriptedServer], token: Path
) -> None:
    """A CLI may call asyncio.run twice with one client: the second loop gets its own connections."""
    server = serve(lambda n: whole(PINGS))
    url = await server.start()
    slurm = client(url, token)
    server_loop = asyncio.get_running_loop()

    def ping_from_a_loop_of_its_own() -> list[str]:
        async def ping() -> list[str]:
            # The server runs on the test's loop: it is asked there, from this thread's loop.
            return [p.hostname for p in await slurm.ping() if p.hostname]

        return asyncio.run(ping())

    for _ in range(2):
        assert await asyncio.to_thread(ping_from_a_loop_of_its_own) == ["ctld"]
    assert server_loop.is_running()
    assert len(server.requests) == 2
    await slurm.close()


async def test_an_https_slurmrestd_is_checked_against_ssl_cert_file(
    serve: Callable[..., ScriptedServer], token: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with httpx's own transport: certifi's CAs, or SSL_CERT_FILE's when it is set."""
    ca = trustme.CA()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    server = serve(lambda n: whole(PINGS))
    url = await server.start(tls)
    async with client(url, token) as slurm:
        with pytest.raises(SlurmUnavailable, match=r"ConnectError.*certificate"):
            await slurm.ping()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    async with client(url, token) as slurm:
        assert [p.hostname for p in await slurm.ping()] == ["ctld"]
    assert [r.line for r in server.requests] == ["GET /slurm/v0.0.44/ping/ HTTP/1.1"]


async def test_a_proxy_from_the_environment_is_used_unless_no_proxy_names_the_server(
    serve: Callable[..., ScriptedServer], token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = serve(lambda n: whole(PINGS))
    monkeypatch.setenv("HTTP_PROXY", await proxy.start())
    async with client("http://slurmrestd.invalid:6820", token) as slurm:
        assert [p.hostname for p in await slurm.ping()] == ["ctld"]
    assert [r.line for r in proxy.requests] == [
        "GET http://slurmrestd.invalid:6820/slurm/v0.0.44/ping/ HTTP/1.1"
    ]
    monkeypatch.setenv("NO_PROXY", "slurmrestd.invalid")
    async with client("http://slurmrestd.invalid:6820", token) as slurm:
        with pytest.raises(SlurmUnavailable, match="ConnectError"):  # no such name, asked directly
            await slurm.ping()
    assert len(proxy.requests) == 1


class Tap(httpx.AsyncBaseTransport):
    """Wraps a transport as the benchmark's request counter does: the answers' bytes as httpx reads them."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.bytes_read = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = Tapped(response.stream, self)
        return response


class Tapped(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, tap: Tap) -> None:
        self.inner, self.tap = inner, tap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.tap.bytes_read += len(chunk)
            yield chunk


async def test_an_answer_is_read_through_a_transport_that_wraps_this_one(
    serve: Callable[..., ScriptedServer], token: Path
) -> None:
    server = serve(lambda n: whole(STATES))
    tap = Tap(AiohttpTransport())
    async with client(await server.start(), token, tap) as slurm:
        assert await slurm.job_states([5, 6]) == {5: ["RUNNING"], 6: ["PENDING"]}
    assert tap.bytes_read == len(STATES)
