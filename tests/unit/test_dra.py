"""bridge.dra: DRA extended-resource requests → devices Slurm allocated, or a clear reason why not."""

from typing import Any

import pytest

from bridge import keys
from bridge.dra import DeviceLayoutError, device_requests, dra_problems, expand_indexes, pin
from bridge.resources import placement_problems

GPU = keys.DRA_RESOURCE_PREFIX + "gpu.example.com"
CPU = keys.DRA_RESOURCE_PREFIX + keys.DRA_CPU_CLASS
CLASSES = ["gpu.example.com", keys.DRA_CPU_CLASS]


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec}


def container(name: str, requests: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests, "limits": dict(requests)}}


def gpu_slice(node: str, indexes: dict[str, int]) -> dict[str, Any]:
    devices = [{"name": n, "attributes": {"index": {"int": i}}} for n, i in indexes.items()]
    return {
        "spec": {"driver": "gpu.example.com", "nodeName": node, "pool": {"name": node}, "devices": devices}
    }


def cpu_slice(node: str, cpu_ids: list[int]) -> dict[str, Any]:
    devices = [{"name": f"cpu{c}", "attributes": {"dra.cpu/cpuID": {"int": c}}} for c in cpu_ids]
    return {
        "spec": {"driver": keys.DRA_CPU_CLASS, "nodeName": node, "pool": {"name": "cpus"}, "devices": devices}
    }


def layout(
    gres_index: str | None = "0-1", count: int = 2, core_bitmap: str = "0x3", cores: int = 4
) -> dict[str, Any]:
    return {
        "node": "s1",
        "sockets_per_node": 1,
        "cores_per_socket": cores,
        "core_bitmap": core_bitmap,
        "gres": [{"name": "gpu", "type": "", "count": count, "index": gres_index}],
    }


def test_requests_are_named_as_kube_scheduler_names_them() -> None:
    requests = device_requests(
        pod(
            container("a", {"memory": "1Gi", GPU: "1"}),
            container("b", {CPU: "2", GPU: "1", "memory": "1Gi"}),
            init=[{"name": "setup"}],
        )
    )
    # Containers count init containers first; a request's place is among the container's sorted names.
    assert [(r.container, r.request, r.device_class, r.count) for r in requests] == [
        ("a", "container-1-request-0", "gpu.example.com", 1),
        ("b", "container-2-request-0", keys.DRA_CPU_CLASS, 2),
        ("b", "container-2-request-1", "gpu.example.com", 1),
    ]


def test_each_request_gets_its_own_share_of_slurms_devices_in_order() -> None:
    requests = device_requests(pod(container("a", {GPU: "1", CPU: "1"}), container("b", {GPU: "1"})))
    slices = [gpu_slice("k1", {"gpu-x": 3, "gpu-y": 1, "gpu-z": 2}), cpu_slice("k1", [7, 5, 6, 4])]

    pinned = pin(requests, layout("1,3", core_bitmap="0x4"), slices, node="k1", classes=CLASSES)

    chosen = {p.request.request: [d.name for d in p.devices] for p in pinned.requests}
    # Slurm's GPUs 1 and 3, by the index attribute; Slurm's core 2 is the third CPU by cpuID (6).
    assert chosen == {
        "container-0-request-1": ["gpu-y"],
        "container-1-request-0": ["gpu-x"],
        "container-0-request-0": ["cpu6"],
    }
    exprs = {p.request.request: p.selector for p in pinned.requests}
    assert exprs["container-0-request-1"] == "device.attributes['gpu.example.com'].index in [1]"
    assert exprs["container-0-request-0"] == "device.attributes['dra.cpu'].cpuID in [6]"


def test_a_pod_asking_less_than_the_job_holds_gets_the_first_of_slurms_gpus() -> None:
    requests = device_requests(pod(container("a", {GPU: "1"})))
    pinned = pin(requests, layout("2-3"), [gpu_slice("k1", {"g2": 2, "g3": 3})], node="k1", classes=CLASSES)
    assert [d.name for d in pinned.requests[0].devices] == ["g2"]


