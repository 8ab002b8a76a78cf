"""SlurmClient on a real socket, against a slurmrestd whose answer runs past its Content-Length.

Seen once in CI (slurmrestd 26.05, an e2e test's `GET /job/{id}` on a kept-alive
connection): `       "number": 1795783166`, a line of pretty-printed JSON, was read
as the answer's status line. The bytes came in front of the answer itself (h11 saw its
blank line), not while the connection lay idle (httpcore drops an idle connection
that has something to read), so the server sent them after the next request came:
the tail of an earlier answer, longer than its Content-Length said. Wherever they
come from, a reused connection out of step must not fail a read the bridge can
simply ask again; a request that changes something is never sent twice (Slurm may
have acted on it).
"""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmUnavailable

PINGS = json.dumps(
    {"pings": [{"hostname": "ctld", "pinged": "UP", "responding": True}], "errors": [], "warnings": []}
).encode()
# What came before an answer in CI: the tail of pretty-printed JSON.
STRAY = b'       "number": 1795783166\n     },\n'


def answer(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class OutOfStepServer:
    """Keeps its connections open; its second answer comes after stray bytes, in the same write."""

    def __init__(self) -> None:
        self.requests: list[str] = []  # request lines, in the order they came
        self.connections = 0
        self._answered = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                self.requests.append(head.split(b"\r\n", 1)[0].decode())
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self._answered += 1
                writer.write((STRAY if self._answered == 2 else b"") + answer(PINGS))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[OutOfStepServer, str]]:
    served = OutOfStepServer()
    url = await served.start()
    yield served, url
    await served.stop()


def client_of(url: str, tmp_path: Path) -> SlurmClient:
    token = tmp_path / "jwt"
    token.write_text("token")
    return SlurmClient(url, user_name="slurm", token_file=token)


async def test_a_read_on_a_connection_out_of_step_is_asked_again(
    server: tuple[OutOfStepServer, str], tmp_path: Path
) -> None:
    served, url = server
    async with client_of(url, tmp_path) as client:
        await client.ping()
        # The kept-alive connection holds the stray bytes: this read meets them first.
        pings = await client.ping()
    assert [ping.hostname for ping in pings] == ["ctld"]
    assert served.requests == ["GET /slurm/v0.0.44/ping/ HTTP/1.1"] * 3
    assert served.connections == 2  # the spoilt connection was dropped, not used again


async def test_a_write_on_a_connection_out_of_step_is_not_sent_twice(
    server: tuple[OutOfStepServer, str], tmp_path: Path
) -> None:
    served, url = server
    async with client_of(url, tmp_path) as client:
        await client.ping()
        with pytest.raises(SlurmUnavailable, match=r"RemoteProtocolError: Bad status line"):
            await client.cancel_job(7)
    assert [line.split()[0] for line in served.requests] == ["GET", "DELETE"]
