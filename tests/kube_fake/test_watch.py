"""Behaviour 9 through the sync client: replay, live events, 410, bookmarks, selectors, shutdown.

The tests taking ``kube_api`` run against the fake and the real kube-apiserver alike.
Fake-only, each for the reason in its docstring: bookmarks (the real server sends them on
its own schedule; none came within 75 s in our measurements), the history-size option,
``sendInitialEvents`` (behind a feature gate that is off in the real test bed's 1.28),
the fake's own helpers (``send_bookmarks``, ``drop_watches``, ``stop``, the request log).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator

import kubernetes.client
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.backend import CustomResource, KubeApi
from testbed.kube_fake.builders import Client, pod_body, watch


def _stream(core: Client, w: Client, namespace: str = "default", **kwargs: object) -> Iterator[Client]:
    kwargs.setdefault("timeout_seconds", 5)  # upper bound only; tests stop the watch themselves
    yield from w.stream(core.list_namespaced_pod, namespace, **kwargs)


def test_replay_from_resource_version_then_live(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    rv_a = core.create_namespaced_pod(ns, pod_body("a")).metadata.resource_version
    core.create_namespaced_pod(ns, pod_body("b"))
    core.patch_namespaced_pod("a", ns, {"metadata": {"labels": {"x": "1"}}})
    seen = []
    w: Client = watch.Watch()
    for event in _stream(core, w, ns, resource_version=rv_a):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:  # replay done: now a live change
            core.delete_namespaced_pod("b", ns)
        if event["type"] == "DELETED":
            w.stop()
    # A pod's deletion is graceful even when immediate: marked (deletionTimestamp), then removed.
    assert seen == [("ADDED", "b"), ("MODIFIED", "a"), ("MODIFIED", "b"), ("DELETED", "b")]
    assert w.resource_version is not None
    assert int(w.resource_version) > int(rv_a)


@pytest.mark.parametrize("rv", [None, "0"])
def test_unset_or_zero_rv_starts_with_current_state(kube_api: KubeApi, rv: str | None) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("a"))
    core.create_namespaced_pod(ns, pod_body("b"))
    seen = []
    w: Client = watch.Watch()
    kwargs = {} if rv is None else {"resource_version": rv}
    for event in _stream(core, w, ns, **kwargs):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            core.create_namespaced_pod(ns, pod_body("c"))
        if len(seen) == 3:
            w.stop()
    # The current state comes first, in no promised order (the real server's watch cache serves
    # resourceVersion 0 from a map); then what happens next.
    assert sorted(seen[:2]) == [("ADDED", "a"), ("ADDED", "b")]
    assert seen[2] == ("ADDED", "c")


def _widget(widgets: CustomResource, name: str) -> dict[str, object]:
    return {"apiVersion": widgets.api_version, "kind": widgets.kind, "metadata": {"name": name}}


def test_a_watch_from_a_version_too_old_gets_410_in_the_stream(
    kube_api: KubeApi, widgets: CustomResource
) -> None:
    """The 200 stream carries one ERROR event with the Expired Status, then ends."""
    custom: Client = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    args = (widgets.group, widgets.version, kube_api.namespace, widgets.plural)
    custom.create_namespaced_custom_object(*args, _widget(widgets, "a"))
    kube_api.age_out_watch_history()
    answer = kube_api.raw("GET", widgets.path(kube_api.namespace), watch="true", resourceVersion="1")
    assert (answer.status_code, answer.headers["content-type"]) == (200, "application/json")
    (line,) = answer.text.splitlines()
    event = json.loads(line)
    message = event["object"].pop("message")
    assert event == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "reason": "Expired",
            "code": 410,
        },
    }
    # It names the oldest version one may still watch from.
    oldest = re.fullmatch(r"too old resource version: 1 \((\d+)\)", message)
    assert oldest is not None, message
    # The client raises it; a new list gives a version to watch from again.
    with pytest.raises(ApiException) as exc:
        list(
            watch.Watch().stream(
                custom.list_namespaced_custom_object, *args, resource_version="1", timeout_seconds=5
            )
        )
    assert exc.value.status == 410
    listed = custom.list_namespaced_custom_object(*args)
    assert int(listed["metadata"]["resourceVersion"]) >= int(oldest.group(1))
    custom.create_namespaced_custom_object(*args, _widget(widgets, "b"))
    w: Client = watch.Watch()
    seen = []
    for event in w.stream(
        custom.list_namespaced_custom_object,
        *args,
        resource_version=listed["metadata"]["resourceVersion"],
        timeout_seconds=5,
    ):
        seen.append((event["type"], event["object"]["metadata"]["name"]))
        w.stop()
    assert seen == [("ADDED", "b")]


def test_expired_rv_raises_410_and_relist_rewatch_recovers(kube_fake: FakeKubeServer, core: Client) -> None:
    """Fake only: counts the client's watch requests in the fake's request log."""
    old_rv = core.create_namespaced_pod("default", pod_body("a")).metadata.resource_version
    core.create_namespaced_pod("default", pod_body("b"))
    kube_fake.compact_history()
    with pytest.raises(ApiException) as exc:  # with timeout_seconds: the first 410 is raised
        list(_stream(core, watch.Watch(), resource_version=old_rv))
    assert exc.value.status == 410
    assert "too old resource version" in str(exc.value.reason)
    kube_fake.clear_requests()
    with pytest.raises(ApiException) as exc:  # without: one automatic resume, then raise
        list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=old_rv))
    assert exc.value.status == 410
    assert len([r for r in kube_fake.requests if r.query.get("watch") == "true"]) == 2
    listed = core.list_namespaced_pod("default")
    core.create_namespaced_pod("default", pod_body("c"))
    w: Client = watch.Watch()
    seen = []
    for event in _stream(core, w, resource_version=listed.metadata.resource_version):
        seen.append((event["type"], event["object"].metadata.name))
        w.stop()
    assert seen == [("ADDED", "c")]


def test_raw_410_error_event(kube_fake: FakeKubeServer, core: Client) -> None:
    """Fake only: ``compact_history`` ages out the history of a built-in kind."""
    rv = core.create_namespaced_pod("default", pod_body("a")).metadata.resource_version
    core.create_namespaced_pod("default", pod_body("b"))
    kube_fake.compact_history()
    resp = core.list_namespaced_pod("default", watch=True, resource_version=rv, _preload_content=False)
    lines = resp.data.decode().splitlines()  # the server closes the stream after the ERROR
    current = kube_fake.store.rv
    assert [json.loads(line) for line in lines] == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                # The oldest version one may still watch from: the last one compacted away.
                "message": f"too old resource version: {rv} ({current})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


def test_event_log_is_bounded() -> None:
    """Fake only: the ``history_size`` option."""
    with FakeKubeServer(history_size=3) as server, server.api_client() as client:
        core: Client = kubernetes.client.CoreV1Api(client)
        first = core.create_namespaced_pod("default", pod_body("p0")).metadata.resource_version
        for i in range(1, 3):
            core.create_namespaced_pod("default", pod_body(f"p{i}"))
        w: Client = watch.Watch()
        replayed = []
        for event in _stream(core, w, resource_version=first):
            replayed.append(event["object"].metadata.name)
            if len(replayed) == 2:
                w.stop()
        assert replayed == ["p1", "p2"]
        for i in range(3, 6):
            core.create_namespaced_pod("default", pod_body(f"p{i}"))
        with pytest.raises(ApiException) as exc:
            list(_stream(core, watch.Watch(), resource_version=first))
        assert exc.value.status == 410


def test_timeout_ends_stream_with_bookmark(core: Client) -> None:
    """Fake only: the fake sends a bookmark as a watch that allows them times out; the real
    server sends them on its own schedule, with no guarantee (none within 75 s, measured)."""
    rv = core.create_namespaced_pod("default", pod_body("a")).metadata.resource_version
    started = time.monotonic()
    w: Client = watch.Watch()
    events = list(_stream(core, w, resource_version=rv, timeout_seconds=1, allow_watch_bookmarks=True))
    assert 0.9 <= time.monotonic() - started < 3
    assert [e["type"] for e in events] == ["BOOKMARK"]
    assert events[0]["raw_object"] == {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}
    assert w.resource_version == rv


def test_bookmark_helper(kube_fake: FakeKubeServer, core: Client) -> None:
    """Fake only: ``send_bookmarks``."""
    core.create_namespaced_pod("default", pod_body("a"))
    kinds = []
    w: Client = watch.Watch()
    for event in _stream(core, w, allow_watch_bookmarks=True):
        kinds.append(event["type"])
        if event["type"] == "ADDED":
            core.create_node({"metadata": {"name": "n"}})  # other kinds advance the RV too
            kube_fake.send_bookmarks()
        else:
            w.stop()
    assert kinds == ["ADDED", "BOOKMARK"]
    assert w.resource_version == str(kube_fake.store.rv)


def test_selector_transitions_become_added_and_deleted(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p", labels={"app": "a"}))
    steps: Iterator[Callable[[], object]] = iter(
        [
            lambda: core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"app": "b"}}}),
            lambda: core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"app": "a"}}}),
            lambda: core.patch_namespaced_pod("p", ns, {"metadata": {"annotations": {"k": "v"}}}),
        ]
    )
    seen = []
    w: Client = watch.Watch()
    for event in _stream(core, w, ns, label_selector="app=a"):
        seen.append((event["type"], event["object"].metadata.labels["app"]))
        step = next(steps, None)
        if step is None:
            w.stop()
        else:
            step()
    # Leaving the selector reports the last matching state (app=a) as DELETED.
    assert seen == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "a"), ("MODIFIED", "a")]


def test_watch_filters_namespace_kind_and_fields(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    other = kube_api.other_namespace()
    rv = core.create_namespaced_pod(ns, pod_body("seed")).metadata.resource_version
    core.create_namespaced_pod(other, pod_body("wanted"))
    core.create_node({"metadata": {"name": kube_api.node_name("wanted")}})
    core.create_namespaced_pod(ns, pod_body("other"))
    core.create_namespaced_pod(ns, pod_body("wanted"))
    w: Client = watch.Watch()
    names = []
    for event in _stream(core, w, ns, resource_version=rv, field_selector="metadata.name=wanted"):
        names.append(event["object"].metadata.name)
        w.stop()
    assert names == ["wanted"]


def test_send_initial_events_marks_the_end(core: Client) -> None:
    """Fake only: the WatchList feature gate is off in the real test bed's Kubernetes 1.28."""
    core.create_namespaced_pod("default", pod_body("a"))
    resp = core.list_namespaced_pod(
        "default",
        watch=True,
        send_initial_events=True,
        allow_watch_bookmarks=True,
        resource_version_match="NotOlderThan",
        timeout_seconds=5,
        _preload_content=False,
    )
    first, second = (json.loads(resp.readline()) for _ in range(2))
    resp.release_conn()
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "a")
    assert second["type"] == "BOOKMARK"
    assert second["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_an_invalid_resource_version_is_an_unexpected_error(kube_api: KubeApi) -> None:
    """The storage layer's invalid-value error is not a Status: the server answers 500, no reason."""
    for watching in ("true", "false"):
        answer = kube_api.raw(
            "GET", f"/api/v1/namespaces/{kube_api.namespace}/pods", watch=watching, resourceVersion="abc"
        )
        assert (answer.status_code, answer.json()) == (
            500,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": 'resourceVersion: Invalid value: "abc": '
                'strconv.ParseUint: parsing "abc": invalid syntax',
                "code": 500,
            },
        )


