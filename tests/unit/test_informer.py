"""The informer against the fake API server over real HTTP.

List with selectors, then watch from the list's version; resume when a stream
ends; re-list on 410 with the keys a consumer needs to notice deletions it did
not see; back off (and count) on any failure, handler bugs included; stop only
when cancelled.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from clients.informer import Backoff, EventType, Informer, missing, uid_key
from clients.kube_client import (
    HEALTHY_STREAM_SECONDS,
    QUICK_RETRIES,
    Json,
    KubeClient,
    KubeError,
    api_path,
)
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body

PODS = api_path("pods")
FAST = Backoff(initial=0.01, max=0.05)


class Recorder:
    """A consumer: every event and every synced key set, in order, awaitable."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[tuple[EventType, str]] = asyncio.Queue()
        self.syncs: asyncio.Queue[frozenset[str]] = asyncio.Queue()

    def on_event(self, kind: EventType, obj: Json) -> None:
        self.events.put_nowait((kind, obj["metadata"]["name"]))

    async def on_synced(self, keys: frozenset[str]) -> None:  # an async handler works as well
        self.syncs.put_nowait(keys)

    async def next_event(self) -> tuple[EventType, str]:
        return await asyncio.wait_for(self.events.get(), 5)

    async def next_sync(self) -> frozenset[str]:
        return await asyncio.wait_for(self.syncs.get(), 5)


@asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def create_pod(kube: FakeKubeServer, name: str, scheduler: str = "slurm", **labels: str) -> Json:
    return kube.create_object("pods", pod_body(name, labels=labels, schedulerName=scheduler), "default")


def watch_requests(kube: FakeKubeServer) -> list[dict[str, str]]:
    return [r.query for r in kube.requests if r.path == PODS and r.query.get("watch") == "true"]


async def test_lists_then_watches_what_the_selectors_match(kube: FakeKubeServer, client: KubeClient) -> None:
    create_pod(kube, "mine", app="x")
    create_pod(kube, "other-label", app="y")
    create_pod(kube, "other-scheduler", "default-scheduler", app="x")
    listed_at = kube.store.rv
    seen = Recorder()
    informer = Informer(
        client,
        PODS,
        label_selector="app=x",
        field_selector="spec.schedulerName=slurm",
        on_event=seen.on_event,
        on_synced=seen.on_synced,
    )
    async with running(informer):
        assert await seen.next_event() == ("LISTED", "mine")
        assert await seen.next_sync() == {"default/mine"}
        assert informer.synced.is_set()
        assert informer.listed_keys == {"default/mine"}

        create_pod(kube, "ignored", app="y")
        create_pod(kube, "new", app="x")
        assert await seen.next_event() == ("ADDED", "new")
        kube.update_object("pods", "new", lambda p: p["metadata"]["labels"].update(tier="a"), "default")
        assert await seen.next_event() == ("MODIFIED", "new")
        kube.delete_object("pods", "mine", "default")
        # A pod's deletion is graceful even unbound: the deletion timestamp first, then the removal.
        assert await seen.next_event() == ("MODIFIED", "mine")
        assert await seen.next_event() == ("DELETED", "mine")

    selectors = {"labelSelector": "app=x", "fieldSelector": "spec.schedulerName=slurm"}
    lists = [r.query for r in kube.requests if r.path == PODS and "watch" not in r.query]
    assert lists == [selectors]
    first_watch = watch_requests(kube)[0]
    assert first_watch.items() >= selectors.items()
    assert first_watch["resourceVersion"] == str(listed_at)
    assert seen.events.empty()


