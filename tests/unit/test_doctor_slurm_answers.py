"""`slurm-bridge doctor`'s Slurm checks when slurmrestd, or what stands in front of it, answers badly.

A fake slurmrestd over real HTTP answers each path with scripted bytes, written as they
are: an HTML error page, a refusal, a body cut short, a connection closed without an
answer, JSON of an unexpected shape. Each must become a check that says what came back,
never a traceback. The doctor reaches slurmrestd only through SlurmClient, so its
requests carry the client's headers and API version (tests/temporal/test_doctor.py runs
the same checks against the real Slurm test bed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from worker.doctor import Check, Doctor, DoctorSettings
from worker.settings import load

BAD_GATEWAY_PAGE = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


def answer(status: int, reason: str, body: bytes, content_type: str, *, length: int | None = None) -> bytes:
    """One whole HTTP answer; a `length` above len(body) promises more than is sent (a body cut short)."""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def json_answer(status: int, reason: str, document: Any) -> bytes:
    return answer(status, reason, json.dumps(document).encode(), "application/json")


PING_UP = json_answer(
    200, "OK", {"pings": [{"hostname": "ctl", "responding": True, "primary": True}], "errors": []}
)
NOT_FOUND_PAGE = answer(404, "Not Found", b"<html>not here</html>", "text/html")


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]


@dataclass
class FakeSlurmrestd:
    """Answers each request with the first scripted answer whose pattern its path matches
    (b"" closes the connection without answering), else with an HTML 404."""

    answers: dict[str, bytes]
    requests: list[Request] = field(default_factory=list)
    url: str = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            headers = {n.strip().lower(): v.strip() for n, _, v in (ln.partition(":") for ln in lines) if n}
            await reader.readexactly(int(headers.get("content-length") or 0))
            self.requests.append(Request(method, target, headers))
            raw = next((a for p, a in self.answers.items() if re.search(p, target)), NOT_FOUND_PAGE)
            writer.write(raw)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def fake_slurmrestd(answers: dict[str, bytes]) -> AsyncIterator[FakeSlurmrestd]:
    fake = FakeSlurmrestd(answers)
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    fake.url = f"http://{host}:{port}"
    try:
        yield fake
    finally:
        server.close()
        await server.wait_closed()


async def slurm_checks(url: str, tmp_path: Path, **overrides: Any) -> dict[str, Check]:
    token = tmp_path / "jwt"
    token.write_text("not-a-jwt\n")
    settings = load(
        DoctorSettings,
        slurm_rest_url=url,
        slurm_jwt_file=token,
        slurm_user_name="slurm",
        partition="bridge",
        **overrides,
    )
    return {check.name: check for check in await Doctor(settings).slurm()}


async def test_an_error_page_from_diag_is_a_failed_token_check(tmp_path: Path) -> None:
    answers = {r"/ping/$": PING_UP, r"/diag/$": answer(502, "Bad Gateway", BAD_GATEWAY_PAGE, "text/html")}
    async with fake_slurmrestd(answers) as fake:
        checks = await slurm_checks(fake.url, tmp_path)
    assert checks["slurmrestd"].status == "ok"
    assert checks["token"].status == "fail"
    assert checks["token"].detail == "GET /diag/: HTTP 502 Bad Gateway"
    assert "slurmctld did not answer slurmrestd" in checks["token"].fix
    assert "partition" not in checks  # nothing further is asked
    # Through SlurmClient: its API version, the token as the file holds it, the user.
    diag = fake.requests[-1]
    assert (diag.method, diag.target) == ("GET", "/slurm/v0.0.44/diag/")
    assert diag.headers["x-slurm-user-token"] == "not-a-jwt"
    assert diag.headers["x-slurm-user-name"] == "slurm"


@pytest.mark.parametrize(
    ("statistics", "status"),
    [({"jobs_started": 12, "jobs_pending": 3}, "ok"), ({"jobs_pending": 3}, "warn"), (None, "warn")],
)
async def test_a_diag_answer_without_the_start_count_is_a_warning(
    tmp_path: Path, statistics: dict[str, int] | None, status: str
) -> None:
    """The job watcher gates its pending-job probes on that count: without it, every pass asks."""
    document: dict[str, Any] = {"meta": {"slurm": {"release": "26.05.5"}}, "errors": []}
    if statistics is not None:
        document["statistics"] = statistics
    async with fake_slurmrestd({r"/ping/$": PING_UP, r"/diag/$": json_answer(200, "OK", document)}) as fake:
        checks = await slurm_checks(fake.url, tmp_path)
    assert checks["token"].status == status
    assert ("jobs_started" in checks["token"].detail) == (status == "warn")


async def test_diag_is_asked_in_the_configured_api_version(tmp_path: Path) -> None:
    answers = {r"/ping/$": PING_UP, r"/diag/$": answer(502, "Bad Gateway", BAD_GATEWAY_PAGE, "text/html")}
    async with fake_slurmrestd(answers) as fake:
        await slurm_checks(fake.url, tmp_path, slurm_api_version="v0.0.45")
    assert [r.target for r in fake.requests] == ["/slurm/v0.0.45/ping/", "/slurm/v0.0.45/diag/"]


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        pytest.param(
            json_answer(
                511,
                "Network Authentication Required",
                {"errors": [{"error_number": 1007, "error": "Protocol authentication error"}]},
            ),
            "slurmrestd refused the token for user slurm: HTTP 511 Protocol authentication error",
            id="slurm-error-1007",
        ),
        pytest.param(
            answer(401, "Unauthorized", b"Authentication failure", "text/plain"),
            "slurmrestd refused the token for user slurm: HTTP 401 Unauthorized",
            id="plain-text-401",
        ),
    ],
)
async def test_a_refused_token_names_the_token_file(tmp_path: Path, raw: bytes, detail: str) -> None:
    async with fake_slurmrestd({r"/ping/$": PING_UP, r"/diag/$": raw}) as fake:
        checks = await slurm_checks(fake.url, tmp_path)
    assert checks["token"].status == "fail"
    assert checks["token"].detail == detail
    assert "SLURM_JWT_FILE" in checks["token"].fix


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(answer(200, "OK", b'{"meta": {"slu', "application/json", length=4000), id="cut-short"),
        pytest.param(b"", id="closed-without-answer"),
    ],
)
async def test_no_whole_answer_from_diag_is_a_failed_token_check(tmp_path: Path, raw: bytes) -> None:
    async with fake_slurmrestd({r"/ping/$": PING_UP, r"/diag/$": raw}) as fake:
        checks = await slurm_checks(fake.url, tmp_path)
    assert checks["token"].status == "fail"
    assert checks["token"].detail == "GET /diag/: no answer (RemoteProtocolError)"


@pytest.mark.parametrize(
    "body",
    [b"[]", b'{"meta": []}', b'{"meta": {"slurm": "26.05"}, "errors": 5}', b"not json"],
    ids=["a-list", "meta-a-list", "odd-fields", "not-json"],
)
async def test_a_200_from_diag_of_another_shape_is_read_without_a_traceback(
    tmp_path: Path, body: bytes
) -> None:
    # A 200 says slurmrestd took the token (it refuses with 401, 403 or 511); what the body
    # lacks is the release and the start count (a warning). The checks after it fail on the
    # fake's 404 pages.
    answers = {r"/ping/$": PING_UP, r"/diag/$": answer(200, "OK", body, "application/json")}
    async with fake_slurmrestd(answers) as fake:
        checks = await slurm_checks(fake.url, tmp_path)
    assert checks["token"].status == "warn"
    assert checks["token"].detail.startswith(
        "accepted (diag answered, Slurm ?), but with no statistics.jobs_started"
    )
    assert checks["partition"].status == "fail"
    assert checks["partition"].detail.startswith(
        "cannot read partition bridge: GET /partition/bridge: HTTP 404"
    )
    assert checks["nodes"].status == "fail"


async def test_an_error_page_from_ping_is_a_failed_slurmrestd_check(tmp_path: Path) -> None:
    ping = answer(502, "Bad Gateway", BAD_GATEWAY_PAGE, "text/html")
    async with fake_slurmrestd({r"/ping/$": ping}) as fake:
        checks = await slurm_checks(fake.url, tmp_path)
    assert checks["slurmrestd"].status == "fail"
    assert checks["slurmrestd"].detail.startswith(f"no answer at {fake.url}: <html>")
    assert "SLURM_REST_URL" in checks["slurmrestd"].fix
    assert "token" not in checks


async def test_a_refused_connection_is_a_failed_slurmrestd_check(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on once the socket is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    checks = await slurm_checks(url, tmp_path)
    assert checks["slurmrestd"].status == "fail"
    assert checks["slurmrestd"].detail.startswith(
        f"no answer at {url}: no answer from slurmrestd (ConnectError"
    )
    assert "SLURM_REST_URL" in checks["slurmrestd"].fix
