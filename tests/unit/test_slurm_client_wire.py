"""SlurmClient on a real socket, against answers a slurmrestd (or what stands in front of one) gave.

Bytes past an answer's Content-Length: slurmrestd 26.05 follows each error answer with a
second, plain-text answer to the same request (below, as captured); and once in CI (an e2e
test's `GET /job/{id}` on a kept-alive connection) `       "number": 1795783166`, a line of
pretty-printed JSON, was read as the answer's status line. Those bytes came in front of the
answer itself (h11 saw its blank line), not while the connection lay idle (httpcore drops an
idle connection that has something to read), so the server sent them after the next request
came: the tail of an earlier answer, longer than its Content-Length said. Wherever they come
from, a reused connection out of step must not fail a read the bridge can simply ask again; a
request that changes something is never sent twice (Slurm may have acted on it).
"""

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from bridge.slurm_api import JobDescMsg
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmRejected, SlurmUnavailable
from tests.unit.scripted_server import ScriptedServer, whole

PINGS = json.dumps(
    {"pings": [{"hostname": "ctld", "pinged": "UP", "responding": True}], "errors": [], "warnings": []}
).encode()
# What came before an answer in CI: the tail of pretty-printed JSON.
STRAY = b'       "number": 1795783166\n     },\n'


@pytest.fixture
async def server() -> AsyncIterator[tuple[ScriptedServer, str]]:
    """Keeps its connections open; its second answer comes after stray bytes, in the same write."""
    served = ScriptedServer(lambda n: (STRAY if n == 2 else b"") + whole(PINGS))
    url = await served.start()
    yield served, url
    await served.stop()


def client_of(url: str, tmp_path: Path, timeout: float = 10.0) -> SlurmClient:
    token = tmp_path / "jwt"
    token.write_text("token")
    return SlurmClient(url, user_name="slurm", token_file=token, timeout=timeout)


async def test_a_read_on_a_connection_out_of_step_is_asked_again(
    server: tuple[ScriptedServer, str], tmp_path: Path
) -> None:
    served, url = server
    async with client_of(url, tmp_path) as client:
        await client.ping()
        # The kept-alive connection holds the stray bytes: this read meets them first.
        pings = await client.ping()
    assert [ping.hostname for ping in pings] == ["ctld"]
    assert [r.line for r in served.requests] == ["GET /slurm/v0.0.44/ping/ HTTP/1.1"] * 3
    assert served.connections == 2  # the spoilt connection was dropped, not used again


async def test_a_write_on_a_connection_out_of_step_is_not_sent_twice(
    server: tuple[ScriptedServer, str], tmp_path: Path
) -> None:
    served, url = server
    async with client_of(url, tmp_path) as client:
        await client.ping()
        with pytest.raises(SlurmUnavailable, match="illegal status line"):
            await client.cancel_job(7)
    assert [r.line.split()[0] for r in served.requests] == ["GET", "DELETE"]


# What slurmrestd 26.05 sends for a refused submission (captured on the test bed, 2026-11-28,
# the errors entry kept, `meta` left out): the JSON answer, and in the same write a second,
# plain-text answer to the same request. It says `Connection: Close`, so a client reads the
# first and drops the connection; aiohttp's parser refuses the whole as "Data after
# `Connection: close`", which is why the Slurm client stays on httpx's own transport.
REFUSED = json.dumps(
    {
        "errors": [
            {
                "description": "Batch job submission failed",
                "error_number": 2000,
                "error": "Invalid partition name specified",
                "source": "slurm_submit_batch_job()",
            }
        ],
        "warnings": [],
    },
    indent=2,
).encode()
TWO_ANSWERS = (
    b"HTTP/1.1 422 UNPROCESSABLE CONTENT\r\nConnection: Close\r\n"
    + f"Content-Length: {len(REFUSED)}\r\nContent-Type: application/json\r\n\r\n".encode()
    + REFUSED
    + b"HTTP/1.1 422 UNPROCESSABLE CONTENT\r\nConnection: Close\r\nContent-Length: 32\r\n"
    + b"Content-Type: text/plain\r\n\r\nInvalid partition name specified"
)


