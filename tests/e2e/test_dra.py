"""DRA pods on real Slurm: the ResourceClaim names exactly the CPUs and GPUs Slurm allocated.

The node's devices are published as a DRA driver would (ResourceSlices on the
fake API server): GPUs of `gpu.example.com` with an `index` attribute, CPUs of
`dra.cpu` with `cpuID`. Device names are deliberately not in index order, so a
claim that picked "the first devices" instead of Slurm's would be caught.
"""

from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from activities.dra import DEVICES_NOT_PINNED
from bridge import grouping, keys
from bridge.dra import EXTENDED_RESOURCE_CLAIM, expand_indexes
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of

pytestmark = pytest.mark.slurm
GPU_CLASS = "gpu.example.com"
DRA_GPU = keys.DRA_RESOURCE_PREFIX + GPU_CLASS
DRA_CPU = keys.DRA_RESOURCE_PREFIX + keys.DRA_CPU_CLASS
SHARED = {keys.SLURMJOB_PREFIX + "exclusive": "false"}


def publish_devices(
    stack: Stack, node: str, gpu_indexes: dict[str, int], cpus: int, gpu_class: str = GPU_CLASS
) -> None:
    """DeviceClasses, and the node's ResourceSlices as the two DRA drivers would publish them."""
    for name in (gpu_class, keys.DRA_CPU_CLASS):
        if stack.kube.get_object("deviceclasses.resource.k8s.io", name) is not None:
            continue
        selector = {"cel": {"expression": f"device.driver == '{name}'"}}
        stack.kube.create_object(
            "deviceclasses.resource.k8s.io",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [selector]},
            },
        )
    gpus = [{"name": name, "attributes": {"index": {"int": index}}} for name, index in gpu_indexes.items()]
    # The CPU driver names its devices by CPU id, qualified attribute names this time.
    cpu_devices = [
        {
            "name": f"cpudev{cpu:03d}",
            "attributes": {"dra.cpu/cpuID": {"int": cpu}, "dra.cpu/socketID": {"int": 0}},
        }
        for cpu in reversed(range(cpus))
    ]
    for driver, devices in ((gpu_class, gpus), (keys.DRA_CPU_CLASS, cpu_devices)):
        stack.kube.create_object(
            "resourceslices.resource.k8s.io",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{driver}"},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            },
        )


def dra_pod(
    stack: Stack,
    name: str,
    requests: dict[str, str],
    annotations: dict[str, str],
    labels: dict[str, str] | None = None,
) -> Pod:
    meta = {"namespace": stack.namespace, "name": name, "annotations": annotations, "labels": labels or {}}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": requests}}
            ],
        },
    }
    return stack.kube.create_object("pods", body)


def gpu_pod(stack: Stack, name: str) -> Pod:
    return dra_pod(stack, name, {"cpu": "1", "memory": "64Mi", "nvidia.com/gpu": "1"}, SHARED)


def claims(stack: Stack) -> list[dict[str, Any]]:
    return stack.kube.objects("resourceclaims.resource.k8s.io", stack.namespace)


async def finish(stack: Stack, name: str) -> None:
    stack.kube.set_pod_phase(stack.namespace, name, "Running")
    stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    await stack.wait_pod(name, finished_cleanly)


