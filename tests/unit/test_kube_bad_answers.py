"""Answers that are not the API server's JSON become clear KubeErrors, never a decoding crash.

A proxy in front of the API server (tests/unit/bad_proxy.py, over real HTTP) answers
some requests itself: an HTML error page, a plain-text 404, a body that is not JSON,
one cut short, a watch stream cut mid-line or carrying a line that is not JSON. Each
must reach the caller as a KubeError naming the request, the status and what came
back, classified as usual: a 404 is NotFound; a 5xx, and a 2xx whose body cannot be
read, are worth asking again (at once for a read); a 403 is final. The informer and
the leader election live through such answers and log what they were.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import cast

import pytest

from activities.errors import classify
from activities.nodes import NodeActivities
from bridge import keys
from bridge.failures import KUBE_REJECTED
from clients.informer import Backoff, EventType, Informer
from clients.kube_client import (
    MERGE_PATCH,
    QUICK_RETRIES,
    Json,
    KubeClient,
    KubeConflict,
    KubeError,
    KubeNotFound,
    WatchBroken,
    api_path,
)
from clients.leader import LeaderElector, LeaderTimings
from clients.slurm_client import SlurmClient
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body
from tests.unit.bad_proxy import BadProxy, answer, stream

PODS = api_path("pods", namespace="default")
POD = api_path("pods", namespace="default", name="p")
ALL_PODS = api_path("pods")
LEASE = api_path("leases", namespace="default", name="bridge", group="coordination.k8s.io")
BAD_GATEWAY_PAGE = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
LOGIN_PAGE = (
    b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>" + b"x" * 5000 + b"</body></html>"
)
EVENT = b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"q","resourceVersion":"5"}}}\n'


@pytest.fixture
async def proxy(kube: FakeKubeServer) -> AsyncIterator[BadProxy]:
    async with BadProxy(kube.url, kube.token) as running:
        yield running


@pytest.fixture
async def client(proxy: BadProxy) -> AsyncIterator[KubeClient]:
    """The bridge's client, talking to the API server through the proxy."""
    client = KubeClient(proxy.configuration())
    yield client
    await client.close()


@pytest.fixture(autouse=True)
def pod(kube: FakeKubeServer) -> Json:
    return kube.create_object("pods", pod_body("p"), "default")


def asked(proxy: BadProxy, method: str, path: str) -> int:
    return sum(1 for r in proxy.requests if r.split("?")[0] == f"{method} {path}")


# -- single requests ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "excerpt", "retryable"),
    [
        pytest.param(
            answer(502, "Bad Gateway", BAD_GATEWAY_PAGE), 502, "502 Bad Gateway", True, id="html-502"
        ),
        pytest.param(
            answer(
                503,
                "Service Unavailable",
                b"upstream connect error or disconnect/reset before headers",
                "text/plain",
            ),
            503,
            "upstream connect error",
            True,
            id="envoy-503",
        ),
        pytest.param(
            answer(403, "Forbidden", b"<html>Access denied</html>"),
            403,
            "Access denied",
            False,
            id="html-403",
        ),
        pytest.param(
            answer(500, "Internal Server Error", b'{"error": "backend down"}', "application/json"),
            500,
            "backend down",
            True,
            id="json-not-a-status",
        ),
    ],
)
async def test_an_error_page_is_a_clear_error_classified_by_its_status(
    proxy: BadProxy, client: KubeClient, raw: bytes, status: int, excerpt: str, retryable: bool
) -> None:
    proxy.answer_next("GET", f"^{POD}$", raw, count=QUICK_RETRIES + 1)
    with pytest.raises(KubeError) as caught:
        await client.request("GET", POD)
    error = caught.value
    assert type(error) is KubeError  # neither NotFound nor Conflict
    assert (error.status, error.retryable) == (status, retryable)
    assert f"GET {POD}" in str(error)
    assert str(status) in str(error)
    assert excerpt in str(error)
    assert asked(proxy, "GET", POD) == (QUICK_RETRIES + 1 if retryable else 1)
    final = classify(error)
    assert (final is None) is retryable
    assert final is None or final.type == KUBE_REJECTED


