"""Placements started ahead of their claim: at most a few, so that in a burst of new pods the
placements already running do not wait in Temporal's task queue behind every new one's first task
(a burst of 1,000: the wake-up of a pod whose job ran waited 6 s p50, 52 s p99)."""

import asyncio
from typing import Any, cast

import pytest
from temporalio.client import Client

from bridge import keys
from clients.kube_client import KubeClient
from worker.pod_watcher import PodWatcher, workflow_id
from worker.start_admission import StartAdmission

TIMEOUT = 5.0


async def test_starts_beyond_the_limit_wait_their_turn_in_order() -> None:
    admission = StartAdmission(limit=2)
    first, second, third, fourth = (admission.request(key) for key in "abcd")
    assert [start.done() for start in (first, second, third, fourth)] == [True, True, False, False]
    assert admission.waits == 2

    admission.leave("b")  # b claimed its pods
    assert third.done()
    assert not fourth.done()  # first come, first served
    admission.leave("a")
    assert fourth.done()
    assert admission.held == 2


async def test_another_pod_of_a_started_group_needs_no_room_of_its_own() -> None:
    admission = StartAdmission(limit=1)
    await asyncio.wait_for(admission.enter("group"), TIMEOUT)
    await asyncio.wait_for(admission.enter("group"), TIMEOUT)
    assert admission.held == 1
    assert admission.waits == 0


async def test_the_pods_of_a_group_that_queued_together_start_together() -> None:
    admission = StartAdmission(limit=1)
    admission.request("a")
    first, second, other = admission.request("group"), admission.request("group"), admission.request("b")
    admission.leave("a")
    assert (first.result(), second.result()) == (True, False)  # one room for the group
    assert not other.done()
    assert admission.held == 1


async def test_a_placement_that_never_claims_lets_its_room_go() -> None:
    admission = StartAdmission(limit=1, hold_seconds=0.05)
    await admission.enter("waits for its other pods")
    await asyncio.wait_for(admission.enter("next"), TIMEOUT)  # the first one's hold ran out
    assert admission.held == 1


async def test_a_start_cancelled_while_it_waits_takes_no_room() -> None:
    admission = StartAdmission(limit=1)
    await admission.enter("a")
    this = asyncio.current_task()
    assert this is not None
    asyncio.get_running_loop().call_soon(this.cancel)  # once `enter` below waits
    with pytest.raises(asyncio.CancelledError):
        await admission.enter("b")
    this.uncancel()
    after = admission.request("c")
    admission.leave("a")
    assert after.done()  # b's turn was skipped
    assert admission.held == 1


class _Temporal:
    """Temporal as the pod watcher sees it: the placements it starts, in order."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.changed = asyncio.Condition()

    async def start_workflow(self, *args: Any, id: str, **kwargs: Any) -> None:
        async with self.changed:
            self.started.append(id)
            self.changed.notify_all()

    def get_workflow_handle(self, workflow_id: str) -> "_Temporal":
        return self  # the claimed pod's changes are signalled to its placement

    async def signal(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def until_started(self, count: int) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: len(self.started) >= count), TIMEOUT)


def new_pod(name: str, *, claimed_by: str | None = None) -> dict[str, Any]:
    annotations = {keys.ANNOTATION_PLACEMENT: f"{claimed_by}@{name}"} if claimed_by else {}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": name, "annotations": annotations},
        "spec": {"schedulerName": keys.DEFAULT_SCHEDULER_NAME},
        "status": {"phase": "Pending"},
    }


def watcher(temporal: _Temporal, limit: int) -> PodWatcher:
    return PodWatcher(
        cast(KubeClient, None),
        cast(Client, temporal),
        task_queue="unused",
        scheduler_name=keys.DEFAULT_SCHEDULER_NAME,
        admission=StartAdmission(limit=limit),
    )


async def test_the_pod_watcher_starts_the_next_placement_once_one_claimed_its_pods() -> None:
    temporal = _Temporal()
    pods = watcher(temporal, limit=1)
    pods._on_event("ADDED", new_pod("a"))
    pods._on_event("ADDED", new_pod("b"))
    await temporal.until_started(1)
    [first] = temporal.started
    assert pods.admission.waits == 1  # b waits for a's placement to claim a

    pods._on_event("MODIFIED", new_pod("a", claimed_by=first))
    await temporal.until_started(2)
    assert temporal.started[1] != first
    await pods.close()


async def test_a_pod_deleted_while_its_start_waits_is_never_started() -> None:
    temporal = _Temporal()
    pods = watcher(temporal, limit=1)
    pods._on_event("ADDED", new_pod("a"))
    pods._on_event("ADDED", new_pod("b"))
    pods._on_event("ADDED", new_pod("c"))
    await temporal.until_started(1)
    pods._on_event("DELETED", new_pod("b"))

    pods._on_event("MODIFIED", new_pod("a", claimed_by=temporal.started[0]))
    await temporal.until_started(2)
    assert temporal.started[1] == workflow_id(pods._refs["c"])  # b's turn went to c
    await pods.close()