async def test_a_refusal_followed_by_a_second_answer_is_read_as_the_refusal(tmp_path: Path) -> None:
    served = ScriptedServer(lambda n: TWO_ANSWERS, close_after_answer=True)
    async with client_of(await served.start(), tmp_path) as client:
        with pytest.raises(SlurmRejected, match="Invalid partition name specified") as caught:
            await client.submit_job(JobDescMsg(name="wire", partition="nope", flags=["EXTERNAL_JOB"]))
    await served.stop()
    assert caught.value.status == 422
    assert [r.line.split()[0] for r in served.requests] == ["POST"]


async def test_a_body_cut_short_is_asked_again_if_a_read_never_if_a_write(tmp_path: Path) -> None:
    whole_answer = whole(PINGS)
    served = ScriptedServer(lambda n: whole_answer[:-10], close_after_answer=True)  # promises 10 bytes more
    async with client_of(await served.start(), tmp_path) as client:
        with pytest.raises(SlurmUnavailable, match="RemoteProtocolError"):
            await client.ping()
        with pytest.raises(SlurmUnavailable, match="RemoteProtocolError"):
            await client.submit_job(JobDescMsg(name="wire", partition="p", flags=["EXTERNAL_JOB"]))
    await served.stop()
    assert [r.line.split()[0] for r in served.requests] == ["GET", "GET", "POST"]


async def test_no_answer_in_time_is_unavailable(tmp_path: Path) -> None:
    served = ScriptedServer(lambda n: None)
    async with client_of(await served.start(), tmp_path, timeout=0.2) as client:
        with pytest.raises(SlurmUnavailable, match="ReadTimeout"):
            await client.cancel_job(7)
    await served.stop()
    assert [r.line.split()[0] for r in served.requests] == ["DELETE"]


async def test_a_proxy_page_is_quoted_with_its_status(tmp_path: Path) -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    served = ScriptedServer(lambda n: whole(page, "502 Bad Gateway", "text/html"))
    async with client_of(await served.start(), tmp_path) as client:
        with pytest.raises(SlurmUnavailable, match="502 Bad Gateway") as caught:
            await client.ping()
    await served.stop()
    assert caught.value.status == 502


async def test_an_https_slurmrestd_is_checked_against_ssl_cert_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/configuration.md: certifi's CAs, or SSL_CERT_FILE's when it is set."""
    ca = trustme.CA()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    served = ScriptedServer(lambda n: whole(PINGS))
    url = await served.start(tls)
    async with client_of(url, tmp_path) as client:
        with pytest.raises(SlurmUnavailable, match=r"ConnectError.*CERTIFICATE_VERIFY_FAILED"):
            await client.ping()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    async with client_of(url, tmp_path) as client:
        assert [p.hostname for p in await client.ping()] == ["ctld"]
    await served.stop()
    assert [r.line for r in served.requests] == ["GET /slurm/v0.0.44/ping/ HTTP/1.1"]


async def test_a_proxy_from_the_environment_is_used_unless_no_proxy_names_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/configuration.md: HTTP_PROXY, HTTPS_PROXY and NO_PROXY apply."""
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    proxy = ScriptedServer(lambda n: whole(PINGS))
    address = await proxy.start()
    for name in ("http_proxy", "HTTP_PROXY"):  # the lower-case one wins where both are set
        monkeypatch.setenv(name, address)
    async with client_of("http://slurmrestd.invalid:6820", tmp_path) as client:
        assert [p.hostname for p in await client.ping()] == ["ctld"]
    assert [r.line for r in proxy.requests] == [
        "GET http://slurmrestd.invalid:6820/slurm/v0.0.44/ping/ HTTP/1.1"
    ]
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "slurmrestd.invalid")
    async with client_of("http://slurmrestd.invalid:6820", tmp_path) as client:
        with pytest.raises(SlurmUnavailable, match="ConnectError"):  # no such name, asked directly
            await client.ping()
    await proxy.stop()
    assert len(proxy.requests) == 1
