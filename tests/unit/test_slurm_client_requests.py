"""SlurmClient's requests as sent: job_states' query strings, timeouts per kind of request (no Slurm)."""

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from bridge.slurm_api import API_VERSIONS, JobDescMsg
from clients.slurm_client import JOB_STATE_CHUNK, MAX_QUERY_CHARS, SlurmClient
from clients.slurm_errors import SlurmError, SlurmNotFound, SlurmRejected

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


# Heterogeneous jobs. `GET /jobs/state/` as slurmctld 26.05.5 answered (tests/slurm/test_het_jobs.py):
# a leader's id lists every component as "<component id>+<offset>", a component's own id
# that component alone; so a component asked beside its leader comes twice.
RUNNING, PENDING, CANCELLED = ["RUNNING"], ["PENDING"], ["CANCELLED"]
STATE_ANSWERS: dict[int, list[tuple[str, list[str]]]] = {
    3: [("3+0", RUNNING), ("4+1", RUNNING)],
    4: [("4+1", RUNNING)],
    7: [("7", PENDING)],  # an ordinary job
    10: [("10+0", RUNNING), ("11+1", CANCELLED), ("12+2", RUNNING)],  # one component cancelled alone
    11: [("11+1", CANCELLED)],
    20: [("20+0", RUNNING), ("21+1", PENDING)],
    31: [("31+1", RUNNING)],  # a non-leader asked alone: reported under its leader, 30
    40: [("40+0", ["COMPLETED"]), ("41+1", ["TIMEOUT"])],  # the first ended component's states
}


def state_answers(request: httpx.Request) -> httpx.Response:
    asked = [int(value) for name, value in parse_qsl(request.url.query.decode()) if name == "job_id"]
    jobs = [{"job_id": id_, "state": state} for i in asked for id_, state in STATE_ANSWERS.get(i, [])]
    return httpx.Response(200, json={"jobs": jobs, "errors": [], "warnings": []})


def fake_client(tmp_path: Path, answer: Any) -> SlurmClient:
    token = tmp_path / "jwt"
    token.write_text("token")
    return SlurmClient(
        "http://s:6820", user_name="slurm", token_file=token, transport=httpx.MockTransport(answer)
    )


@pytest.mark.parametrize("chunk_size", [1, 2, 500])
async def test_job_states_folds_het_components_into_their_leader(tmp_path: Path, chunk_size: int) -> None:
    async with fake_client(tmp_path, state_answers) as slurm:
        states = await slurm.job_states([3, 4, 7, 10, 11, 20, 31, 40, 99], chunk_size=chunk_size)
    assert states == {
        3: RUNNING,  # "3+0", "4+1" and "4+1" again: one entry, the leader's
        7: PENDING,
        10: CANCELLED,  # any ended component ends the het job's state
        20: PENDING,  # else any pending one
        30: RUNNING,
        40: ["COMPLETED"],
    }


async def test_job_states_takes_a_het_job_id_the_entry_names(tmp_path: Path) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        jobs = [
            {"job_id": "9+1", "het_job_id": {"set": True, "infinite": False, "number": 5}, "state": PENDING},
            {"job_id": "5+0", "het_job_id": 5, "state": RUNNING},
        ]
        return httpx.Response(200, json={"jobs": jobs, "errors": []})

    async with fake_client(tmp_path, answer) as slurm:
        assert await slurm.job_states([5]) == {5: PENDING}


@pytest.mark.parametrize("job_id", ["3+", "+1", "3+3", "3+4", "3+0+1", "x+0", "3_1", "3+-1", "", None, 3.5])
async def test_job_states_refuses_an_id_of_neither_form(tmp_path: Path, job_id: object) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"jobs": [{"job_id": job_id, "state": RUNNING}], "errors": []})

    async with fake_client(tmp_path, answer) as slurm:
        with pytest.raises(SlurmError, match="unexpected answer"):
            await slurm.job_states([3])


async def test_job_states_refuses_a_het_entry_without_a_state_list(tmp_path: Path) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"jobs": [{"job_id": "3+0", "state": "RUNNING"}], "errors": []})

    async with fake_client(tmp_path, answer) as slurm:
        with pytest.raises(SlurmError, match="unexpected answer"):
            await slurm.job_states([3])


