"""DRA extended resources pinned to Slurm's allocation: which devices a pod's claim names.

A pod may ask for devices by a DeviceClass's implicit extended-resource name,
`deviceclass.resource.kubernetes.io/<class>` (KEP-5004), for the classes the operator
has the bridge honour (`bridge.device_classes`, DRA_DEVICE_CLASSES): CPUs (`dra.cpu`),
or a GRES such as GPUs (`gpu.nvidia.com`, `gpu.example.com`). Slurm, not Kubernetes,
decides which CPUs and GRES of the node the job holds (`GET /resources/{job_id}`),
so the bridge writes the ResourceClaim Kubernetes' scheduler would have written,
with exactly those devices, before binding.

Pure: the pod, Slurm's layout of the node and the node's ResourceSlices in, the
claim's requests and allocation results out. Anything that does not add up is a
DeviceLayoutError whose message tells the user why the pod was not bound.

The mapping convention (docs/dra.md):
- the DeviceClass name is the driver name (true of the default classes);
- GRES (GPUs): Slurm's GRES index i (gres.conf File order) is the device of that
  driver on the node whose attribute `index` is i;
- CPUs: Slurm's abstract core i (the node as node sync registers it: one socket, one
  thread per core) is the i-th device of the CPU class's driver on the node in
  ascending `cpuID`.

Its size (about 500 lines) is one mapping, read in one place: from Slurm's allocation
(cores, GRES indices) to the devices of a node's ResourceSlices, with every refusal worded.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge import keys
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, GPU, DeviceClass, DeviceClasses, Gres
from bridge.quantity import QuantityError, parse_quantity

Json = dict[str, Any]
RESOURCE_GROUP = "resource.k8s.io"
# The annotation Kubernetes puts on the claim it generates for extended resources.
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
GPU_INDEX = "index"
CPU_ID = "cpuID"
# Bridge-internal field of node sync's node view (not a Kubernetes field): the node's DRA GPUs.
DRA_GPUS = "draGpus"


class DeviceLayoutError(ValueError):
    """Slurm's allocation cannot be expressed as a claim on this node; the message says why."""


@dataclass(frozen=True)
class DeviceRequest:
    """One container's request of one DRA extended resource, named as Kubernetes names it."""

    container: str
    resource: str  # deviceclass.resource.kubernetes.io/<class>
    device_class: str
    request: str  # container-<i>-request-<j>
    count: int
    # What the bridge makes of the class (DRA_DEVICE_CLASSES); None: not honoured.
    honoured: DeviceClass | None = None

    @property
    def is_cpu(self) -> bool:
        return self.honoured is not None and self.honoured.is_cpu

    @property
    def gres(self) -> Gres | None:
        return self.honoured.gres if self.honoured is not None else None

    @property
    def slurm(self) -> str:
        """The job field that counts it (`cpus_per_task`, `tres_per_node gres/gpu`)."""
        return self.honoured.slurm if self.honoured is not None else "not honoured"


def _mapping(value: Any) -> Mapping[str, Any]:
    """`value` if it is a JSON object, else {}: wrong types are reported by bridge.resources."""
    return value if isinstance(value, Mapping) else {}


def _containers(pod: Mapping[str, Any], *kinds: str) -> list[Mapping[str, Any]]:
    spec = _mapping(pod.get("spec"))
    found: list[Mapping[str, Any]] = []
    for kind in kinds:
        listed = spec.get(kind)
        found += [c for c in listed if isinstance(c, Mapping)] if isinstance(listed, list) else []
    return found


def _resources(container: Mapping[str, Any], which: str) -> Mapping[str, Any]:
    return _mapping(_mapping(container.get("resources")).get(which))


def _whole(value: Any) -> int | None:
    """A whole, non-negative device count; None for anything else."""
    try:
        quantity = parse_quantity(str(value))
    except QuantityError:
        return None
    return int(quantity) if quantity.denominator == 1 and quantity >= 0 else None


def device_requests(
    pod: Mapping[str, Any], honoured: DeviceClasses = DEFAULT_DEVICE_CLASSES
) -> list[DeviceRequest]:
    """The pod's DRA extended-resource requests, in container order, with what each becomes.

    Request names follow kube-scheduler's: `container-<i>-request-<j>`, i counting
    init containers first, j the resource's place among the container's requests
    sorted by name. What does not parse is skipped (dra_problems reports it).
    """
    found = []
    for i, container in enumerate(_containers(pod, "initContainers", "containers")):
        # An unset request defaults to the limit, as the API server does.
        merged = {**_resources(container, "limits"), **_resources(container, "requests")}
        for j, name in enumerate(sorted(merged)):
            if not name.startswith(keys.DRA_RESOURCE_PREFIX):
                continue
            count = _whole(merged[name])
            if not count:
                continue
            found.append(
                DeviceRequest(
                    container=str(container.get("name")),
                    resource=name,
                    device_class=name.removeprefix(keys.DRA_RESOURCE_PREFIX),
                    request=f"container-{i}-request-{j}",
                    count=count,
                    honoured=honoured.of_resource(name),
                )
            )
    return found