async def test_a_dra_pod_gets_a_claim_of_exactly_the_cpus_and_gpus_slurm_allocated(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1, cpus=4, gres="gpu:2")
    (node,) = stack.partition.node_names
    by_index = {"gpu-b": 0, "gpu-a": 1}
    publish_devices(stack, node, by_index, cpus=4)
    # A plain GPU pod first: Slurm gives it GPU 0 and a core, so the DRA pod's share is not "the first".
    gpu_pod(stack, "plain")
    await stack.wait_pod("plain", bound)

    requests = {DRA_CPU: "2", DRA_GPU: "1", "memory": "64Mi"}
    dra_pod(stack, "dra", requests, SHARED)
    pod = await stack.wait_pod("dra", bound)

    job_id = job_id_of(pod)
    assert job_id is not None
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert (job["tres_per_node"], job["cpus_per_task"]["number"]) == ("gres/gpu=1", 2)
    [layout] = [entry.model_dump(mode="json") for entry in await stack.slurm.get_job_resources(job_id)]
    [gres] = layout["gres"]
    slurm_gpus = expand_indexes(gres["index"])
    bits = int(layout["core_bitmap"], 16)
    slurm_cores = [i for i in range(4) if bits >> i & 1]
    assert slurm_gpus == [1]  # GPU 0 is the plain pod's
    assert len(slurm_cores) == 2

    [claim] = claims(stack)
    status = pod["status"]["extendedResourceClaimStatus"]
    assert status["resourceClaimName"] == claim["metadata"]["name"]
    # Request names as kube-scheduler's: container 0, the resource's place among its sorted requests.
    assert status["requestMappings"] == [
        {"containerName": "main", "requestName": "container-0-request-0", "resourceName": DRA_CPU},
        {"containerName": "main", "requestName": "container-0-request-1", "resourceName": DRA_GPU},
    ]
    assert claim["metadata"]["annotations"][EXTENDED_RESOURCE_CLAIM] == "true"
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Pod", pod["metadata"]["uid"], True)
    results = claim["status"]["allocation"]["devices"]["results"]
    gpu_names = {index: name for name, index in by_index.items()}
    assert [r["device"] for r in results if r["request"] == "container-0-request-1"] == [
        gpu_names[i] for i in slurm_gpus
    ]
    # Slurm's core i is the node's i-th CPU in cpuID order: here cpuID i.
    assert [r["device"] for r in results if r["request"] == "container-0-request-0"] == [
        f"cpudev{c:03d}" for c in slurm_cores
    ]
    assert {(r["driver"], r["pool"]) for r in results} == {(GPU_CLASS, node), (keys.DRA_CPU_CLASS, node)}
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "dra", "uid": pod["metadata"]["uid"]}
    ]
    [gpu_request] = [r for r in claim["spec"]["devices"]["requests"] if r["name"] == "container-0-request-1"]
    assert gpu_request["exactly"]["deviceClassName"] == GPU_CLASS
    assert gpu_request["exactly"]["count"] == 1

    # The placement ends: the claim goes with it.
    await finish(stack, "dra")
    assert claims(stack) == []
    await finish(stack, "plain")


async def test_devices_slurm_allocated_that_the_node_does_not_publish_fail_the_placement(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1, cpus=4, gres="gpu:2")
    (node,) = stack.partition.node_names
    publish_devices(stack, node, {"gpu-x": 5, "gpu-y": 6}, cpus=4)  # no device has Slurm's index 0

    created = dra_pod(stack, "dra", {DRA_GPU: "1", "cpu": "1"}, {})

    await stack.wait_pod("dra", lambda p: job_id_of(p) is not None)  # the placement has started
    with pytest.raises(WorkflowFailureError) as failure:
        await stack.handle(created).result()
    assert failure.value.cause.type == DEVICES_NOT_PINNED  # type: ignore[attr-defined]
    assert "GPU index 0" in str(failure.value.cause)
    pod = await stack.wait_pod("dra", finished_cleanly)
    assert bound(pod) is None
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (condition["status"], condition["reason"]) == ("False", DEVICES_NOT_PINNED)
    assert "no gpu.example.com device of node" in condition["message"]
    assert any(e["reason"] == DEVICES_NOT_PINNED for e in stack.events("dra"))
    assert claims(stack) == []
    job_id = job_id_of(pod)
    assert job_id is not None
    states = (await stack.slurm.get_job(job_id)).model_dump(mode="json")["job_state"]
    assert "CANCELLED" in states