async def test_a_read_that_met_an_error_page_is_asked_again_at_once(
    proxy: BadProxy, client: KubeClient
) -> None:
    proxy.answer_next("GET", f"^{POD}$", answer(502, "Bad Gateway", BAD_GATEWAY_PAGE))
    assert (await client.request("GET", POD))["metadata"]["name"] == "p"
    assert asked(proxy, "GET", POD) == 2


async def test_a_text_404_is_not_found_with_the_servers_text(proxy: BadProxy, client: KubeClient) -> None:
    # What kube-apiserver answers for an API group it does not serve (testbed/kube_real has the real one).
    slices = api_path("resourceslices", group="resource.k8s.io")
    proxy.answer_next(
        "GET", f"^{slices}$", answer(404, "Not Found", b"404 page not found\n", "text/plain; charset=utf-8")
    )
    with pytest.raises(KubeNotFound) as caught:
        await client.request("GET", slices)
    assert caught.value.status == 404
    assert "404 page not found" in str(caught.value)
    assert f"GET {slices}" in str(caught.value)
    assert not caught.value.retryable
    assert asked(proxy, "GET", slices) == 1


UNREADABLE_2XX = [
    pytest.param(answer(200, "OK", LOGIN_PAGE), "Sign in", id="html-page"),
    pytest.param(answer(200, "OK", b"ok", "text/plain"), "ok", id="plain-text"),
    pytest.param(
        answer(200, "OK", b'{"kind":"Pod","metadata":{"name":"p","namesp', "application/json"),
        '"namesp',
        id="truncated-json",
    ),
    pytest.param(
        answer(200, "OK", b'{"kind":"Pod","metadata":{"name":"p"', "application/json", length=4096),
        '"name":"p"',
        id="cut-short-of-its-length",
    ),
    pytest.param(answer(200, "OK", b"[]", "application/json"), "[]", id="json-not-an-object"),
    pytest.param(answer(200, "OK", b"", "application/json"), "empty", id="empty"),
    pytest.param(answer(200, "OK", b'{"kind": "\xff\xfe"}', "application/json"), "kind", id="not-utf-8"),
]


@pytest.mark.parametrize(("raw", "excerpt"), UNREADABLE_2XX)
async def test_an_unreadable_answer_to_a_read_is_a_clear_error_worth_asking_again(
    proxy: BadProxy, client: KubeClient, raw: bytes, excerpt: str
) -> None:
    proxy.answer_next("GET", f"^{POD}$", raw, count=QUICK_RETRIES + 1)
    with pytest.raises(KubeError) as caught:
        await client.request("GET", POD)
    error = caught.value
    assert not isinstance(error, KubeNotFound | KubeConflict)
    assert error.status == 200
    assert error.retryable
    assert classify(error) is None  # Temporal's retry policy asks again
    message = str(error)
    assert f"GET {POD}" in message
    assert "200" in message
    assert excerpt in message
    assert len(message) < 600  # an excerpt, not the page
    assert asked(proxy, "GET", POD) == QUICK_RETRIES + 1

    # Asked again at once: the next whole answer is the one returned.
    proxy.answer_next("GET", f"^{POD}$", raw)
    assert (await client.request("GET", POD))["metadata"]["name"] == "p"


async def test_an_unreadable_answer_to_a_write_is_retryable_but_not_repeated_at_once(
    proxy: BadProxy, client: KubeClient
) -> None:
    # The write may have been done: only the caller, which re-reads first, may do it again.
    proxy.answer_next("PATCH", f"^{POD}$", answer(200, "OK", LOGIN_PAGE))
    with pytest.raises(KubeError) as caught:
        await client.request(
            "PATCH", POD, body={"metadata": {"labels": {"a": "b"}}}, content_type=MERGE_PATCH
        )
    assert caught.value.retryable
    assert f"PATCH {POD}" in str(caught.value)
    assert asked(proxy, "PATCH", POD) == 1


# -- watches -------------------------------------------------------------------------