def _one_name_per_gres(names: set[str], honoured: DeviceClasses) -> list[str]:
    """Slurm counts a node's GRES of one name as one pool (`gres/gpu`): when a pod asks for it under
    two resource names, one of them a DRA class, the claim could not tell whose devices are whose."""
    by_gres: dict[str, list[str]] = {}
    for name in sorted(names):
        gres = honoured.gres_of(name)
        if gres is not None:
            by_gres.setdefault(gres.name, []).append(name)
    problems = []
    for gres_name, kinds in sorted(by_gres.items()):
        if len(kinds) < 2 or not any(n.startswith(keys.DRA_RESOURCE_PREFIX) for n in kinds):
            continue  # nvidia.com/gpu with amd.com/gpu: device plugins, no claim to pin
        what = "GPUs" if gres_name == GPU else f"{gres_name} devices"
        problems.append(
            f"{what} are requested as {', '.join(kinds)}: Slurm counts a node's {what} as one "
            f"gres/{gres_name}, so a pod may use one {'GPU' if gres_name == GPU else gres_name} "
            "resource name only"
        )
    return problems


def dra_problems(pod: Mapping[str, Any], honoured: DeviceClasses = DEFAULT_DEVICE_CLASSES) -> list[str]:
    """What the bridge cannot pin to Slurm's allocation: admission and translation refuse it."""
    problems = []
    for container in _containers(pod, "initContainers"):
        names = {*_resources(container, "requests"), *_resources(container, "limits")}
        if any(str(n).startswith(keys.DRA_RESOURCE_PREFIX) for n in names):
            problems.append(
                f'init container "{container.get("name")}" requests DRA devices: request them in regular '
                "containers only (the bridge pins each request to devices of its own)"
            )
    names = {
        str(name)
        for container in _containers(pod, "initContainers", "containers")
        for which in ("requests", "limits")
        for name in _resources(container, which)
    }
    problems += _one_name_per_gres(names, honoured)
    for container in _containers(pod, "containers"):
        for which in ("requests", "limits"):
            for name, value in _resources(container, which).items():
                if not str(name).startswith(keys.DRA_RESOURCE_PREFIX):
                    continue
                try:
                    parse_quantity(str(value))
                except QuantityError:
                    continue  # reported by bridge.resources.placement_problems
                if _whole(value) is None:
                    problems.append(
                        f'container "{container.get("name")}" {which} {name}={value}: '
                        "devices are counted in whole numbers"
                    )
    return list(dict.fromkeys(problems))


# -- Slurm's layout -------------------------------------------------------------


def expand_indexes(text: str) -> list[int]:
    """Slurm's index list, "0-1", "0,2-3", "3" → [0, 1], [0, 2, 3], [3]."""
    indexes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise DeviceLayoutError(f"Slurm's GRES index {text!r} is not a list of numbers")
        indexes += list(range(int(low), int(high or low) + 1))
    return indexes


def _counted(gres: Gres) -> str:
    return "GPU(s)" if gres.name == GPU else f"gres/{gres}"


def allocated_gres(layout: Mapping[str, Any], wanted: Gres) -> list[int]:
    """GRES indexes of what Slurm allocated on this node for `wanted` (say GPUs), in order."""
    indexes: list[int] = []
    for gres in layout.get("gres") or []:
        if not wanted.matches(gres.get("name"), gres.get("type")):
            continue
        index = gres.get("index")
        if not index:
            raise DeviceLayoutError(
                f"Slurm allocated {gres.get('count')} {_counted(wanted)} on {layout.get('node')} without "
                "GRES indexes (index: null); without them the bridge cannot tell which devices the pod may "
                f"use: give the node's {wanted.name} device files in gres.conf (Name={wanted.name} File=...)"
            )
        listed = expand_indexes(str(index))
        if len(listed) != int(gres.get("count") or 0):
            raise DeviceLayoutError(
                f"Slurm's GRES on {layout.get('node')} says count {gres.get('count')} but index {index!r}"
            )
        indexes += listed
    return indexes


