"""hold_next: a request parked between two writes of a client, so a test can act exactly there.

Fake only: fault injection.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import pytest

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body

POD = "/api/v1/namespaces/default/pods/p"
LABEL = {"metadata": {"labels": {"step": "labelled"}}}


@pytest.fixture
def pod(kube_fake: FakeKubeServer) -> None:
    kube_fake.create_object("pods", pod_body("p"), "default")


def patch_in_background(kube_fake: FakeKubeServer, body: Any) -> tuple[threading.Thread, list[Any]]:
    """PATCH the pod from a thread over a raw connection (no client retries); its answer or error."""
    outcome: list[Any] = []

    def run() -> None:
        conn = http.client.HTTPConnection(kube_fake.host, kube_fake.port, timeout=10)
        try:
            headers = {"Content-Type": "application/merge-patch+json"}
            conn.request("PATCH", POD, json.dumps(body), headers)
            response = conn.getresponse()
            outcome.append((response.status, json.loads(response.read())))
        except (http.client.HTTPException, OSError) as error:
            outcome.append(error)
        finally:
            conn.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def labels(kube_fake: FakeKubeServer) -> dict[str, str]:
    pod = kube_fake.get_object("pods", "p", "default")
    assert pod is not None
    return dict(pod["metadata"].get("labels") or {})


@pytest.mark.usefixtures("pod")
def test_a_request_held_before_the_store_and_dropped_never_happens(kube_fake: FakeKubeServer) -> None:
    hold = kube_fake.hold_next("PATCH", "/pods/p$", body='"step"', applied=False)
    thread, outcome = patch_in_background(kube_fake, LABEL)
    kube_fake.wait_for(lambda: hold.arrived)
    assert labels(kube_fake) == {}
    assert hold.request is not None
    assert hold.request.body == LABEL

    hold.drop()
    thread.join(10)
    assert isinstance(outcome[0], http.client.RemoteDisconnected | ConnectionError)
    assert labels(kube_fake) == {}


@pytest.mark.usefixtures("pod")
def test_a_request_held_before_the_store_and_released_is_applied_then(kube_fake: FakeKubeServer) -> None:
    hold = kube_fake.hold_next("PATCH", "/pods/p$", applied=False)
    thread, outcome = patch_in_background(kube_fake, LABEL)
    kube_fake.wait_for(lambda: hold.arrived)
    assert labels(kube_fake) == {}
    assert not outcome

    hold.release()
    thread.join(10)
    assert outcome[0][0] == 200
    assert labels(kube_fake) == {"step": "labelled"}


@pytest.mark.usefixtures("pod")
def test_a_request_held_after_the_store_is_applied_and_its_answer_waits(kube_fake: FakeKubeServer) -> None:
    # Only a PATCH whose body names the label is held: the first one passes.
    hold = kube_fake.hold_next("PATCH", "/pods/p$", body='"step"', applied=True)
    thread, outcome = patch_in_background(kube_fake, {"metadata": {"labels": {"other": "x"}}})
    thread.join(10)
    assert outcome[0][0] == 200
    assert not hold.arrived

    thread, outcome = patch_in_background(kube_fake, LABEL)
    kube_fake.wait_for(lambda: hold.arrived)
    assert labels(kube_fake) == {"other": "x", "step": "labelled"}
    assert not outcome  # the change is made, the client does not know yet

    hold.release()
    thread.join(10)
    status, answer = outcome[0]
    assert (status, answer["metadata"]["labels"]["step"]) == (200, "labelled")


@pytest.mark.usefixtures("pod")
def test_a_held_answer_that_is_dropped_leaves_the_change_made(kube_fake: FakeKubeServer) -> None:
    hold = kube_fake.hold_next("PATCH", "/pods/p$", applied=True)
    thread, outcome = patch_in_background(kube_fake, LABEL)
    kube_fake.wait_for(lambda: hold.arrived)
    hold.drop()
    thread.join(10)
    assert isinstance(outcome[0], http.client.RemoteDisconnected | ConnectionError)
    assert labels(kube_fake) == {"step": "labelled"}


@pytest.mark.usefixtures("pod")
def test_a_disarmed_hold_parks_nothing(kube_fake: FakeKubeServer) -> None:
    hold = kube_fake.hold_next("PATCH", "/pods/p$", applied=False)
    kube_fake.disarm(hold)
    thread, outcome = patch_in_background(kube_fake, LABEL)
    thread.join(10)
    assert outcome[0][0] == 200
    assert not hold.arrived
    assert labels(kube_fake) == {"step": "labelled"}
