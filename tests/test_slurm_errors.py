"""SlurmClient's error classification, headers and bodies, on recorded answer shapes (no Slurm)."""

from __future__ import annotations

import json
import logging
import pickle
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.slurm_api import JobDescMsg, Uint32NoVal, UpdateNodeMsg
from clients.slurm_client import SlurmClient
from clients.slurm_errors import (
    SlurmAuthError,
    SlurmBusy,
    SlurmError,
    SlurmNotFound,
    SlurmRejected,
    SlurmUnavailable,
    classify,
)

TOKEN = "eyJhbGciOiJIUzI1NiJ9.secret-payload.signature-0123456789"

Handler = Callable[[httpx.Request], httpx.Response]
Call = Callable[[SlurmClient], Awaitable[object]]


def slurm_errors(*entries: tuple[int, str, str]) -> dict[str, Any]:
    return {
        "errors": [
            {"error_number": number, "error": error, "description": description, "source": "test"}
            for number, error, description in entries
        ],
        "warnings": [],
    }


def answer(status: int, body: dict[str, Any] | str | None = None) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body, headers={"content-type": "text/plain"})
        return httpx.Response(status, json=body) if body is not None else httpx.Response(status)

    return handle


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    path.write_text(f"SLURM_JWT={TOKEN}\n")
    return path


def client_for(handler: Handler, token_file: Path | None, user_name: str | None = "slurm") -> SlurmClient:
    return SlurmClient(
        "http://slurmrestd:6820/",
        user_name=user_name,
        token_file=token_file,
        transport=httpx.MockTransport(handler),
    )


def get_job(client: SlurmClient) -> Awaitable[object]:
    return client.get_job(7)


def submit(client: SlurmClient) -> Awaitable[object]:
    return client.submit_job(JobDescMsg(name="x", partition="p", flags=["EXTERNAL_JOB"]))


def cancel(client: SlurmClient) -> Awaitable[object]:
    return client.cancel_job(7)


def delete_node(client: SlurmClient) -> Awaitable[object]:
    return client.delete_node("n1")


def create_node(client: SlurmClient) -> Awaitable[object]:
    return client.create_node("garbage")


def list_jobs(client: SlurmClient) -> Awaitable[object]:
    return client.list_jobs()


def kill_status(code: int, text: str) -> dict[str, Any]:
    entry = {
        "error": {"string": text, "code": code, "message": text},
        "step_id": "7",
        "federation": {"sibling": ""},
    }
    return {"status": [entry], "errors": [], "warnings": []}


# (call, HTTP status, body, expected class, Slurm error number or None). Shapes as
# recorded from slurmrestd 26.05.5; see clients/slurm_client.py's docstring.
CASES: list[tuple[Call, int, dict[str, Any] | str | None, type[SlurmError], int | None]] = [
    (
        get_job,
        404,
        slurm_errors((2017, "Invalid job id specified", "Unable to query JobId=7")),
        SlurmNotFound,
        2017,
    ),
    (cancel, 200, kill_status(2017, "Invalid job id specified"), SlurmNotFound, 2017),
    (delete_node, 422, slurm_errors((2018, "Invalid node name specified", "")), SlurmNotFound, 2018),
    (list_jobs, 401, "Authentication failure", SlurmAuthError, None),
    (list_jobs, 511, slurm_errors((1007, "Protocol authentication error", "")), SlurmAuthError, 1007),
    (cancel, 403, slurm_errors((1, "Operation not permitted", "Signal request failed")), SlurmAuthError, 1),
    (submit, 422, slurm_errors((2000, "Invalid partition name specified", "")), SlurmRejected, 2000),
    (submit, 500, slurm_errors((2189, "Invalid configuration for external job", "")), SlurmRejected, 2189),
    (submit, 422, slurm_errors((2018, "Invalid node name specified", "")), SlurmRejected, 2018),
    (submit, 422, slurm_errors((9000, "Query empty or not RFC7320 compliant", "")), SlurmRejected, 9000),
    (submit, 400, "Failure during parsing", SlurmRejected, None),
    # The test bed at MaxJobCount (2026-11-27): sbatch sleeps and retries this one.
    (
        submit,
        422,
        slurm_errors((2007, "MaxJobCount limit reached", "Batch job submission failed")),
        SlurmBusy,
        2007,
    ),
    (delete_node, 422, slurm_errors((2016, "Requested nodes are busy", "")), SlurmRejected, 2016),
    (
        submit,
        200,
        slurm_errors((2014, "Requested node configuration is not available", "")),
        SlurmRejected,
        2014,
    ),
    (create_node, 500, slurm_errors((-1, "Unspecified error", "Failure to create node")), SlurmRejected, -1),
    (
        list_jobs,
        502,
        slurm_errors((1800, "Unable to contact slurm controller (connect failure)", "")),
        SlurmUnavailable,
        1800,
    ),
    (get_job, 500, slurm_errors((-1, "Unspecified error", "Unable to query JobId=7")), SlurmUnavailable, -1),
    (get_job, 500, slurm_errors((1000, "Unexpected message received", "")), SlurmUnavailable, 1000),
    (get_job, 503, None, SlurmUnavailable, None),
    (get_job, 504, "<html>gateway timeout</html>", SlurmUnavailable, None),
]


