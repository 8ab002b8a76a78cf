"""The pod watcher resumes a stream that broke off after a healthy while, as client-go does.

Its resourceVersion is still good: sleeping and re-listing every pod of the
scheduler would only blind the bridge for seconds at each cut connection.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
from temporalio.client import Client

from clients.kube_client import HEALTHY_STREAM_SECONDS, KubeClient, api_path
from testbed.kube_fake import FakeKubeServer
from worker.pod_watcher import PodWatcher

PODS = api_path("pods")


@pytest.fixture
async def watcher(kube: FakeKubeServer) -> AsyncIterator[PodWatcher]:
    client = KubeClient(kube.aio_configuration())
    # No pod ever names the scheduler here: Temporal is never called.
    watcher = PodWatcher(client, cast(Client, None), task_queue="unused", scheduler_name="slurm-bridge")
    task = asyncio.create_task(watcher.run())
    yield watcher
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.close()


def requests(kube: FakeKubeServer, *, watch: bool) -> list[dict[str, str]]:
    return [r.query for r in kube.requests if r.path == PODS and (r.query.get("watch") == "true") == watch]


async def test_a_stream_broken_off_after_a_healthy_while_is_resumed_at_once(
    kube: FakeKubeServer, watcher: PodWatcher
) -> None:
    await asyncio.wait_for(watcher.synced.wait(), 5)
    await kube.wait_for_async(lambda: kube.active_watches == 1)
    version = requests(kube, watch=True)[0]["resourceVersion"]
    await asyncio.sleep(HEALTHY_STREAM_SECONDS)  # the stream has been up a healthy while
    kube.drop_watches()
    # Well within the 2 s the watcher waits after a failure.
    await kube.wait_for_async(lambda: len(requests(kube, watch=True)) == 2, 1.5)
    assert requests(kube, watch=True)[1]["resourceVersion"] == version
    assert len(requests(kube, watch=False)) == 1  # no re-list


async def test_a_stream_broken_off_at_once_is_a_failure(kube: FakeKubeServer, watcher: PodWatcher) -> None:
    await asyncio.wait_for(watcher.synced.wait(), 5)
    await kube.wait_for_async(lambda: kube.active_watches == 1)
    kube.drop_watches()
    await kube.wait_for_async(lambda: len(requests(kube, watch=False)) == 2, 5)  # backed off, re-listed
