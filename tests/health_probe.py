"""GET a worker's probe endpoint (worker/health.py) over real HTTP: (status, JSON body)."""

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    def fetch() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:  # 503 and 404 carry a JSON body too
            return error.code, json.loads(error.read())

    return await asyncio.to_thread(fetch)


async def ready_body(process: asyncio.subprocess.Process, port: int) -> dict[str, Any]:
    """/readyz's body once it answers 200 (polled: nothing else tells when a worker process is up)."""
    async for attempt in AsyncRetrying(
        wait=wait_fixed(0.3),
        stop=stop_after_delay(60),
        retry=retry_if_exception_type((OSError, AssertionError)),
        reraise=True,
    ):
        with attempt:
            assert process.returncode is None, "the worker exited"
            status, body = await probe(port, "/readyz")
            assert status == 200, body
    return body


async def sees_leader(port: int, identity: str, *, watching: bool, timeout: float = 15) -> None:
    """Until the worker's /readyz names `identity` as leader and says whether it runs the
    watchers (polled: a replica reads the Lease again only every retry period)."""
    async for attempt in AsyncRetrying(wait=wait_fixed(0.2), stop=stop_after_delay(timeout), reraise=True):
        with attempt:
            status, body = await probe(port, "/readyz")
            assert (status, body["leader"], body["watching"]) == (200, identity, watching), body