@pytest.mark.parametrize(("call", "status", "body", "expected", "number"), CASES)
async def test_classification(
    call: Call,
    status: int,
    body: dict[str, Any] | str | None,
    expected: type[SlurmError],
    number: int | None,
    token_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with client_for(answer(status, body), token_file) as client:
        with pytest.raises(SlurmError) as caught:
            await call(client)
    error = caught.value
    assert type(error) is expected
    assert error.status == status
    assert error.retryable is (expected in (SlurmAuthError, SlurmUnavailable, SlurmBusy))
    if number is not None:
        assert number in error.error_numbers
    if isinstance(body, dict) and body["errors"]:
        assert body["errors"][0]["error"] in str(error)  # Slurm's own words
    for text in (str(error), repr(error), caplog.text):
        assert TOKEN not in text


def test_classify_prefers_the_slurm_error_number_to_the_status() -> None:
    assert classify(500, [2189]) is SlurmRejected
    assert classify(500, [1800]) is SlurmUnavailable
    assert classify(500, [-1]) is SlurmUnavailable
    assert classify(500, [-1], unspecified=SlurmRejected) is SlurmRejected
    assert classify(422, [2017], not_found=[2017]) is SlurmNotFound
    assert classify(422, [2017]) is SlurmRejected
    assert classify(200, [6001]) is SlurmAuthError  # ESLURM_AUTH_EXPIRED
    assert classify(429, []) is SlurmUnavailable


async def test_cancel_of_an_ended_job_is_fine(token_file: Path) -> None:
    handler = answer(200, kill_status(2021, "Job/step already completing or completed"))
    async with client_for(handler, token_file) as client:
        await client.cancel_job(7)


async def test_submit_without_job_id_is_rejected(token_file: Path) -> None:
    # A field of the wrong type: slurmrestd answers 200 with a warning and submits nothing.
    body = {
        "errors": [],
        "warnings": [{"description": "Expected OpenAPI type=integer", "source": "#/job/x/"}],
    }
    async with client_for(answer(200, body), token_file) as client:
        with pytest.raises(SlurmRejected, match="Expected OpenAPI type=integer"):
            await submit(client)


async def test_warnings_are_logged_not_raised(token_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="clients.slurm_client")
    body = {
        "job_id": 12,
        "job_submit_user_msg": "",
        "errors": [],
        "warnings": [{"description": "Requested partition configuration not available now", "source": "s"}],
    }
    async with client_for(answer(200, body), token_file) as client:
        assert await submit(client) == 12
    [record] = [r for r in caplog.records if "partition configuration" in r.getMessage()]
    assert record.levelno == logging.DEBUG


async def test_unknown_node_and_partition_are_none(token_file: Path) -> None:
    node_answer = {
        "nodes": None,
        "errors": [{"error_number": 0, "error": "No error", "description": "Failure to query node n9"}],
    }
    async with client_for(answer(200, node_answer), token_file) as client:
        assert await client.get_node("n9") is None
    partition_answer = {"errors": [], "warnings": [{"description": "Unable to find partition p9"}]}
    async with client_for(answer(200, partition_answer), token_file) as client:
        assert await client.get_partition("p9") is None


async def test_newer_fields_and_enum_values_are_ignored(token_file: Path) -> None:
    job = {
        "job_id": 7,
        "job_state": ["RUNNING", "SOME_FUTURE_FLAG"],
        "flags": ["EXTERNAL_JOB", "A_FLAG_FROM_2030"],
        "brand_new_field": {"nested": [1, 2]},
    }
    async with client_for(answer(200, {"jobs": [job], "errors": [], "warnings": []}), token_file) as client:
        info = await client.get_job(7)
    assert info.job_state == ["RUNNING", "SOME_FUTURE_FLAG"]
    assert info.flags == ["EXTERNAL_JOB", "A_FLAG_FROM_2030"]


async def test_empty_job_list_is_not_found(token_file: Path) -> None:
    async with client_for(answer(200, {"jobs": [], "errors": [], "warnings": []}), token_file) as client:
        with pytest.raises(SlurmNotFound):
            await client.get_job(7)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("Connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("reset"),
    ],
)
async def test_transport_failures_are_unavailable(token_file: Path, failure: httpx.TransportError) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise failure

    async with client_for(fail, token_file) as client:
        with pytest.raises(SlurmUnavailable) as caught:
            await client.ping()
    error = caught.value
    assert error.status is None
    assert error.retryable
    # The httpx exception holds the request, and the request the token: not chained.
    assert error.__cause__ is None
    assert error.__context__ is None
    assert TOKEN not in str(error) + repr(error)


