"""The worker's probe server and its cached remote checks, over real HTTP."""

import asyncio

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


@pytest.mark.parametrize(
    ("request_line", "answer_starts"),
    [(b"POST /readyz HTTP/1.1\r\n\r\n", b"HTTP/1.1 405 "), (b"garbage", b"")],  # unfinished: closed
)
async def test_odd_requests_do_not_break_the_server(request_line: bytes, answer_starts: bytes) -> None:
    async def readiness() -> Readiness:
        return Readiness([])

    async with HealthServer(readiness, 0, host="127.0.0.1") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request_line)
        writer.write_eof()
        answer = await reader.read()
        writer.close()
        assert answer.startswith(answer_starts)
        assert bool(answer) == bool(answer_starts)
        assert (await probe(server.port, "/readyz"))[0] == 200
