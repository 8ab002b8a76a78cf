"""The leader's watcher report on its Lease, and what the CLI reads from it (fake API server, real HTTP)."""

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from bridge import keys
from clients.kube_client import KubeClient
from clients.leader import LeaderElector, LeaderTimings
from testbed.kube_fake import FakeKubeServer
from worker.watcher_health import Leadership, WatcherHealth, annotation, read_leadership, rfc3339

FAST = LeaderTimings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.2)
LEASES = "leases.coordination.k8s.io"
NOW = time.time()  # the CLI's clock in the table below


@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        yield server


async def test_the_leader_reports_its_watchers_on_every_renewal_and_the_cli_reads_them(
    kube: FakeKubeServer,
) -> None:
    failing = [0]

    def watchers() -> dict[str, str]:
        return annotation(
            "replica-a",
            {
                "pod": WatcherHealth(synced=True, last_success=rfc3339(time.time())),
                "job": WatcherHealth(synced=True, failing=failing[0], errors=failing[0]),
            },
        )

    client = KubeClient(kube.aio_configuration())
    elector = LeaderElector(client, "default", "bridge", "replica-a", FAST, annotate=watchers)

    async def lead() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(elector.run(lead))
    try:
        await kube.wait_for_async(lambda: elector.is_leader)
        leadership = await read_leadership(client, "default", "bridge")
        assert (leadership.holder, leadership.alive()) == ("replica-a", True)
        assert leadership.report is not None
        assert leadership.report.watchers["job"].ok

        failing[0] = 3  # the next renewal carries it
        await kube.wait_for_async(lambda: '"failing":3' in reported(kube))
        # No request of its own: every write of the Lease is the elector's create or renewal, each with it.
        writes = [r for r in kube.requests if "/leases" in r.path and r.method != "GET"]
        assert {r.method for r in writes} == {"POST", "PUT"}
        assert all(keys.ANNOTATION_WATCHER_HEALTH in r.body["metadata"]["annotations"] for r in writes)
        leadership = await read_leadership(client, "default", "bridge")
        lines = leadership.describe()
        assert lines[0].startswith("leader: replica-a (Lease default/bridge, renewed ")
        assert lines[1].startswith("  job watcher: FAILING (3 in a row), never succeeded, 3 errors")
        assert lines[2].startswith("  pod watcher: ok, last success ")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def reported(kube: FakeKubeServer) -> str:
    lease = kube.get_object(LEASES, "bridge", "default") or {}
    annotations = lease.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(keys.ANNOTATION_WATCHER_HEALTH, ""))


def lease(holder: str, renewed: float, annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "bridge", "namespace": "default", "annotations": annotations or {}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": rfc3339(renewed)},
    }


@pytest.mark.parametrize(
    ("stored", "first_line", "more"),
    [
        (None, "leader: unknown (no Lease default/bridge: is LEADER_ELECTION on?)", []),
        (lease("", NOW), "leader: none (Lease default/bridge is free: no watchers run)", []),
        (
            lease("replica-b", NOW - 60, annotation("replica-b", {"pod": WatcherHealth(synced=False)})),
            "leader: replica-b (Lease default/bridge, renewed 60s ago, EXPIRED: no replica is watching)",
            ["  pod watcher: not synced yet, never succeeded, 0 errors"],
        ),
        (
            lease("replica-c", NOW, {keys.ANNOTATION_WATCHER_HEALTH: "{not json"}),
            "leader: replica-c (Lease default/bridge, renewed 0s ago)",
            ["  watchers: not reported by this leader yet"],
        ),
        (
            # A report left by the previous leader is not this one's.
            lease("replica-d", NOW, annotation("replica-a", {"pod": WatcherHealth(synced=True)})),
            "leader: replica-d (Lease default/bridge, renewed 0s ago)",
            ["  watchers: not reported by this leader yet"],
        ),
    ],
)
async def test_what_the_cli_says_about_each_lease(
    kube: FakeKubeServer, stored: dict[str, object] | None, first_line: str, more: list[str]
) -> None:
    if stored is not None:
        kube.create_object(LEASES, stored, "default")
    client = KubeClient(kube.aio_configuration())
    try:
        leadership = await read_leadership(client, "default", "bridge")
    finally:
        await client.close()
    assert leadership.describe(now=NOW) == [first_line, *more]
    assert Leadership.model_validate(json.loads(leadership.model_dump_json())) == leadership