def allocated_cores(layout: Mapping[str, Any]) -> list[int]:
    """Slurm's abstract cores of this node the job holds ("0x3" → [0, 1]), in order."""
    bitmap = str(layout.get("core_bitmap") or "")
    try:
        bits = int(bitmap, 16)
    except ValueError:
        raise DeviceLayoutError(
            f"Slurm's core bitmap {bitmap!r} on {layout.get('node')} is not hexadecimal"
        ) from None
    return [i for i in range(bits.bit_length()) if bits >> i & 1]


# -- the node's devices -----------------------------------------------------------


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Any]

    def attribute(self, name: str) -> Any:
        """An attribute's value, named plainly or qualified with the driver's domain."""
        raw = self.attributes.get(name, self.attributes.get(f"{self.driver}/{name}"))
        if isinstance(raw, Mapping):
            for kind in ("int", "string", "bool", "version"):
                if kind in raw:
                    return raw[kind]
        return None


def node_devices(slices: Sequence[Mapping[str, Any]], driver: str, node: str) -> list[Device]:
    """Devices a driver publishes for this node (ResourceSlices with spec.nodeName)."""
    devices = []
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver or spec.get("nodeName") != node:
            continue
        pool = str((spec.get("pool") or {}).get("name") or "")
        for device in spec.get("devices") or []:
            devices.append(Device(driver, pool, str(device.get("name")), device.get("attributes") or {}))
    return devices


def _gpus_by_index(devices: list[Device], driver: str, node: str) -> dict[int, Device]:
    by_index: dict[int, Device] = {}
    for device in devices:
        index = device.attribute(GPU_INDEX)
        if not isinstance(index, int):
            continue
        if index in by_index:
            raise DeviceLayoutError(
                f"devices {by_index[index].name} and {device.name} of {driver} on node {node} both have "
                f"attribute {GPU_INDEX}={index}"
            )
        by_index[index] = device
    return by_index


def _cpus_in_order(devices: list[Device], driver: str, node: str) -> list[Device]:
    with_id = [(d.attribute(CPU_ID), d) for d in devices]
    if any(not isinstance(cpu, int) for cpu, _ in with_id):
        raise DeviceLayoutError(f"a {driver} device on node {node} has no integer attribute {CPU_ID}")
    return [d for _, d in sorted(with_id, key=lambda pair: pair[0])]


def dra_gpu_counts(
    slices: Sequence[Mapping[str, Any]], drivers: frozenset[str] = DEFAULT_DEVICE_CLASSES.gpu_drivers()
) -> dict[str, int]:
    """Per node, the devices the drivers of the honoured GPU classes publish for it."""
    counts: dict[str, int] = {}
    for item in slices:
        spec = item.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("driver") in drivers and node:
            counts[str(node)] = counts.get(str(node), 0) + len(spec.get("devices") or [])
    return counts


# -- the claim ----------------------------------------------------------------------


@dataclass(frozen=True)
class PinnedRequest:
    request: DeviceRequest
    devices: list[Device]
    selector: str  # CEL, naming the same devices: readable, and what a re-allocation would pick


@dataclass(frozen=True)
class PinnedClaim:
    node: str
    requests: list[PinnedRequest]

    def claim(self, pod: Mapping[str, Any]) -> Json:
        meta = pod["metadata"]
        return {
            "apiVersion": f"{RESOURCE_GROUP}/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": f"{meta['name']}-extended-resources-",
                "namespace": meta["namespace"],
                "annotations": {EXTENDED_RESOURCE_CLAIM: "true"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": p.request.request,
                            "exactly": {
                                "deviceClassName": p.request.device_class,
                                "allocationMode": "ExactCount",
                                "count": p.request.count,
                                "selectors": [{"cel": {"expression": p.selector}}],
                            },
                        }
                        for p in self.requests
                    ]
                }
            },
        }

    def status(self, pod: Mapping[str, Any], allocated_at: str) -> Json:
        meta = pod["metadata"]
        results = [
            {"request": p.request.request, "driver": d.driver, "pool": d.pool, "device": d.name}
            for p in self.requests
            for d in p.devices
        ]
        selector = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [self.node]}]}
            ]
        }
        return {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": selector,
                "allocationTimestamp": allocated_at,
            },
            "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}],
        }

    def pod_status(self, claim_name: str) -> Json:
        mappings = [
            {
                "containerName": p.request.container,
                "requestName": p.request.request,
                "resourceName": p.request.resource,
            }
            for p in self.requests
        ]
        return {"requestMappings": mappings, "resourceClaimName": claim_name}


