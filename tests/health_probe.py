"""GET a worker's probe endpoint (worker/health.py) over real HTTP: (status, JSON body)."""

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from testbed.waiting import until


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
    seen: list[object] = ["no answer"]

    async def ready() -> dict[str, Any] | None:
        assert process.returncode is None, "the worker exited"
        status, body = await probe(port, "/readyz")
        seen[0] = body
        return body if status == 200 else None

    # An OSError: not listening yet.
    return await until(ready, lambda: f"the worker's /readyz (last: {seen[0]})", 60, 0.3, ignoring=OSError)


async def sees_leader(port: int, identity: str, *, watching: bool, timeout: float = 15) -> None:
    """Until the worker's /readyz names `identity` as leader and says whether it runs the
    watchers (polled: a replica reads the Lease again only every retry period)."""
    seen: list[object] = ["no answer"]

    async def sees() -> bool:
        status, body = await probe(port, "/readyz")
        seen[0] = body
        return (status, body.get("leader"), body.get("watching")) == (200, identity, watching)

    what = f"/readyz to name {identity} leader, watching={watching}"
    await until(sees, lambda: f"{what} (last: {seen[0]})", timeout, 0.2, ignoring=OSError)
