"""The worker's probe server and its cached remote checks, over real HTTP."""

import asyncio
import errno

import pytest

from tests.health_probe import probe
from worker.health import CachedCheck, HealthServer, Readiness


async def test_readyz_says_why_not_and_healthz_only_needs_the_loop() -> None:
    problems: list[str] = []

    async def readiness() -> Readiness:
        return Readiness(list(problems), {"identity": "replica-a"})

    async with HealthServer(readiness, 0, host="127.0.0.1") as server:
        assert await probe(server.port, "/readyz") == (
            200,
            {"ready": True, "problems": [], "identity": "replica-a"},
        )
        problems.append("the Temporal worker is not running")
        status, body = await probe(server.port, "/readyz")
        assert (status, body["ready"], body["problems"]) == (
            503,
            False,
            ["the Temporal worker is not running"],
        )
        assert await probe(server.port, "/healthz") == (200, {"alive": True})
        assert (await probe(server.port, "/metrics"))[0] == 404


async def test_a_readiness_that_raises_is_an_unready_answer_not_a_dropped_connection() -> None:
    async def readiness() -> Readiness:
        raise RuntimeError("boom")

    async with HealthServer(readiness, 0, host="127.0.0.1") as server:
        status, body = await probe(server.port, "/readyz")
    assert (status, body["problems"]) == (503, ["readiness check failed: RuntimeError: boom"])


async def test_a_cached_check_asks_at_most_once_per_interval_and_says_what_failed() -> None:
    asked: list[str] = []
    answer: list[object] = [True]

    async def check() -> object:
        asked.append("x")
        if isinstance(answer[0], Exception):
            raise answer[0]
        if answer[0] == "hang":
            await asyncio.Event().wait()  # never answers: the check's timeout must end it
        return answer[0]

    cached = CachedCheck("Temporal", check, interval=60, timeout=0.2)
    assert [await cached.problem() for _ in range(3)] == [None, None, None]
    assert len(asked) == 1  # probes every few seconds, the remote side asked once

    for given, expected in (
        (ConnectionRefusedError("refused"), "Temporal unreachable: refused"),
        ("hang", "Temporal did not answer within 0.2s"),
        (False, "Temporal reports itself unhealthy"),
    ):
        answer[0] = given
        fresh = CachedCheck("Temporal", check, interval=0, timeout=0.2)
        assert await fresh.problem() == expected


async def raw(port: int, request: bytes) -> bytes:
    """What the server sends back for `request`, written as is and followed by EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


def parse(answer: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Status line, headers (names lowercased: HTTP does not tell them apart by case), body."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    fields = (line.decode().split(":", 1) for line in lines)
    return status, {name.strip().lower(): value.strip() for name, value in fields}, body


JSON_CLOSE = {"content-type": "application/json", "connection": "close"}


@pytest.mark.parametrize(
    ("request_line", "status", "body"),
    [
        (b"GET /healthz HTTP/1.1", b"HTTP/1.1 200 OK", b'{"alive": true}'),
        (b"GET /livez HTTP/1.1", b"HTTP/1.1 200 OK", b'{"alive": true}'),
        (b"GET /readyz?verbose HTTP/1.1", b"HTTP/1.1 200 OK", b'{"ready": true, "problems": []}'),
        (
            b"GET /healthz/ HTTP/1.1",
            b"HTTP/1.1 404 Not Found",
            b'{"error": "no /healthz/: /healthz or /readyz"}',
        ),
        (b"GET /%7Ex?q HTTP/1.1", b"HTTP/1.1 404 Not Found", b'{"error": "no /%7Ex: /healthz or /readyz"}'),
        (b"POST /readyz HTTP/1.1", b"HTTP/1.1 405 Method Not Allowed", b'{"error": "GET only"}'),
        (b"DELETE /nowhere HTTP/1.1", b"HTTP/1.1 405 Method Not Allowed", b'{"error": "GET only"}'),
    ],
)
async def test_every_answer_is_json_on_a_closed_connection(
    request_line: bytes, status: bytes, body: bytes
) -> None:
    """The bytes the chart's probes and docs/configuration.md describe, byte for byte in the body."""

    async def readiness() -> Readiness:
        return Readiness([])

    async with HealthServer(readiness, 0, host="127.0.0.1") as server:
        got_status, headers, got_body = parse(await raw(server.port, request_line + b"\r\nHost: x\r\n\r\n"))
    assert (got_status, got_body) == (status, body)
    assert headers == {**JSON_CLOSE, "content-length": str(len(body))}


@pytest.mark.parametrize("path", [b"/healthz", b"/readyz", b"/nowhere"])
async def test_head_answers_the_status_and_headers_of_get_without_the_body(path: bytes) -> None:
    async def readiness() -> Readiness:
        return Readiness(["not yet"])

    async with HealthServer(readiness, 0, host="127.0.0.1") as server:
        answers = [
            parse(await raw(server.port, method + b" " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"))
            for method in (b"GET", b"HEAD")
        ]
    (get_status, get_headers, get_body), (head_status, head_headers, head_body) = answers
    assert (head_status, head_headers, head_body) == (get_status, get_headers, b"")
    assert get_body


@pytest.mark.parametrize(
    ("request_bytes", "answer_starts"),
    [
        (b"garbage", b""),  # unfinished: closed without an answer
        (b"garbage\r\n\r\n", b"HTTP/1.1 400 "),  # not HTTP
        (b"GET /healthz HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 "),  # HTTP/1.1 without its Host header
        (b"GET /healthz HTTP/1.0\r\n\r\n", b"HTTP/1.1 200 "),  # HTTP/1.0 needs none
    ],
)
async def test_odd_requests_do_not_break_the_server(request_bytes: bytes, answer_starts: bytes) -> None:
    async def readiness() -> Readiness:
        return Readiness([])

    async with HealthServer(readiness, 0, host="127.0.0.1") as server:
        answer = await raw(server.port, request_bytes)
        assert answer.startswith(answer_starts)
        assert bool(answer) == bool(answer_starts)
        assert (await probe(server.port, "/readyz"))[0] == 200


async def test_a_port_already_taken_is_one_clear_error_and_the_port_is_free_once_stopped() -> None:
    async def readiness() -> Readiness:
        return Readiness([])

    async with HealthServer(readiness, 0) as server:
        # `slurm-bridge worker` prints it as its one line: "worker stopped: <this>".
        with pytest.raises(OSError, match="error while attempting to bind") as taken:
            async with HealthServer(readiness, server.port):
                pass
        assert str(taken.value) == (
            f"[Errno {errno.EADDRINUSE}] error while attempting to bind on address "
            f"('0.0.0.0', {server.port}): address already in use"
        )
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", server.port)
    async with HealthServer(readiness, server.port):  # and it can be served again at once
        pass