async def test_connection_refused_for_real(token_file: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with SlurmClient(f"http://127.0.0.1:{port}", user_name="slurm", token_file=token_file) as client:
        with pytest.raises(SlurmUnavailable, match="ConnectError"):
            await client.list_jobs()


async def test_non_json_success_is_unavailable(token_file: Path) -> None:
    async with client_for(answer(200, "<html>proxy</html>"), token_file) as client:
        with pytest.raises(SlurmUnavailable, match="not a JSON object"):
            await client.ping()


class Recorder:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json=self.body)


def rotate(token_file: Path, content: str) -> None:
    token_file.write_text(content)


async def test_a_rotated_token_is_used_by_the_next_request(token_file: Path) -> None:
    recorder = Recorder({"partitions": [], "errors": [], "warnings": []})
    async with client_for(recorder, token_file) as client:
        await client.list_partitions()
        rotate(token_file, "  rotated-token \n")
        await client.list_partitions()
    first, second = recorder.requests
    assert first.headers["X-SLURM-USER-TOKEN"] == TOKEN  # "SLURM_JWT=" and newline stripped
    assert second.headers["X-SLURM-USER-TOKEN"] == "rotated-token"
    assert first.headers["X-SLURM-USER-NAME"] == "slurm"
    assert str(first.url) == "http://slurmrestd:6820/slurm/v0.0.44/partitions/"


async def test_a_token_rewritten_in_place_with_the_same_length_is_used_at_once(token_file: Path) -> None:
    recorder = Recorder({"partitions": [], "errors": [], "warnings": []})
    same_length = TOKEN[:-1] + ("1" if TOKEN[-1] != "1" else "2")
    async with client_for(recorder, token_file) as client:
        await client.list_partitions()
        rotate(token_file, f"SLURM_JWT={same_length}\n")
        await client.list_partitions()
    assert [r.headers["X-SLURM-USER-TOKEN"] for r in recorder.requests] == [TOKEN, same_length]


async def test_a_secret_remounted_by_a_symlink_swap_is_used_at_once(tmp_path: Path) -> None:
    # How the kubelet updates a mounted Secret: a new directory, then `..data` re-pointed.
    for version, token in (("v1", "token-one"), ("v2", "token-two")):
        (tmp_path / version).mkdir()
        (tmp_path / version / "jwt").write_text(token)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "jwt").symlink_to("..data/jwt")
    recorder = Recorder({"partitions": [], "errors": [], "warnings": []})
    async with client_for(recorder, tmp_path / "jwt") as client:
        await client.list_partitions()
        (tmp_path / "..data.tmp").symlink_to("v2")
        (tmp_path / "..data.tmp").replace(tmp_path / "..data")
        await client.list_partitions()
    assert [r.headers["X-SLURM-USER-TOKEN"] for r in recorder.requests] == ["token-one", "token-two"]


async def test_an_unchanged_token_file_is_not_read_again(
    token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    read_text = Path.read_text

    def counting_read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting_read_text)
    recorder = Recorder({"partitions": [], "errors": [], "warnings": []})
    async with client_for(recorder, token_file) as client:
        for _ in range(3):
            await client.list_partitions()
    assert [r.headers["X-SLURM-USER-TOKEN"] for r in recorder.requests] == [TOKEN] * 3
    assert reads == [token_file]


async def test_no_auth_headers_when_not_configured() -> None:
    recorder = Recorder({"partitions": [], "errors": [], "warnings": []})
    async with client_for(recorder, token_file=None, user_name=None) as client:
        await client.list_partitions()
    [request] = recorder.requests
    assert "X-SLURM-USER-TOKEN" not in request.headers
    assert "X-SLURM-USER-NAME" not in request.headers