async def test_submit_het_job_sends_every_component_and_answers_the_leader(tmp_path: Path) -> None:
    bodies: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"job_id": 3051, "step_id": "batch", "errors": [], "warnings": []})

    components = [
        JobDescMsg(name="a", flags=["EXTERNAL_JOB"], nodes="1", cpus_per_task=1),
        JobDescMsg(name="b", flags=["EXTERNAL_JOB"], nodes="2", cpus_per_task=2),
    ]
    async with fake_client(tmp_path, answer) as slurm:
        assert await slurm.submit_het_job(components) == 3051
    assert bodies == [
        {
            "jobs": [
                {"name": "a", "flags": ["EXTERNAL_JOB"], "nodes": "1", "cpus_per_task": 1},
                {"name": "b", "flags": ["EXTERNAL_JOB"], "nodes": "2", "cpus_per_task": 2},
            ]
        }
    ]


async def test_submit_het_job_without_a_job_id_is_rejected(tmp_path: Path) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        # What 26.05.5 answered to a component field of the wrong type.
        warning = {"description": "Expected OpenAPI type=integer", "source": "#/jobs[1]/cpus_per_task/"}
        return httpx.Response(200, json={"errors": [], "warnings": [warning]})

    async with fake_client(tmp_path, answer) as slurm:
        with pytest.raises(SlurmRejected, match="Expected OpenAPI type=integer"):
            await slurm.submit_het_job([JobDescMsg(name="a"), JobDescMsg(name="b")])


async def test_submit_het_job_of_no_component_sends_nothing(recorder: Recorder, tmp_path: Path) -> None:
    async with client(recorder, tmp_path) as slurm:
        with pytest.raises(ValueError, match="at least one component"):
            await slurm.submit_het_job([])
    assert recorder.requests == []


def het_component(job_id: int, leader: int, offset: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "het_job_id": {"set": True, "infinite": False, "number": leader},
        "het_job_offset": {"set": True, "infinite": False, "number": offset},
    }


class JobAnswers:
    """`GET /job/{id}` as 26.05.5 answered: the leader's id every component, a component's itself."""

    def __init__(self, jobs: dict[int, list[dict[str, Any]]]) -> None:
        self.jobs = jobs
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url.path.rsplit("/", 1)[-1])
        job_id = int(self.asked[-1])
        if job_id not in self.jobs:
            error = {"error_number": 2017, "error": "Invalid job id specified"}
            return httpx.Response(404, json={"jobs": [], "errors": [error]})
        return httpx.Response(200, json={"jobs": self.jobs[job_id], "errors": []})


async def test_get_job_components_of_a_leader_and_of_a_component(tmp_path: Path) -> None:
    leader, middle, last = het_component(5, 5, 0), het_component(6, 5, 1), het_component(7, 5, 2)
    # Out of order and a duplicate (../shared/slurm/README.md saw a component answered twice).
    answers = JobAnswers({5: [last, leader, middle, last], 6: [middle, middle], 7: [last]})
    async with fake_client(tmp_path, answers) as slurm:
        assert [job.job_id for job in await slurm.get_job_components(5)] == [5, 6, 7]
        assert answers.asked == ["5"]
        answers.asked.clear()
        assert [job.job_id for job in await slurm.get_job_components(6)] == [5, 6, 7]
        assert answers.asked == ["6", "5"]  # the component names its leader, which is read too


async def test_get_job_components_of_an_ordinary_job_and_of_a_component_whose_leader_is_gone(
    tmp_path: Path,
) -> None:
    ordinary = {
        "job_id": 9,
        "het_job_id": {"set": True, "number": 0},
        "het_job_offset": {"set": True, "number": 0},
    }
    answers = JobAnswers({9: [ordinary], 6: [het_component(6, 5, 1)]})
    async with fake_client(tmp_path, answers) as slurm:
        assert [job.job_id for job in await slurm.get_job_components(9)] == [9]
        assert [job.job_id for job in await slurm.get_job_components(6)] == [6]
        with pytest.raises(SlurmNotFound):
            await slurm.get_job_components(8)
