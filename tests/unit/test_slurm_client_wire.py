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

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmUnavailable
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


def client_of(url: str, tmp_path: Path) -> SlurmClient:
    token = tmp_path / "jwt"
    token.write_text("token")
    return SlurmClient(url, user_name="slurm", token_file=token)


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
        with pytest.raises(SlurmUnavailable, match=r"RemoteProtocolError: Bad status line"):
            await client.cancel_job(7)
    assert [r.line.split()[0] for r in served.requests] == ["GET", "DELETE"]
