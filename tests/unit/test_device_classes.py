"""DRA_DEVICE_CLASSES: the DeviceClasses an operator has the bridge honour, and what each is in Slurm.

The parser and the mapping are pure (bridge.device_classes); the same parsed value drives the
admission checks, the job's Slurm fields and the claim's devices (bridge.resources, bridge.dra).
"""

from fractions import Fraction
from typing import Any

import pytest

from bridge import keys
from bridge.device_classes import (
    DEFAULT_DEVICE_CLASSES,
    DeviceClass,
    DeviceClassesError,
    Gres,
    parse_device_classes,
)
from bridge.dra import DeviceLayoutError, device_requests, dra_gpu_counts, dra_problems, pin
from bridge.resources import dra_classes_of, placement_problems

D = keys.DRA_RESOURCE_PREFIX
H100 = "gpu.h100.example.com"
CUSTOM = parse_device_classes(f"{H100}=gpu:h100,gpu.example.com=gpu,nic.example.com=nic,cpu.example.com=cpu")


def pod(*containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": list(containers)},
    }


def container(name: str, requests: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests, "limits": dict(requests)}}


def devices(driver: str, node: str, attribute: str, values: dict[str, int]) -> dict[str, Any]:
    listed = [{"name": n, "attributes": {attribute: {"int": v}}} for n, v in values.items()]
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": listed}}


# -- the setting ----------------------------------------------------------------------------


def test_the_default_is_todays_fixed_list_with_todays_meaning() -> None:
    assert str(DEFAULT_DEVICE_CLASSES) == "dra.cpu=cpu,gpu.example.com=gpu,gpu.nvidia.com=gpu"
    assert parse_device_classes(str(DEFAULT_DEVICE_CLASSES)) == DEFAULT_DEVICE_CLASSES
    assert DEFAULT_DEVICE_CLASSES.get(keys.DRA_CPU_CLASS) == DeviceClass(keys.DRA_CPU_CLASS)
    # GPUs untyped: an untyped request matches typed GRES too, and node sync registers GPUs untyped.
    assert DEFAULT_DEVICE_CLASSES.gres_of(D + "gpu.nvidia.com") == Gres("gpu")
    assert DEFAULT_DEVICE_CLASSES.gpu_drivers() == {"gpu.nvidia.com", "gpu.example.com"}


def test_the_compact_form_is_read_with_spaces_in_any_order_and_written_back_sorted() -> None:
    parsed = parse_device_classes(f" {H100} = gpu:h100 ,dra.cpu=cpu,, mig.example.com=gpu:a100_3g.20gb ")
    assert str(parsed) == f"dra.cpu=cpu,{H100}=gpu:h100,mig.example.com=gpu:a100_3g.20gb"
    assert parsed.get(H100) == DeviceClass(H100, Gres("gpu", "h100"))
    assert parsed.get("dra.cpu") == DeviceClass("dra.cpu")
    assert parsed.get("gpu.nvidia.com") is None