def test_watches_close_promptly_on_stop() -> None:
    """Fake only: the fake's ``stop``."""
    server = FakeKubeServer().start()
    client: Client = server.api_client()
    core: Client = kubernetes.client.CoreV1Api(client)
    resp = core.list_namespaced_pod("default", watch=True, _preload_content=False)
    server.wait_for(lambda: server.active_watches == 1)
    done = threading.Event()

    def drain() -> None:
        try:
            for _ in resp.stream(1024):
                pass
        except Exception:  # connection torn down: also counts as closed
            pass
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    started = time.monotonic()
    server.stop()
    assert done.wait(2), "watch stream still open after stop()"
    assert time.monotonic() - started < 2
    assert server.active_watches == 0
    client.close()


def test_custom_object_watch(kube_api: KubeApi, widgets: CustomResource) -> None:
    custom: Client = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    args = (widgets.group, widgets.version, kube_api.namespace, widgets.plural)
    custom.create_namespaced_custom_object(*args, {**_widget(widgets, "pg"), "spec": {"minMember": 2}})
    w: Client = watch.Watch()
    seen = []
    for event in w.stream(custom.list_namespaced_custom_object, *args, timeout_seconds=5):
        seen.append((event["type"], event["object"]["spec"]))
        w.stop()
    assert seen == [("ADDED", {"minMember": 2})]