def _pin_gres(
    gres: Gres,
    requests: Sequence[DeviceRequest],
    layout: Mapping[str, Any],
    slices: Sequence[Mapping[str, Any]],
    node: str,
) -> list[PinnedRequest]:
    """Slurm's indexes of this GRES, handed out request after request, each to its driver's devices."""
    indexes = allocated_gres(layout, gres)
    wanted = sum(r.count for r in requests)
    if wanted > len(indexes):
        raise DeviceLayoutError(
            f"the pod asks for {wanted} {_counted(gres)} but Slurm allocated {len(indexes)} "
            f"on {layout.get('node')}"
        )
    pinned = []
    next_index = 0
    for request in requests:
        driver = request.device_class
        by_index = _gpus_by_index(node_devices(slices, driver, node), driver, node)
        chosen = indexes[next_index : next_index + request.count]
        next_index += request.count
        absent = [i for i in chosen if i not in by_index]
        if absent:
            raise DeviceLayoutError(
                f"Slurm allocated {'GPU' if gres.name == GPU else 'gres/' + str(gres)} index "
                f"{', '.join(map(str, absent))} on {layout.get('node')}, but no {driver} device of node "
                f"{node} has attribute {GPU_INDEX} with that value in its ResourceSlices"
            )
        expression = f"device.attributes['{driver}'].{GPU_INDEX} in [{', '.join(map(str, chosen))}]"
        pinned.append(PinnedRequest(request, [by_index[i] for i in chosen], expression))
    return pinned


def _pin_cpus(
    requests: Sequence[DeviceRequest],
    layout: Mapping[str, Any],
    slices: Sequence[Mapping[str, Any]],
    node: str,
) -> list[PinnedRequest]:
    """Slurm's cores, handed out request after request, each the CPU device of that core."""
    cores = allocated_cores(layout)
    # One CPU class per pod (bridge.resources.placement_problems): its driver's devices are the cores.
    driver = requests[0].device_class
    wanted = sum(r.count for r in requests)
    if wanted > len(cores):
        raise DeviceLayoutError(
            f"the pod asks for {wanted} {driver} CPU(s) but Slurm allocated {len(cores)} "
            f"core(s) on {layout.get('node')}"
        )
    in_order = _cpus_in_order(node_devices(slices, driver, node), driver, node)
    node_cores = int(layout.get("sockets_per_node") or 1) * int(layout.get("cores_per_socket") or 0)
    if len(in_order) != node_cores:
        raise DeviceLayoutError(
            f"node {node} publishes {len(in_order)} {driver} device(s) but Slurm's node "
            f"{layout.get('node')} has {node_cores} core(s): the CPUs cannot be matched one to one"
        )
    pinned = []
    next_core = 0
    for request in requests:
        taken = [in_order[c] for c in cores[next_core : next_core + request.count]]
        next_core += request.count
        ids = ", ".join(str(d.attribute(CPU_ID)) for d in taken)
        expression = f"device.attributes['{driver}'].{CPU_ID} in [{ids}]"
        pinned.append(PinnedRequest(request, taken, expression))
    return pinned


def pin(
    requests: Sequence[DeviceRequest],
    layout: Mapping[str, Any] | None,
    slices: Sequence[Mapping[str, Any]],
    *,
    node: str,
    classes: Sequence[str],
) -> PinnedClaim:
    """The devices each request gets: Slurm's GRES and cores on `node`, first come first served.

    `layout` is the `/resources/{job_id}` entry of the pod's Slurm node; `classes`
    the DeviceClasses that exist. A pod asking less than the job holds (a group's
    largest pod sets the job's count) gets the first of Slurm's devices.
    """
    if layout is None:
        raise DeviceLayoutError(f"Slurm reports no resource layout for the job on node {node}")
    # Translation refuses classes the bridge does not honour; one may have been taken out of
    # DRA_DEVICE_CLASSES while the job waited.
    unknown = sorted({r.device_class for r in requests if r.honoured is None})
    if unknown:
        raise DeviceLayoutError(
            f"DeviceClass {', '.join(unknown)} is not honoured by this bridge (DRA_DEVICE_CLASSES) any more"
        )
    missing = sorted({r.device_class for r in requests} - set(classes))
    if missing:
        raise DeviceLayoutError(f"DeviceClass {', '.join(missing)} does not exist in the cluster")
    pinned: list[PinnedRequest] = []
    for gres in dict.fromkeys(r.gres for r in requests if r.gres is not None):
        pinned += _pin_gres(gres, [r for r in requests if r.gres == gres], layout, slices, node)
    cpus = [r for r in requests if r.is_cpu]
    if cpus:
        pinned += _pin_cpus(cpus, layout, slices, node)
    order = {r.request: i for i, r in enumerate(requests)}
    pinned.sort(key=lambda p: order[p.request.request])
    return PinnedClaim(node, pinned)