def test_empty_honours_no_class() -> None:
    assert parse_device_classes("").classes == ()
    assert parse_device_classes(" , ").names == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu.nvidia.com", 'has no "="'),
        ("GPU.nvidia.com=gpu", "is not a DeviceClass name"),
        ("a" * 64 + "=gpu", "at most 63 characters"),
        ("gpu.nvidia.com=", "is not cpu or a GRES name"),
        ("gpu.nvidia.com=gres/gpu", "is not cpu or a GRES name"),
        ("gpu.nvidia.com=gpu:", "is not a GRES type"),
        ("gpu.nvidia.com=gpu:h100:2", "is not a GRES type"),
        ("gpu.nvidia.com=gpu:h100=2", "is not a GRES type"),
        ("dra.cpu=cpu:fast", "cpu takes no type"),
        ("a=gpu,a=cpu", "a is named twice"),
    ],
)
def test_a_mistake_is_one_line_saying_what_and_how(text: str, message: str) -> None:
    with pytest.raises(DeviceClassesError) as caught:
        parse_device_classes(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# -- what the job asks Slurm for --------------------------------------------------------------


def test_a_typed_class_asks_slurm_for_its_typed_gres_and_an_untyped_one_for_any() -> None:
    assert CUSTOM.tres_per_node({D + H100: Fraction(2), "cpu": Fraction(1)}) == "gres/gpu:h100=2"
    assert CUSTOM.tres_per_node({D + "gpu.example.com": Fraction(1)}) == "gres/gpu=1"
    assert DEFAULT_DEVICE_CLASSES.tres_per_node({D + "gpu.nvidia.com": Fraction(3)}) == "gres/gpu=3"
    # Device-plugin GPUs stay untyped gres/gpu whatever the classes.
    assert CUSTOM.tres_per_node({"nvidia.com/gpu": Fraction(1)}) == "gres/gpu=1"
    assert CUSTOM.tres_per_node({"memory": Fraction(2**30)}) is None


def test_each_gres_takes_the_largest_count_and_several_gres_are_asked_together() -> None:
    per_node = {
        D + "gpu.example.com": Fraction(1),
        "nvidia.com/gpu": Fraction(4),
        D + "nic.example.com": Fraction(2),
    }
    assert CUSTOM.tres_per_node(per_node) == "gres/gpu=4,gres/nic=2"
    assert CUSTOM.gres_problems(per_node) == []


def test_one_gres_asked_with_two_types_in_a_group_is_a_problem() -> None:
    # A group's pods: one asks for typed H100s, another for any GPU; one job cannot ask both per node.
    [problem] = CUSTOM.gres_problems({D + H100: Fraction(1), "nvidia.com/gpu": Fraction(1)})
    assert "gres/gpu and gres/gpu:h100" in problem


def test_cpus_come_from_cpu_or_any_cpu_class() -> None:
    assert CUSTOM.cpus({D + "cpu.example.com": Fraction(6), "cpu": Fraction(0)}) == 6
    assert CUSTOM.cpus({D + keys.DRA_CPU_CLASS: Fraction(6)}) == 0  # not a CPU class here
    assert DEFAULT_DEVICE_CLASSES.cpus({D + keys.DRA_CPU_CLASS: Fraction(6), "cpu": Fraction(2)}) == 6


# -- what admission and translation refuse -------------------------------------------------------


def test_a_class_not_configured_is_refused_naming_the_configured_classes_and_the_setting() -> None:
    the_pod = pod(container("main", {D + "gpu.nvidia.com": "1"}))
    [problem] = placement_problems(the_pod, CUSTOM)
    assert 'container "main" uses unsupported DRA device class "gpu.nvidia.com"' in problem
    assert f"cpu.example.com, gpu.example.com, {H100}, nic.example.com" in problem
    assert "DRA_DEVICE_CLASSES" in problem
    assert placement_problems(the_pod) == []  # honoured by default
    [none] = placement_problems(the_pod, parse_device_classes(""))
    assert "(supported: none;" in none


def test_configured_classes_are_placeable() -> None:
    the_pod = pod(container("a", {D + H100: "2", D + "nic.example.com": "1", D + "cpu.example.com": "4"}))
    assert placement_problems(the_pod, CUSTOM) == []
    assert dra_classes_of(the_pod) == ["cpu.example.com", H100, "nic.example.com"]


@pytest.mark.parametrize(
    ("requests", "problem"),
    [
        # Two names for the node's one pool of GPUs: whose devices are whose cannot be told.
        ({D + H100: "1", D + "gpu.example.com": "1"}, "a pod may use one GPU resource name only"),
        ({D + H100: "1", "nvidia.com/gpu": "1"}, "a pod may use one GPU resource name only"),
        (
            {D + "cpu.example.com": "1", "cpu": "1"},
            '"cpu" and "deviceclass.resource.kubernetes.io/cpu.example.com"',
        ),
    ],
)
def test_one_resource_name_per_slurm_pool(requests: dict[str, str], problem: str) -> None:
    assert any(problem in p for p in placement_problems(pod(container("a", requests)), CUSTOM))


def test_another_gres_is_its_own_pool() -> None:
    nics = parse_device_classes("nic.example.com=nic,nic2.example.com=nic")
    assert dra_problems(pod(container("a", {D + "nic.example.com": "1", "nvidia.com/gpu": "1"})), nics) == []
    [problem] = dra_problems(
        pod(container("a", {D + "nic.example.com": "1", D + "nic2.example.com": "1"})), nics
    )
    assert "nic devices are requested as" in problem
    assert "gres/nic" in problem


# -- the claim: the GRES indexes and cores Slurm allocated ----------------------------------------


def layout(gres: list[dict[str, Any]], core_bitmap: str = "0x0", cores: int = 4) -> dict[str, Any]:
    return {
        "node": "s1",
        "sockets_per_node": 1,
        "cores_per_socket": cores,
        "core_bitmap": core_bitmap,
        "gres": gres,
    }


def test_a_typed_class_is_pinned_to_the_indexes_of_its_type_only() -> None:
    # Slurm allocated an A100 and two H100s on the node; the pod's H100 class gets the H100s.
    allocated = layout(
        [
            {"name": "gpu", "type": "a100", "count": 1, "index": "0"},
            {"name": "gpu", "type": "h100", "count": 2, "index": "2-3"},
        ]
    )
    slices = [devices(H100, "k1", "index", {"h-a": 3, "h-b": 2, "h-c": 4})]
    requests = device_requests(pod(container("a", {D + H100: "2"})), CUSTOM)
    assert [r.slurm for r in requests] == ["tres_per_node gres/gpu:h100"]

    pinned = pin(requests, allocated, slices, node="k1", classes=[H100])

    [request] = pinned.requests
    assert [d.name for d in request.devices] == ["h-b", "h-a"]
    assert request.selector == f"device.attributes['{H100}'].index in [2, 3]"


def test_another_gres_is_pinned_to_its_own_indexes() -> None:
    allocated = layout(
        [
            {"name": "gpu", "type": "", "count": 1, "index": "0"},
            {"name": "nic", "type": "", "count": 1, "index": "1"},
        ]
    )
    slices = [
        devices("gpu.example.com", "k1", "index", {"g0": 0}),
        devices("nic.example.com", "k1", "index", {"n0": 0, "n1": 1}),
    ]
    requests = device_requests(
        pod(container("a", {D + "gpu.example.com": "1", D + "nic.example.com": "1"})), CUSTOM
    )
    pinned = pin(requests, allocated, slices, node="k1", classes=["gpu.example.com", "nic.example.com"])
    assert {p.request.device_class: [d.name for d in p.devices] for p in pinned.requests} == {
        "gpu.example.com": ["g0"],
        "nic.example.com": ["n1"],
    }


def test_gres_slurm_did_not_allocate_enough_of_is_refused_in_its_own_words() -> None:
    allocated = layout([{"name": "nic", "type": "", "count": 1, "index": "0"}])
    requests = device_requests(pod(container("a", {D + "nic.example.com": "2"})), CUSTOM)
    with pytest.raises(DeviceLayoutError, match="asks for 2 gres/nic but Slurm allocated 1"):
        pin(requests, allocated, [], node="k1", classes=["nic.example.com"])


def test_a_cpu_class_is_pinned_to_its_own_drivers_cpus() -> None:
    requests = device_requests(pod(container("a", {D + "cpu.example.com": "2"})), CUSTOM)
    slices = [devices("cpu.example.com", "k1", "cpuID", {f"c{i}": i for i in (3, 1, 2, 0)})]
    pinned = pin(requests, layout([], core_bitmap="0xa"), slices, node="k1", classes=["cpu.example.com"])
    [request] = pinned.requests
    assert [d.name for d in request.devices] == ["c1", "c3"]
    assert request.selector == "device.attributes['cpu.example.com'].cpuID in [1, 3]"


def test_a_class_taken_out_of_the_setting_while_the_job_waited_is_not_pinned() -> None:
    # Submitted under the default classes; the worker restarted with dra.cpu no longer honoured.
    requests = device_requests(pod(container("a", {D + keys.DRA_CPU_CLASS: "1"})), CUSTOM)
    with pytest.raises(DeviceLayoutError, match=r"DeviceClass dra\.cpu is not honoured by this bridge"):
        pin(requests, layout([], core_bitmap="0x1"), [], node="k1", classes=[keys.DRA_CPU_CLASS])


def test_node_sync_counts_the_devices_of_the_classes_slurm_counts_as_gpus() -> None:
    slices = [
        devices(H100, "a", "index", {"h0": 0, "h1": 1}),
        devices("nic.example.com", "a", "index", {"n0": 0}),
        devices("gpu.nvidia.com", "b", "index", {"g0": 0}),
    ]
    assert dra_gpu_counts(slices, CUSTOM.gpu_drivers()) == {"a": 2}
    assert dra_gpu_counts(slices) == {"b": 1}  # the default classes