@pytest.mark.parametrize("content", [None, "", "SLURM_JWT=\n"])
async def test_missing_or_empty_token_file_is_an_auth_error(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "jwt"
    if content is not None:
        path.write_text(content)
    recorder = Recorder({})
    async with client_for(recorder, path) as client:
        with pytest.raises(SlurmAuthError, match="token file") as caught:
            await client.ping()
    assert caught.value.retryable
    assert not recorder.requests


async def test_request_bodies(token_file: Path) -> None:
    recorder = Recorder({"job_id": 3, "results": None, "errors": [], "warnings": []})
    job = JobDescMsg(
        name="ns/pod", partition="p", flags=["EXTERNAL_JOB"], time_limit=Uint32NoVal(set=True, number=5)
    )
    async with client_for(recorder, token_file) as client:
        await client.submit_job(job)
        await client.update_job(3, JobDescMsg(cpus_per_task=2, admin_comment="c"))
        await client.update_node("n/1", UpdateNodeMsg(state=["DRAIN"], reason="slurm-bridge: x"))
    submitted, updated, drained = (json.loads(r.content) for r in recorder.requests)
    # No nulls on the wire; submit wraps the job, update sends it bare (a wrapped
    # update is accepted with a warning and changes nothing).
    assert submitted == {
        "job": {
            "name": "ns/pod",
            "partition": "p",
            "flags": ["EXTERNAL_JOB"],
            "time_limit": {"set": True, "number": 5},
        }
    }
    assert updated == {"cpus_per_task": 2, "admin_comment": "c"}
    assert drained == {"state": ["DRAIN"], "reason": "slurm-bridge: x"}
    assert [r.url.raw_path.decode() for r in recorder.requests] == [
        "/slurm/v0.0.44/job/submit",
        "/slurm/v0.0.44/job/3",
        "/slurm/v0.0.44/node/n%2F1",
    ]


async def test_list_jobs_carries_update_time_forward(token_file: Path) -> None:
    stamp = {"set": True, "infinite": False, "number": 1_795_324_820}
    changed = {"jobs": [{"job_id": 1}], "last_update": stamp, "errors": [], "warnings": []}
    unchanged = {
        "jobs": [],
        "last_update": {"set": True, "infinite": False, "number": 0},
        "errors": [],
        "warnings": [{"description": "No job changes since update_time[1795324820]"}],
    }
    recorder = Recorder(changed)
    async with client_for(recorder, token_file) as client:
        first = await client.list_jobs()
        recorder.body = unchanged
        second = await client.list_jobs(update_time=first.update_time)
    assert [job.job_id for job in first.jobs] == [1]
    assert first.update_time == 1_795_324_820
    assert second == ([], 1_795_324_820)
    assert "update_time" not in recorder.requests[0].url.params
    assert recorder.requests[1].url.params["update_time"] == "1795324820"


def test_errors_pickle() -> None:
    error = SlurmRejected("Invalid partition name specified [2000]", operation="POST /job/submit", status=422)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is SlurmRejected
    assert (copy.status, copy.operation, copy.retryable, str(copy)) == (
        422,
        "POST /job/submit",
        False,
        str(error),
    )


def test_repr_names_the_file_not_the_token(token_file: Path) -> None:
    client = SlurmClient("http://x", user_name="slurm", token_file=token_file)
    assert str(token_file) in repr(client)
    assert TOKEN not in repr(client)


@pytest.mark.parametrize(
    "body",
    [
        {"statistics": {"jobs_canceled": 3}},
        {"statistics": {"jobs_started": "12"}},
        {"statistics": {"jobs_started": True}},
        {"statistics": None},
        {},
    ],
)
async def test_a_diag_answer_without_the_count_of_started_jobs_is_an_error_not_a_crash(
    token_file: Path, body: dict[str, Any]
) -> None:
    async with client_for(answer(200, body), token_file) as client:
        with pytest.raises(SlurmError, match="no jobs_started"):
            await client.jobs_started()


async def test_the_count_of_started_jobs_is_read_from_the_statistics(token_file: Path) -> None:
    body = {"statistics": {"jobs_started": 12, "jobs_canceled": 3, "rpcs_by_message_type": []}}
    async with client_for(answer(200, body), token_file) as client:
        assert await client.jobs_started() == 12
