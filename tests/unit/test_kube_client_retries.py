"""The Kubernetes client repeats what is safe to repeat, at once, a few times.

A read that met a 5xx, a 429 or no answer, and any request refused with 429 and
Retry-After (API Priority and Fairness refuses before doing anything), is tried
again QUICK_RETRIES times before the error reaches the caller. Writes that
failed otherwise, 409s and a PodDisruptionBudget's 429 (no Retry-After) are the
caller's to handle, at once.
"""

from collections.abc import Iterator

import pytest

from clients.kube_client import QUICK_RETRIES, KubeClient, KubeConflict, KubeError, api_path
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body

POD = api_path("pods", namespace="default", name="p")


@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        server.create_object("pods", pod_body("p"), "default")
        yield server


def calls(kube: FakeKubeServer, method: str) -> int:
    return sum(1 for r in kube.requests if r.method == method and r.path.startswith(POD))


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_read_is_repeated_through_transient_failures(
    kube: FakeKubeServer, client: KubeClient, status: int
) -> None:
    kube.fail_next("GET", f"^{POD}$", status, count=QUICK_RETRIES)
    assert (await client.request("GET", POD))["metadata"]["name"] == "p"
    assert calls(kube, "GET") == QUICK_RETRIES + 1


async def test_a_read_failing_every_time_fails_after_the_quick_retries(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    kube.fail_next("GET", f"^{POD}$", 500, count=100)
    with pytest.raises(KubeError) as caught:
        await client.request("GET", POD)
    assert caught.value.status == 500
    assert calls(kube, "GET") == QUICK_RETRIES + 1


async def test_a_write_that_failed_is_not_repeated(kube: FakeKubeServer, client: KubeClient) -> None:
    kube.fail_next("PATCH", f"^{POD}$", 500)
    with pytest.raises(KubeError):
        await client.request(
            "PATCH",
            POD,
            body={"metadata": {"labels": {"a": "b"}}},
            content_type="application/merge-patch+json",
        )
    kube.fail_next("PATCH", f"^{POD}$", 409)
    with pytest.raises(KubeConflict):
        await client.request(
            "PATCH",
            POD,
            body={"metadata": {"labels": {"a": "b"}}},
            content_type="application/merge-patch+json",
        )
    assert calls(kube, "PATCH") == 2


async def test_a_write_refused_with_retry_after_is_repeated(kube: FakeKubeServer, client: KubeClient) -> None:
    kube.fail_next("PATCH", f"^{POD}$", 429, retry_after=0)
    patched = await client.request(
        "PATCH", POD, body={"metadata": {"labels": {"a": "b"}}}, content_type="application/merge-patch+json"
    )
    assert patched["metadata"]["labels"] == {"a": "b"}
    assert calls(kube, "PATCH") == 2


async def test_an_eviction_a_budget_blocks_is_the_callers(kube: FakeKubeServer, client: KubeClient) -> None:
    kube.block_evictions()
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "p", "namespace": "default"},
    }
    with pytest.raises(KubeError) as caught:
        await client.request("POST", f"{POD}/eviction", body=eviction)
    assert caught.value.status == 429
    assert calls(kube, "POST") == 1