async def first_events(client: KubeClient, path: str) -> tuple[list[Json], BaseException | None]:
    """The events a watch yielded before it ended, and what ended it (None: it ended normally)."""
    events: list[Json] = []
    try:
        async for event in client.watch(path, resource_version="1", timeout_seconds=5):
            events.append(event)
    except Exception as error:
        return events, error
    return events, None


WATCH = f"^{PODS}\\?.*watch=true"


@pytest.mark.parametrize(
    ("raw", "excerpt"),
    [
        pytest.param(stream(EVENT, BAD_GATEWAY_PAGE), "'<html>'", id="html-line"),
        pytest.param(
            stream(EVENT, b'{"type":"MODIFIED","object":{"kind":"Po'),
            '{"type":"MODIFIED"',
            id="ends-mid-line",
        ),
        pytest.param(stream(EVENT, b"[1, 2]\n"), "[1, 2]", id="json-not-an-event"),
        pytest.param(stream(EVENT, b'{"type": "\xff"}\n'), "type", id="not-utf-8"),
    ],
)
async def test_a_watch_line_that_is_not_an_event_breaks_the_stream_clearly(
    proxy: BadProxy, client: KubeClient, raw: bytes, excerpt: str
) -> None:
    proxy.answer_next("GET", WATCH, raw)
    events, error = await first_events(client, PODS)
    assert [e["object"]["metadata"]["name"] for e in events] == ["q"]  # what came before is delivered
    assert isinstance(error, WatchBroken), repr(error)
    assert error.retryable
    assert f"GET {PODS}" in str(error)
    assert excerpt in str(error)


async def test_a_watch_cut_mid_line_breaks_the_stream(proxy: BadProxy, client: KubeClient) -> None:
    proxy.answer_next("GET", WATCH, stream(EVENT, b'{"type":"MODIFIED","obj', end=False))
    events, error = await first_events(client, PODS)
    assert len(events) == 1
    assert isinstance(error, WatchBroken), repr(error)
    assert error.retryable


@pytest.mark.parametrize(
    ("raw", "kind", "status", "excerpt"),
    [
        pytest.param(
            answer(502, "Bad Gateway", BAD_GATEWAY_PAGE), KubeError, 502, "502 Bad Gateway", id="html-502"
        ),
        pytest.param(
            answer(404, "Not Found", b"404 page not found\n", "text/plain"),
            KubeNotFound,
            404,
            "404 page not found",
            id="text-404",
        ),
    ],
)
async def test_a_watch_refused_with_a_page_is_a_clear_error(
    proxy: BadProxy, client: KubeClient, raw: bytes, kind: type[KubeError], status: int, excerpt: str
) -> None:
    proxy.answer_next("GET", WATCH, raw)
    events, error = await first_events(client, PODS)
    assert events == []
    assert isinstance(error, kind), repr(error)
    assert error.status == status
    assert f"GET {PODS}" in str(error)
    assert excerpt in str(error)


# -- the informer and the leader election ----------------------------------------------


ALL_PODS_LIST = f"^{ALL_PODS}$"
ALL_PODS_WATCH = f"^{ALL_PODS}\\?.*watch=true"


