"""The pod watcher's bookkeeping of the jobs its pods' labels name, which LiveJobs follows.

A job is followed while any claimed pod carries its label and some of them still run; once all
of its pods finished the placement cancels it, and once none carries the label it is forgotten.
Pods are fed as watch events (`_on_event`); signals go to a stand-in that takes them.
"""

from typing import Any, cast

from temporalio.client import Client

from bridge import keys
from clients.kube_client import KubeClient
from worker.job_registry import LiveJobs
from worker.pod_watcher import PodWatcher

PLACEMENT = f"placement/{keys.DEFAULT_INSTALLATION}/ns/group-a@1"


class _Handle:
    async def signal(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Temporal:
    def get_workflow_handle(self, workflow_id: str) -> _Handle:
        return _Handle()


def pod(uid: str, job_id: int, *, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": f"pod-{uid}",
            "uid": uid,
            "labels": {keys.LABEL_SLURM_JOB_ID: str(job_id)},
            "annotations": {keys.ANNOTATION_PLACEMENT: PLACEMENT},
        },
        "spec": {"schedulerName": keys.DEFAULT_SCHEDULER_NAME, "nodeName": f"node-{uid}"},
        "status": {"phase": phase},
    }


def watcher() -> tuple[PodWatcher, LiveJobs]:
    jobs = LiveJobs()
    made = PodWatcher(
        cast(KubeClient, None),
        cast(Client, _Temporal()),
        task_queue="unused",
        scheduler_name=keys.DEFAULT_SCHEDULER_NAME,
        jobs=jobs,
    )
    return made, jobs


async def test_a_job_is_followed_until_all_its_pods_finished() -> None:
    pods, jobs = watcher()
    pods._on_event("ADDED", pod("a", 7))
    pods._on_event("ADDED", pod("b", 7))
    pods._on_event("ADDED", pod("c", 8))  # another job's pod changes nothing for job 7
    pods._on_event("MODIFIED", pod("a", 7, phase="Succeeded"))
    assert 7 in jobs
    assert 8 in jobs
    pods._on_event("MODIFIED", pod("b", 7, phase="Failed"))
    assert 7 not in jobs
    assert 8 in jobs
    await pods.close()


async def test_a_job_is_forgotten_once_no_pod_carries_its_label() -> None:
    pods, jobs = watcher()
    pods._on_event("ADDED", pod("a", 7))
    pods._on_event("ADDED", pod("b", 7))
    pods._on_event("DELETED", pod("a", 7))
    assert 7 in jobs
    pods._on_event("DELETED", pod("b", 7))
    assert len(jobs) == 0
    await pods.close()


async def test_a_pod_labelled_with_a_new_job_counts_for_that_job_only() -> None:
    pods, jobs = watcher()
    pods._on_event("ADDED", pod("a", 7))
    pods._on_event("ADDED", pod("b", 7))
    pods._on_event("MODIFIED", pod("a", 9))  # resubmitted: a's label names job 9 now
    pods._on_event("MODIFIED", pod("b", 7, phase="Succeeded"))
    assert 7 not in jobs  # its only pod left finished
    assert 9 in jobs
    pods._on_event("DELETED", pod("a", 9))
    assert 9 not in jobs
    await pods.close()