def test_cluster_wide_watch_of_namespaced_kind(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    other = kube_api.other_namespace()
    rv = core.create_namespaced_pod(ns, pod_body("a")).metadata.resource_version
    core.create_namespaced_pod(other, pod_body("b"))
    core.create_node({"metadata": {"name": kube_api.node_name("n")}})
    w: Client = watch.Watch()
    seen = []
    for event in w.stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=5):
        if not event["object"].metadata.namespace.startswith(ns):
            continue  # the real server is shared by the session
        seen.append((event["type"], event["object"].metadata.namespace))
        if len(seen) == 1:
            core.delete_namespaced_pod("a", ns)
        elif event["type"] == "DELETED":
            w.stop()
    assert seen == [("ADDED", other), ("MODIFIED", ns), ("DELETED", ns)]


def test_drop_watches_breaks_open_streams_mid_stream(kube_fake: FakeKubeServer, core: Client) -> None:
    """Fake only: ``drop_watches`` is fault injection."""
    rv = core.create_namespaced_pod("default", pod_body("a")).metadata.resource_version
    resp = core.list_namespaced_pod(
        "default", watch=True, resource_version=rv, timeout_seconds=30, _preload_content=False
    )
    kube_fake.wait_for(lambda: kube_fake.active_watches == 1)
    core.create_namespaced_pod("default", pod_body("b"))
    lines = resp.stream(1024)
    assert json.loads(next(lines))["object"]["metadata"]["name"] == "b"  # streaming
    kube_fake.drop_watches()
    started = time.monotonic()
    # urllib3 reads the chunked body: a connection closed before the final chunk is an error.
    with pytest.raises(urllib3.exceptions.ProtocolError, match="ended prematurely"):
        for _ in lines:
            pass
    assert time.monotonic() - started < 2
    kube_fake.wait_for(lambda: kube_fake.active_watches == 0)
    # Other requests go on; a watch opened afterwards is not dropped, and resumes where it stopped.
    assert core.read_namespaced_pod("a", "default").metadata.name == "a"
    seen = []
    w: Client = watch.Watch()
    for event in _stream(core, w, resource_version=rv):
        seen.append(event["object"].metadata.name)
        if seen == ["b"]:
            core.create_namespaced_pod("default", pod_body("c"))
        else:
            w.stop()
    assert seen == ["b", "c"]
