"""GET a worker's probe endpoint (worker/health.py) over real HTTP: (status, JSON body)."""

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    def fetch() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:  # 503 and 404 carry a JSON body too
            return error.code, json.loads(error.read())

    return await asyncio.to_thread(fetch)
