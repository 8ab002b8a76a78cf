"""Claiming a pod: the finalizer and the placement annotation in one strategic-merge patch.

Nothing is read first; the pod the patch returns says whether it can be placed. Each
case runs over real HTTP against the fake API server, which answers as kube-apiserver
does (a pod being deleted refuses a new finalizer with 422; a patch naming another
pod's uid fails with 422).
"""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from activities.kube import KubeActivities, KubeSettings
from activities.placement import PlacementActivities
from activities.slurm import SlurmActivities
from bridge import keys
from bridge.models import PodRef
from clients.kube_client import KubeClient, KubeConflict
from clients.slurm_client import SlurmClient
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body

POD = r"^/api/v1/namespaces/default/pods/p$"
PLACEMENT = "placement/slurm-bridge/pod/default/p/u1@u1"


@pytest.fixture
async def steps(client: KubeClient) -> AsyncIterator[PlacementActivities]:
    # The claim never talks to Slurm: a client with nobody behind it.
    slurm = SlurmClient("http://127.0.0.1:9", user_name=None, token_file=None)
    yield PlacementActivities(KubeActivities(client, KubeSettings()), SlurmActivities(slurm))
    await slurm.close()


def create(kube: FakeKubeServer, finalizers: list[str] | None = None) -> PodRef:
    body = pod_body("p")
    if finalizers:
        body["metadata"]["finalizers"] = finalizers
    pod = kube.create_object("pods", body, "default")
    return PodRef(namespace="default", name="p", uid=pod["metadata"]["uid"])


def stored(kube: FakeKubeServer) -> dict[str, Any]:
    pod = kube.get_object("pods", "p", "default")
    assert pod is not None
    return pod


async def test_a_pod_is_claimed_once_however_often_the_step_runs(
    kube: FakeKubeServer, steps: PlacementActivities
) -> None:
    ref = create(kube, ["someone/else"])
    kube.fail_next("PATCH", POD, 409, reason="Conflict")
    with pytest.raises(KubeConflict):  # a 409 for the pod itself is not taken for a namesake
        await steps._claim(ref, PLACEMENT)
    first = await steps._claim(ref, PLACEMENT)  # the activity's next attempt
    again = await steps._claim(ref, PLACEMENT)
    assert first is not None
    assert again is not None
    meta = stored(kube)["metadata"]
    # Added once, beside the other: kube-apiserver's strategic merge puts the patch's items first.
    assert meta["finalizers"] == [keys.FINALIZER, "someone/else"]
    assert meta["annotations"][keys.ANNOTATION_PLACEMENT] == PLACEMENT
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]  # no second write


async def test_a_pod_being_deleted_is_not_claimed(kube: FakeKubeServer, steps: PlacementActivities) -> None:
    ref = create(kube, ["someone/else"])  # keeps it while it is being deleted
    kube.delete_object("pods", "p", "default")
    assert await steps._claim(ref, PLACEMENT) is None
    assert stored(kube)["metadata"]["finalizers"] == ["someone/else"]  # the server refused ours


async def test_a_finished_pod_is_not_claimed(kube: FakeKubeServer, steps: PlacementActivities) -> None:
    ref = create(kube)
    kube.set_pod_phase("default", "p", "Succeeded")
    assert await steps._claim(ref, PLACEMENT) is None


async def test_a_namesake_is_neither_claimed_nor_an_error(
    kube: FakeKubeServer, steps: PlacementActivities
) -> None:
    old = create(kube)
    kube.delete_object("pods", "p", "default")
    create(kube)
    assert await steps._claim(old, PLACEMENT) is None
    assert keys.FINALIZER not in (stored(kube)["metadata"].get("finalizers") or [])