@pytest.mark.parametrize(
    ("pattern", "count", "raw", "excerpt"),
    [
        # Every try of one list, the client's quick repeats included.
        pytest.param(
            ALL_PODS_LIST, QUICK_RETRIES + 1, answer(200, "OK", LOGIN_PAGE), "Sign in", id="list-html-page"
        ),
        # One watch (never repeated by the client).
        pytest.param(ALL_PODS_WATCH, 1, stream(BAD_GATEWAY_PAGE), "'<html>'", id="watch-html-line"),
        pytest.param(
            ALL_PODS_WATCH, 1, stream(b'{"type":"ADDED","obj'), '{"type":"ADDED"', id="watch-ends-mid-line"
        ),
    ],
)
async def test_the_informer_backs_off_and_relists_through_bad_answers_and_logs_them_in_one_line(
    kube: FakeKubeServer,
    proxy: BadProxy,
    client: KubeClient,
    caplog: pytest.LogCaptureFixture,
    pattern: str,
    count: int,
    raw: bytes,
    excerpt: str,
) -> None:
    proxy.answer_next("GET", pattern, raw, count=count)
    seen: asyncio.Queue[tuple[EventType, str]] = asyncio.Queue()
    errors: list[BaseException] = []
    informer = Informer(
        client,
        ALL_PODS,
        name="pods",
        on_event=lambda kind, obj: seen.put_nowait((kind, obj["metadata"]["name"])),
        on_error=errors.append,
        backoff=Backoff(initial=0.01, max=0.05),
    )
    task = asyncio.create_task(informer.run())
    try:
        assert await asyncio.wait_for(seen.get(), 5) == ("LISTED", "p")
        await kube.wait_for_async(lambda: kube.active_watches == 1)
        kube.create_object("pods", pod_body("after"), "default")
        while (event := await asyncio.wait_for(seen.get(), 5)) != ("ADDED", "after"):
            assert event == ("LISTED", "p")  # the re-list after the bad answer
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert informer.failures == 1
    [error] = errors
    assert isinstance(error, KubeError), repr(error)
    assert excerpt in str(error)
    [record] = [r for r in caplog.records if r.name == "clients.informer" and r.levelno == logging.WARNING]
    assert excerpt in record.getMessage()
    assert f"GET {ALL_PODS}" in record.getMessage()
    assert record.exc_info is None  # the API server's (or its proxy's) trouble: one line, no traceback


FAST = LeaderTimings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.2)


async def test_the_leader_election_retries_through_bad_answers_and_says_what_they_were(
    kube: FakeKubeServer, proxy: BadProxy, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="clients.leader")
    # Acquiring: the Lease read meets a proxy's error page (each quick repeat too).
    proxy.answer_next(
        "GET", f"^{LEASE}$", answer(502, "Bad Gateway", BAD_GATEWAY_PAGE), count=QUICK_RETRIES + 1
    )
    leading = asyncio.Event()

    async def lead() -> None:
        leading.set()
        await asyncio.Event().wait()

    elector = LeaderElector(client, "default", "bridge", "a", FAST)
    task = asyncio.create_task(elector.run(lead))
    try:
        await asyncio.wait_for(leading.wait(), 5)
        # Renewing: one renewal is answered with a page that is not the Lease; the next one renews.
        renewal = proxy.answer_next("PUT", f"^{LEASE}$", answer(200, "OK", LOGIN_PAGE))
        await proxy.wait_for(lambda: renewal.used == 1)
        before = puts(kube)
        await kube.wait_for_async(lambda: puts(kube) > before)
        assert elector.is_leader
        assert elector.terms == 1  # never lost the Lease
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    said = [
        r.getMessage() for r in caplog.records if r.name == "clients.leader" and r.levelno == logging.WARNING
    ]
    acquiring = [m for m in said if m.startswith("could not acquire Lease default/bridge")]
    renewing = [m for m in said if m.startswith("could not renew Lease default/bridge")]
    assert len(acquiring) == 1
    assert f"GET {LEASE}" in acquiring[0]
    assert "502 Bad Gateway" in acquiring[0]
    assert len(renewing) == 1
    assert f"PUT {LEASE}" in renewing[0]
    assert "Sign in" in renewing[0]


def puts(kube: FakeKubeServer) -> int:
    return sum(1 for r in kube.requests if r.method == "PUT" and r.path == LEASE)


# -- node sync -----------------------------------------------------------------------


async def test_node_sync_never_plans_from_a_node_list_that_came_back_404(
    proxy: BadProxy, client: KubeClient
) -> None:
    # A 404 of the nodes, which every cluster serves, is an error: only an optional group's
    # collection (ResourceSlices) answering 404 means "not served, none" (testbed/kube_real).
    nodes_path = api_path("nodes")
    proxy.answer_next(
        "GET", f"^{nodes_path}$", answer(404, "Not Found", b"404 page not found\n", "text/plain")
    )
    nodes = NodeActivities(client, cast(SlurmClient, None), scheduler_name=keys.DEFAULT_SCHEDULER_NAME)
    with pytest.raises(KubeNotFound, match="404 page not found"):
        await nodes.read_snapshot()  # raises before Slurm is asked
