"""A 409 is not proof that a pod is gone: the bridge's pod writes tell a namesake from a hiccup.

Each write carries the pod's uid, so a pod replaced by a namesake refuses it (a
patch: 422, the uid is immutable; a deletion's precondition: 409) and is rightly
left alone. But an API server also answers 409 for the pod itself (under load,
mid-update); such a write must fail, so the activity retries it, instead of being
dropped as if the pod were gone (a pod never labelled with its job id is never
followed by the job watcher, and its placement waits forever for a job start it
cannot see).
"""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from activities.kube import KubeActivities, KubeSettings
from activities.placement import PlacementActivities
from activities.slurm import SlurmActivities
from bridge import keys
from bridge.models import PodRef
from clients.kube_client import Json, KubeClient, KubeConflict
from clients.slurm_client import SlurmClient
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body

POD = r"^/api/v1/namespaces/default/pods/p$"


@pytest.fixture
async def activities(kube: FakeKubeServer) -> AsyncIterator[KubeActivities]:
    client = KubeClient(kube.aio_configuration())
    yield KubeActivities(client, KubeSettings())
    await client.close()


@pytest.fixture
async def steps(activities: KubeActivities) -> AsyncIterator[PlacementActivities]:
    # Removing pods never talks to Slurm: a client with nobody behind it.
    slurm = SlurmClient("http://127.0.0.1:9", user_name=None, token_file=None)
    yield PlacementActivities(activities, SlurmActivities(slurm))
    await slurm.close()


def job_label(job_id: int) -> Json:
    """The label `prepare_and_submit` writes on each pod of the job it submitted."""
    return {"metadata": {"labels": {keys.LABEL_SLURM_JOB_ID: str(job_id)}}}


def create(kube: FakeKubeServer) -> PodRef:
    pod = kube.create_object("pods", pod_body("p"), "default")
    return PodRef(namespace="default", name="p", uid=pod["metadata"]["uid"])


def labels(kube: FakeKubeServer) -> dict[str, Any]:
    pod = kube.get_object("pods", "p", "default")
    assert pod is not None
    return dict(pod["metadata"].get("labels") or {})


async def test_a_conflict_on_the_pod_itself_fails_the_label_write_for_a_retry(
    kube: FakeKubeServer, activities: KubeActivities
) -> None:
    ref = create(kube)
    kube.fail_next("PATCH", POD, 409, reason="Conflict")
    with pytest.raises(KubeConflict):
        await activities.patch_if_present(ref, job_label(7))
    assert keys.LABEL_SLURM_JOB_ID not in labels(kube)
    await activities.patch_if_present(ref, job_label(7))  # the activity's next attempt
    assert labels(kube)[keys.LABEL_SLURM_JOB_ID] == "7"


async def test_a_namesake_is_left_alone_without_an_error(
    kube: FakeKubeServer, activities: KubeActivities, steps: PlacementActivities
) -> None:
    old = create(kube)
    kube.delete_object("pods", "p", "default")
    create(kube)  # same name, another uid
    assert await activities.patch_if_present(old, job_label(7)) is None
    await activities.set_unschedulable([old], "Unschedulable", "no")
    await activities.remove_finalizer([old])
    assert await steps._evict(old, "SlurmJobEnded", "done", force=True)
    assert keys.LABEL_SLURM_JOB_ID not in labels(kube)
    assert kube.get_object("pods", "p", "default") is not None


async def test_a_conflict_on_the_pod_itself_fails_the_condition_write(
    kube: FakeKubeServer, activities: KubeActivities
) -> None:
    ref = create(kube)
    kube.fail_next("PATCH", POD + "|/pods/p/status$", 409, reason="Conflict")
    with pytest.raises(KubeConflict):
        await activities.set_unschedulable([ref], "Unschedulable", "no node fits")


async def test_a_conflict_on_the_pod_itself_fails_its_deletion_for_a_retry(
    kube: FakeKubeServer, steps: PlacementActivities
) -> None:
    """The release's deletion of a pod a disruption budget held too long (`force_delete`)."""
    ref = create(kube)
    kube.fail_next("DELETE", POD, 409, reason="Conflict")
    with pytest.raises(KubeConflict):
        await steps._evict(ref, "SlurmJobEnded", "the job ended", force=True)
    assert kube.get_object("pods", "p", "default") is not None
    assert await steps._evict(ref, "SlurmJobEnded", "the job ended", force=True)
    assert kube.get_object("pods", "p", "default") is None
