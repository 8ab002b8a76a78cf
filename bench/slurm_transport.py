"""The Slurm client's CPU per request, over httpx's own transport and over aiohttp's.

    .venv/bin/python -m bench.slurm_transport [--requests 2000] [--connections 20] [--rounds 3]

Against the running Slurm bed (started if it is not), one client per transport asks
`GET /jobs/state/?job_id=1` (a read slurmctld answers in a few milliseconds), first with
`--connections` requests at once (the pool then holds that many connections, as the
worker's does in a burst), then one at a time with those connections idle (as between the
job watcher's passes). It prints this process's CPU per request (the client's own cost:
building the request, the pool, parsing the answer) and the wall time per request; the
transports alternate, round after round, so a machine that slows down slows both.
"""

import argparse
import asyncio
import time
from collections.abc import Callable

import httpx

from bench.placement.environment import connect_slurm
from clients.aiohttp_transport import AiohttpTransport
from clients.slurm_client import SlurmClient

TRANSPORTS: dict[str, Callable[[], httpx.AsyncBaseTransport]] = {
    "httpx (httpcore)": httpx.AsyncHTTPTransport,
    "aiohttp": AiohttpTransport,
}


async def measure(client: SlurmClient, requests: int, at_once: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per request, `requests` of them with at most `at_once` in flight."""
    room = asyncio.Semaphore(at_once)

    async def one() -> None:
        async with room:
            await client.job_states([1])

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    return (time.process_time() - cpu) / requests * 1e6, (time.perf_counter() - wall) / requests * 1e6


async def run(requests: int, connections: int, rounds: int) -> None:
    bed = connect_slurm()
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name, transport in TRANSPORTS.items():
            async with SlurmClient(
                bed.rest_url, user_name=bed.user_name, token_file=bed.jwt_file, transport=transport()
            ) as c:
                await measure(c, connections * 5, connections)  # warm: the pool fills, the token is read
                figures.setdefault((name, f"{connections} at once"), []).append(
                    await measure(c, requests, connections)
                )
                figures.setdefault((name, f"one at a time, {connections} idle"), []).append(
                    await measure(c, requests, 1)
                )
    print(f"Slurm client per request, {requests} requests a phase, {rounds} rounds (median of rounds)")
    print(f"  {'transport':<18} {'phase':<28} {'CPU µs':>8} {'wall µs':>8}")
    for (name, phase), runs in figures.items():
        cpu = sorted(c for c, _ in runs)[len(runs) // 2]
        wall = sorted(w for _, w in runs)[len(runs) // 2]
        print(f"  {name:<18} {phase:<28} {cpu:>8.0f} {wall:>8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per phase")
    parser.add_argument("--connections", type=int, default=20, help="requests at once (the pool's size)")
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    asyncio.run(run(a.requests, a.connections, a.rounds))


if __name__ == "__main__":
    main()
