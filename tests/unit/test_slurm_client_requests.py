"""SlurmClient's requests as sent: job_states' query strings, timeouts per kind of request (no Slurm)."""

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from bridge.slurm_api import API_VERSIONS
from clients.slurm_client import JOB_STATE_CHUNK, MAX_QUERY_CHARS, SlurmClient
from clients.slurm_errors import SlurmError

EMPTY_JOBS: dict[str, list[object]] = {"jobs": [], "errors": [], "warnings": []}


class Recorder:
    """A fake slurmrestd: records each request and answers `/jobs/state/` like 26.05 does."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.known: set[int] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path.endswith("/jobs/state/"):
            asked = [int(value) for name, value in parse_qsl(request.url.query.decode()) if name == "job_id"]
            jobs = [{"job_id": str(i), "state": ["RUNNING"]} for i in asked if i in self.known]
            return httpx.Response(200, json={"jobs": jobs, "errors": [], "warnings": []})
        return httpx.Response(200, json=EMPTY_JOBS)

    def read_timeout(self, index: int) -> float:
        timeout = self.requests[index].extensions["timeout"]
        return float(timeout["read"])


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def client(
    recorder: Recorder, tmp_path: Path, timeout: float = 10.0, listing_timeout: float = 60.0, **more: Any
) -> SlurmClient:
    token = tmp_path / "jwt"
    token.write_text("token")
    return SlurmClient(
        "http://slurmrestd:6820",
        user_name="slurm",
        token_file=token,
        transport=httpx.MockTransport(recorder),
        timeout=timeout,
        listing_timeout=listing_timeout,
        **more,
    )


async def test_job_states_repeats_the_parameter_in_bounded_chunks(recorder: Recorder, tmp_path: Path) -> None:
    # 8-digit ids (MaxJobId is 67,043,328): the query-string bound cuts chunks, not the count.
    ids = list(range(10_000_000, 10_001_200))
    recorder.known = set(ids[::3])
    async with client(recorder, tmp_path) as slurm:
        states = await slurm.job_states(ids)

    assert states == {job_id: ["RUNNING"] for job_id in recorder.known}
    asked: list[int] = []
    for request in recorder.requests:
        query = request.url.query.decode()
        assert len(query) <= MAX_QUERY_CHARS
        assert "," not in query  # never the CSV form: slurmrestd answers it with 500
        pairs = parse_qsl(query)
        assert {name for name, _ in pairs} == {"job_id"}
        assert len(pairs) <= JOB_STATE_CHUNK
        asked += [int(value) for _, value in pairs]
    assert sorted(asked) == ids  # each id asked exactly once
    assert len(recorder.requests) == 5  # 1,200 ids of 16 characters in 4,000-character queries


async def test_job_states_chunk_size_and_duplicates(recorder: Recorder, tmp_path: Path) -> None:
    async with client(recorder, tmp_path) as slurm:
        await slurm.job_states([3, 1, 2, 3, 1], chunk_size=2)
    assert [urlsplit(str(r.url)).query for r in recorder.requests] == ["job_id=1&job_id=2", "job_id=3"]


async def test_job_states_refuses_a_garbled_answer(tmp_path: Path) -> None:
    def garbled(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"jobs": [{"job_id": "x", "state": "RUNNING"}], "errors": []})

    token = tmp_path / "jwt"
    token.write_text("token")
    async with SlurmClient(
        "http://s:6820", user_name="slurm", token_file=token, transport=httpx.MockTransport(garbled)
    ) as slurm:
        with pytest.raises(SlurmError, match="unexpected answer"):
            await slurm.job_states([1])


async def test_listing_every_job_waits_longer_than_point_requests(recorder: Recorder, tmp_path: Path) -> None:
    async with client(recorder, tmp_path, timeout=7.0, listing_timeout=45.0) as slurm:
        await slurm.list_jobs()
        await slurm.list_jobs(update_time=123)
        await slurm.job_states([1])
        await slurm.list_partitions()

    assert [recorder.read_timeout(i) for i in range(4)] == [45.0, 45.0, 7.0, 7.0]
    # Connecting fails as fast for a listing as for anything else.
    assert recorder.requests[0].extensions["timeout"]["connect"] == 7.0


async def test_listing_timeout_is_never_shorter_than_the_point_timeout(
    recorder: Recorder, tmp_path: Path
) -> None:
    async with client(recorder, tmp_path, timeout=30.0, listing_timeout=5.0) as slurm:
        await slurm.list_jobs()
    assert recorder.read_timeout(0) == 30.0


async def test_observer_counts_listings_and_state_probes_apart(recorder: Recorder, tmp_path: Path) -> None:
    seen: list[str] = []
    async with client(
        recorder, tmp_path, observer=lambda operation, outcome, seconds: seen.append(operation)
    ) as slurm:
        await slurm.list_jobs(update_time=5)
        await slurm.job_states([1, 2])
    assert seen == ["GET /jobs/", "GET /jobs/state/"]


@pytest.mark.parametrize("version", API_VERSIONS)
async def test_every_request_goes_to_the_configured_api_version(
    recorder: Recorder, tmp_path: Path, version: str
) -> None:
    async with client(recorder, tmp_path, api_version=version) as slurm:
        await slurm.list_jobs()
        await slurm.job_states([1])
    assert [r.url.path for r in recorder.requests] == [
        f"/slurm/{version}/jobs/",
        f"/slurm/{version}/jobs/state/",
    ]


def test_an_unknown_api_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Slurm REST API v0\.0\.40 is not supported: v0\.0\.44, v0\.0\.45"):
        SlurmClient("http://slurmrestd:6820", user_name=None, token_file=None, api_version="v0.0.40")