@pytest.mark.parametrize(
    ("given", "slices", "classes", "reason"),
    [
        (layout(None), None, CLASSES, "without GRES indexes (index: null)"),
        (layout("0-2", count=2), None, CLASSES, "says count 2 but index '0-2'"),
        (layout("0", count=1), None, CLASSES, "the pod asks for 2 GPU(s) but Slurm allocated 1"),
        (
            layout(),
            [gpu_slice("k1", {"g5": 5, "g6": 6})],
            CLASSES,
            "GPU index 0, 1 on s1, but no gpu.example.com",
        ),
        (layout(), [gpu_slice("k1", {"g0": 0, "h0": 0, "g1": 1})], CLASSES, "both have attribute index=0"),
        (layout(), [gpu_slice("k2", {"g0": 0, "g1": 1})], CLASSES, "no gpu.example.com device of node k1"),
        (layout(), None, [keys.DRA_CPU_CLASS], "DeviceClass gpu.example.com does not exist"),
        (layout("x"), None, CLASSES, "is not a list of numbers"),
        (None, None, CLASSES, "Slurm reports no resource layout"),
    ],
)
def test_a_layout_that_does_not_add_up_is_refused_with_the_reason(
    given: dict[str, Any] | None, slices: list[dict[str, Any]] | None, classes: list[str], reason: str
) -> None:
    requests = device_requests(pod(container("a", {GPU: "2"})))
    with pytest.raises(DeviceLayoutError, match=None) as error:
        pin(requests, given, slices or [gpu_slice("k1", {"g0": 0, "g1": 1})], node="k1", classes=classes)
    assert reason in str(error.value)


def test_cpus_need_one_device_per_slurm_core() -> None:
    requests = device_requests(pod(container("a", {CPU: "2"})))
    with pytest.raises(DeviceLayoutError) as error:
        pin(requests, layout(cores=4), [cpu_slice("k1", [0, 1, 2])], node="k1", classes=CLASSES)
    assert "publishes 3 dra.cpu device(s) but Slurm's node s1 has 4 core(s)" in str(error.value)
    with pytest.raises(DeviceLayoutError) as error:
        pin(requests, layout(core_bitmap="0x1"), [cpu_slice("k1", [0, 1, 2, 3])], node="k1", classes=CLASSES)
    assert "asks for 2 dra.cpu CPU(s) but Slurm allocated 1 core(s)" in str(error.value)


def test_the_claim_and_statuses_are_what_kubernetes_expects() -> None:
    the_pod = pod(container("a", {GPU: "1"}))
    pinned = pin(
        device_requests(the_pod),
        layout("1", count=1),
        [gpu_slice("k1", {"g1": 1})],
        node="k1",
        classes=CLASSES,
    )
    claim = pinned.claim(the_pod)
    assert claim["metadata"]["generateName"] == "p-extended-resources-"
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert claim["metadata"]["ownerReferences"][0] | {} == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "uid": "u",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    status = pinned.status(the_pod, "2026-11-23T00:00:00Z")
    assert status["allocation"]["devices"]["results"] == [
        {"request": "container-0-request-0", "driver": "gpu.example.com", "pool": "k1", "device": "g1"}
    ]
    assert pinned.pod_status("c1") == {
        "requestMappings": [
            {"containerName": "a", "requestName": "container-0-request-0", "resourceName": GPU}
        ],
        "resourceClaimName": "c1",
    }


def test_expand_indexes() -> None:
    assert expand_indexes("0-1") == [0, 1]
    assert expand_indexes("0,2-3") == [0, 2, 3]
    assert expand_indexes("5") == [5]


@pytest.mark.parametrize(
    ("the_pod", "problem"),
    [
        (
            pod(container("a", {"cpu": "1"}), init=[container("i", {GPU: "1"})]),
            'init container "i" requests DRA devices',
        ),
        (pod(container("a", {GPU: "1", "nvidia.com/gpu": "1"})), "a pod may use one GPU resource name only"),
        (
            pod(
                container("a", {GPU: "1"}), container("b", {keys.DRA_RESOURCE_PREFIX + "gpu.nvidia.com": "1"})
            ),
            "one GPU resource name",
        ),
        (pod(container("a", {GPU: "500m"})), "devices are counted in whole numbers"),
    ],
)
def test_what_cannot_be_pinned_is_refused_before_submission(the_pod: dict[str, Any], problem: str) -> None:
    assert any(problem in p for p in dra_problems(the_pod))
    assert any(problem in p for p in placement_problems(the_pod))


def test_device_plugin_gpus_alone_stay_allowed() -> None:
    assert dra_problems(pod(container("a", {"nvidia.com/gpu": "1", "amd.com/gpu": "1"}))) == []
    assert dra_problems(pod(container("a", {GPU: "2", CPU: "2"}))) == []


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": [{"name": "a", "resources": "x"}]},
        {"containers": [{"name": "a", "resources": {"requests": ["x"], "limits": 3}}]},
        {"containers": "x", "initContainers": [None, 1]},
        {"containers": [None, {"name": "a", "resources": {"requests": {GPU: {"x": 1}}}}]},
    ],
)
def test_malformed_pods_never_crash(spec: Any) -> None:
    the_pod = {"metadata": {"name": "p"}, "spec": spec}
    assert device_requests(the_pod) == []
    assert dra_problems(the_pod) == []  # the wrong types are bridge.resources' to report
    placement_problems(the_pod)