async def test_each_pod_of_a_group_gets_its_own_nodes_devices_and_an_ended_job_takes_the_claims(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=2, cpus=2, gres="gpu:2")
    for node in stack.partition.node_names:
        # Device names carry the node's name: a claim naming the other node's GPU is caught.
        publish_devices(stack, node, {f"{node}-gpu0": 0, f"{node}-gpu1": 1}, cpus=2)
    stack.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "pair", "namespace": stack.namespace},
            "spec": {"minMember": 2},
        },
    )
    names = ["pair-0", "pair-1"]
    for name in names:
        dra_pod(stack, name, {DRA_GPU: "2", "cpu": "1"}, {}, labels={grouping.LABEL_POD_GROUP: "pair"})
    pods = [await stack.wait_pod(name, bound) for name in names]

    by_pod = {c["metadata"]["ownerReferences"][0]["name"]: c for c in claims(stack)}
    assert sorted(by_pod) == names
    assert {bound(p) for p in pods} == set(stack.partition.node_names)
    for pod in pods:
        bound_to = bound(pod)
        claim = by_pod[pod["metadata"]["name"]]
        results = claim["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == [f"{bound_to}-gpu0", f"{bound_to}-gpu1"]
        assert pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"] == claim["metadata"]["name"]

    # Slurm ends the job under the running pods: they are evicted and the claims deleted.
    for name in names:
        stack.kube.set_pod_phase(stack.namespace, name, "Running")
    job_id = job_id_of(pods[0])
    assert job_id is not None
    await stack.slurm.cancel_job(job_id)
    for name in names:
        await stack.wait_pod(name, finished_cleanly, timeout=60)
    await stack.kube.wait_for_async(lambda: claims(stack) == [], timeout=30)


async def test_a_class_the_operator_adds_is_asked_for_and_pinned_as_the_setting_says(
    make_stack: StackFactory,
) -> None:
    # DRA_DEVICE_CLASSES names another GPU driver's class, untyped: asked for as gres/gpu, pinned
    # to the GRES index Slurm allocated, like the default classes.
    acme = "gpu.acme.example.com"
    stack = await make_stack(nodes=1, cpus=4, gres="gpu:2", dra_device_classes=f"{acme}=gpu,dra.cpu=cpu")
    (node,) = stack.partition.node_names
    publish_devices(stack, node, {"acme-b": 0, "acme-a": 1}, cpus=4, gpu_class=acme)
    gpu_pod(stack, "plain")  # takes GPU 0
    await stack.wait_pod("plain", bound)

    dra_pod(stack, "dra", {keys.DRA_RESOURCE_PREFIX + acme: "1", "cpu": "1", "memory": "64Mi"}, SHARED)
    pod = await stack.wait_pod("dra", bound)

    job_id = job_id_of(pod)
    assert job_id is not None
    assert (await stack.slurm.get_job(job_id)).model_dump(mode="json")["tres_per_node"] == "gres/gpu=1"
    [claim] = claims(stack)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["device"]) == (acme, "acme-a")  # Slurm's GPU 1
    [request] = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == acme
    await finish(stack, "dra")
    await finish(stack, "plain")


async def test_a_typed_class_asks_slurm_for_the_typed_gres(make_stack: StackFactory) -> None:
    # The class as gres gpu:h100. The bed's GPUs are untyped (docs/slurm-testbed.md, "Typed GRES"),
    # where Slurm refuses a typed request at submission (2014): the job sent asked for the type,
    # which an untyped gres/gpu=1 on this 2-GPU node would not have been refused for.
    stack = await make_stack(nodes=1, cpus=4, gres="gpu:2", dra_device_classes=f"{GPU_CLASS}=gpu:h100")
    (node,) = stack.partition.node_names
    publish_devices(stack, node, {"gpu-a": 0, "gpu-b": 1}, cpus=4)

    created = dra_pod(stack, "typed", {DRA_GPU: "1", "cpu": "1"}, {})

    def refused(pod: Pod | None) -> bool:
        conditions = ((pod or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == "SlurmRejected" for c in conditions)

    await stack.wait_pod("typed", refused)
    with pytest.raises(WorkflowFailureError) as failure:
        await stack.handle(created).result()
    assert "Slurm rejected the job" in str(failure.value.cause)
    pod = await stack.wait_pod("typed", finished_cleanly)
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (condition["status"], condition["reason"]) == ("False", "SlurmRejected")
    assert "Requested node configuration is not available" in condition["message"]
    assert bound(pod) is None
    assert claims(stack) == []