async def test_a_stream_that_ends_is_resumed_from_the_last_version(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    create_pod(kube, "a")
    seen = Recorder()
    informer = Informer(client, PODS, watch_timeout_seconds=1, on_event=seen.on_event)
    async with running(informer):
        assert await seen.next_event() == ("LISTED", "a")
        kube.update_object("pods", "a", lambda p: p["metadata"]["labels"].update(v="1"), "default")
        assert await seen.next_event() == ("MODIFIED", "a")
        version_after_event = informer.resource_version
        # The server ends the 1 s stream; the informer watches again from where it stopped.
        await kube.wait_for_async(lambda: len(watch_requests(kube)) >= 2)
        create_pod(kube, "b")
        assert await seen.next_event() == ("ADDED", "b")
        kube.send_bookmarks()  # a BOOKMARK moves the version on without an event
        kube.create_object("configmaps", {"metadata": {"name": "elsewhere"}}, "default")
        kube.send_bookmarks()
        await kube.wait_for_async(lambda: int(informer.resource_version) >= kube.store.rv, 5)

    resumed = [int(q["resourceVersion"]) for q in watch_requests(kube)]
    assert resumed[1] >= int(version_after_event)
    assert informer.lists == 1
    assert informer.failures == 0
    assert seen.events.empty()  # nothing delivered twice


async def test_an_expired_version_relists_and_tells_what_was_missed(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    for name in ("a", "b"):
        create_pod(kube, name)
    known: set[str] = set()
    syncs: asyncio.Queue[frozenset[str]] = asyncio.Queue()

    def on_event(kind: EventType, obj: Json) -> None:
        if kind == "DELETED":
            known.discard(obj["metadata"]["name"])
        else:
            known.add(obj["metadata"]["name"])

    def on_synced(keys: frozenset[str]) -> None:
        for gone in missing(known, frozenset(key.split("/")[1] for key in keys)):
            known.discard(gone)
        if informer.lists == 0:
            # Between the first list and its watch: "b" goes and the server forgets
            # the history, so the watch from the list's version is 410 Gone.
            kube.delete_object("pods", "b", "default")
            kube.compact_history()
        syncs.put_nowait(keys)

    informer = Informer(client, PODS, on_event=on_event, on_synced=on_synced, backoff=FAST)
    async with running(informer):
        assert await asyncio.wait_for(syncs.get(), 5) == {"default/a", "default/b"}
        assert await asyncio.wait_for(syncs.get(), 5) == {"default/a"}
        assert known == {"a"}  # the deletion no watch event reported
        assert informer.lists == 2
        assert informer.failures == 0  # 410 is no failure: a re-list at once


async def test_a_failing_handler_is_logged_counted_and_followed_by_a_relist(
    kube: FakeKubeServer, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    seen = Recorder()
    errors: list[BaseException] = []
    broken = {"boom"}

    def on_event(kind: EventType, obj: Json) -> None:
        if obj["metadata"]["name"] in broken:
            broken.clear()  # fails once
            raise RuntimeError("handler bug")
        seen.on_event(kind, obj)

    informer = Informer(
        client,
        PODS,
        name="pods",
        on_event=on_event,
        on_synced=seen.on_synced,
        on_error=errors.append,
        backoff=FAST,
    )
    async with running(informer):
        assert await seen.next_sync() == frozenset()
        create_pod(kube, "boom")
        # The event the handler failed on comes back with the re-list.
        assert await seen.next_event() == ("LISTED", "boom")
        assert await seen.next_sync() == {"default/boom"}
        create_pod(kube, "after")
        assert await seen.next_event() == ("ADDED", "after")
    assert informer.failures == 1
    assert [str(e) for e in errors] == ["handler bug"]
    [record] = [r for r in caplog.records if r.name == "clients.informer" and r.levelno == logging.WARNING]
    assert "pods list/watch failed (RuntimeError)" in record.getMessage()
    assert record.exc_info is not None  # a bug: logged with its traceback


async def test_api_errors_back_off_exponentially_until_the_list_succeeds(
    kube: FakeKubeServer, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    create_pod(kube, "a")
    # Nine answers: the client repeats a failed read twice at once, so three lists fail.
    kube.fail_next("GET", f"^{PODS}$", 500, count=3 * (QUICK_RETRIES + 1))
    errors: list[BaseException] = []
    informer = Informer(
        client,
        PODS,
        on_event=lambda kind, obj: None,
        on_error=errors.append,
        backoff=Backoff(initial=0.05, max=1.0),
    )
    started = time.monotonic()
    async with running(informer):
        await asyncio.wait_for(informer.synced.wait(), 5)
    # Waits of at least 0.05, 0.1 and 0.2 s (plus jitter) between the four lists.
    assert time.monotonic() - started >= 0.35
    assert informer.failures == 3
    assert all(isinstance(e, KubeError) and e.status == 500 for e in errors)
    warnings = [r for r in caplog.records if r.name == "clients.informer" and r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert all(r.exc_info is None for r in warnings)  # the API server's trouble: one line each


async def test_a_broken_connection_is_survived(kube: FakeKubeServer, client: KubeClient) -> None:
    seen = Recorder()
    informer = Informer(client, PODS, on_event=seen.on_event, backoff=FAST)
    async with running(informer):
        await asyncio.wait_for(informer.synced.wait(), 5)
        await kube.wait_for_async(lambda: kube.active_watches == 1)
        kube.break_connections()
        await kube.wait_for_async(lambda: informer.lists == 2 and kube.active_watches == 1)
        create_pod(kube, "after")
        assert await seen.next_event() == ("ADDED", "after")
    assert informer.failures == 1


async def test_after_a_healthy_session_the_back_off_starts_small_again(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    # An initial back-off of a minute: a re-list within seconds means none was applied.
    informer = Informer(
        client, PODS, on_event=lambda kind, obj: None, backoff=Backoff(initial=60, max=60, reset_after=0)
    )
    async with running(informer):
        await asyncio.wait_for(informer.synced.wait(), 5)
        await kube.wait_for_async(lambda: kube.active_watches == 1)
        kube.break_connections()
        await kube.wait_for_async(lambda: informer.lists == 2, 5)
    assert informer.failures == 1


async def test_only_cancellation_ends_it_even_while_backing_off(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    kube.fail_next("GET", f"^{PODS}$", 500, count=1000)
    failed = asyncio.Event()
    informer = Informer(
        client,
        PODS,
        on_event=lambda kind, obj: None,
        on_error=lambda error: failed.set(),
        backoff=Backoff(initial=30, max=30),
    )
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(failed.wait(), 5)  # now in its 30 s back-off
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert informer.failures == 1


async def test_pods_can_be_keyed_by_uid(kube: FakeKubeServer, client: KubeClient) -> None:
    """What the pod watcher needs: a pod recreated under its name is another pod."""
    first = create_pod(kube, "p")
    keys: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    events: list[tuple[EventType, Any]] = []
    informer = Informer(
        client,
        PODS,
        key=uid_key,
        field_selector="spec.schedulerName=slurm",
        on_event=lambda kind, obj: events.append((kind, obj["metadata"]["uid"])),
        on_synced=keys.put_nowait,
    )
    async with running(informer):
        assert await asyncio.wait_for(keys.get(), 5) == {first["metadata"]["uid"]}
    assert events == [("LISTED", first["metadata"]["uid"])]


async def test_a_stream_broken_off_after_a_healthy_while_resumes_without_a_re_list(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    seen = Recorder()
    informer = Informer(client, PODS, on_event=seen.on_event, backoff=Backoff(initial=30, max=30))
    async with running(informer):
        await asyncio.wait_for(informer.synced.wait(), 5)
        before = create_pod(kube, "before")
        assert await seen.next_event() == ("ADDED", "before")
        await asyncio.sleep(HEALTHY_STREAM_SECONDS)  # the stream has been up a healthy while
        kube.drop_watches()
        create_pod(kube, "after")  # while no stream is open
        # A 30 s back-off would outlast this wait: it resumed at once, from where it was.
        assert await seen.next_event() == ("ADDED", "after")
    assert (informer.lists, informer.failures) == (1, 0)
    resumed = watch_requests(kube)[-1]["resourceVersion"]
    assert int(resumed) >= int(before["metadata"]["resourceVersion"])


async def test_a_stream_broken_off_at_once_is_a_failure(kube: FakeKubeServer, client: KubeClient) -> None:
    informer = Informer(client, PODS, on_event=lambda kind, obj: None, backoff=FAST)
    async with running(informer):
        await asyncio.wait_for(informer.synced.wait(), 5)
        await kube.wait_for_async(lambda: kube.active_watches == 1)
        kube.drop_watches()
        await kube.wait_for_async(lambda: informer.lists == 2, 5)
    assert informer.failures == 1
