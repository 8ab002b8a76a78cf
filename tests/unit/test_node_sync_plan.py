"""Node sync's decisions, exhaustively, without I/O: snapshot in, actions out."""

import json
import random
from typing import Any

import pytest

from bridge import keys
from bridge.dra import DRA_GPUS, dra_gpu_counts
from bridge.node_actions import (
    MANAGED_BY,
    NAME_CONFLICT,
    NOT_EXTERNAL,
    PARTITION_NOT_FOUND,
    REGISTRATION_DEFERRED,
    REGISTRATION_FAILED,
    REREGISTRATION_BLOCKED,
    SLURMD_NODE,
    TAINT_CONFLICT,
    AddTaint,
    CreateSlurmNode,
    DeleteSlurmNode,
    DrainSlurmNode,
    NodeAction,
    NodeActions,
    NodeSnapshot,
    Registration,
    RemoveTaint,
    ReportEvent,
    UndrainSlurmNode,
    UpdateSlurmNode,
    owned_by,
    ownership_comment,
)
from bridge.node_facts import gpu_count, kube_node_view, slurm_node_view, watch_signature
from bridge.node_sync import most_urgent, plan
from workflows.node_sync import batches

SCHEDULER = "slurm-bridge-scheduler"
PREFIX = keys.DRAIN_REASON_PREFIX
OURS = ownership_comment(SCHEDULER, "n1")
Json = dict[str, Any]


def kube(
    name: str = "n1",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    unschedulable: bool = False,
    ready: str | None = "True",
    ready_reason: str = "KubeletReady",
    cpu: str | None = "4",
    memory: str | None = "8000Mi",
    gpus: dict[str, str] | None = None,
    ip: str | None = "10.0.0.1",
    tainted: bool = False,
    taints: list[Json] | None = None,
) -> Json:
    allocatable = {"pods": "110", **({"cpu": cpu} if cpu else {}), **({"memory": memory} if memory else {})}
    node_taints = list(taints or [])
    if tainted:
        node_taints.append({"key": keys.TAINT_MANAGED_NODE, "value": SCHEDULER, "effect": "NoExecute"})
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append(
            {"type": "Ready", "status": ready, "reason": ready_reason, "lastHeartbeatTime": "t"}
        )
    addresses = [{"type": "Hostname", "address": name}]
    if ip:
        addresses.append({"type": "InternalIP", "address": ip})
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": {"unschedulable": unschedulable, "taints": node_taints},
        "status": {
            "allocatable": {**allocatable, **(gpus or {})},
            "conditions": conditions,
            "addresses": addresses,
        },
    }


def external(name: str = "n1", *, partitions: str | None = "p1", **kwargs: Any) -> Json:
    annotations = dict(kwargs.pop("annotations", None) or {})
    if partitions is not None:
        annotations[keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS] = partitions
    labels = {keys.LABEL_EXTERNAL_NODE: "true", **(kwargs.pop("labels", None) or {})}
    return kube(name, labels=labels, annotations=annotations, **kwargs)


def slurm(
    name: str = "n1",
    *,
    state: tuple[str, ...] = ("IDLE",),
    reason: str = "",
    cpus: int = 4,
    real_memory: int = 8000,
    features: tuple[str, ...] = ("p1",),
    gres: str = "",
    address: str = "10.0.0.1",
    topology: str = "",
    comment: str = "",
    alloc_cpus: int = 0,
    ext: bool = True,
) -> Json:
    return {
        "name": name,
        "state": [*state, *(["EXTERNAL", "DYNAMIC_NORM"] if ext else [])],
        "reason": reason,
        "cpus": cpus,
        "real_memory": real_memory,
        "features": list(features),
        "gres": gres,
        "address": address,
        "topology": topology,
        "comment": comment,
        "alloc_cpus": alloc_cpus,
    }


def ours(name: str = "n1", **kwargs: Any) -> Json:
    """A Slurm node this bridge registered for Kubernetes node n1."""
    return slurm(name, comment=OURS, **kwargs)


def run_plan(
    kube_nodes: list[Json],
    slurm_nodes: list[Json] = (),  # type: ignore[assignment]
    partitions: tuple[str, ...] = ("p1", "p2", "slurm-bridge"),
) -> list[NodeAction]:
    snapshot = NodeSnapshot(
        kube_nodes=[kube_node_view(k) for k in kube_nodes],
        slurm_nodes=[slurm_node_view(s) for s in slurm_nodes],
        partitions=list(partitions),
    )
    return plan(snapshot, scheduler_name=SCHEDULER, default_partition="slurm-bridge")


def kinds(actions: list[NodeAction]) -> list[str]:
    return [a.kind for a in actions]


def events(actions: list[NodeAction]) -> list[ReportEvent]:
    return [a for a in actions if isinstance(a, ReportEvent)]


# -- taints: managed = has a Slurm counterpart --------------------------------


def test_a_kubernetes_only_node_needs_nothing() -> None:
    assert run_plan([kube("web-1")], [slurm("other")]) == []


def test_a_kubernetes_only_node_loses_our_taint_but_keeps_another_schedulers() -> None:
    assert run_plan([kube("web-1", tainted=True)]) == [
        RemoveTaint(slurm_node="web-1", kube_node="web-1", kube_uid="uid-web-1")
    ]
    foreign = {"key": keys.TAINT_MANAGED_NODE, "value": "other-scheduler", "effect": "NoExecute"}
    assert run_plan([kube("web-1", taints=[foreign])]) == []


def test_a_managed_node_is_tainted_once() -> None:
    assert run_plan([kube()], [slurm()]) == [AddTaint(slurm_node="n1", kube_node="n1", kube_uid="uid-n1")]
    assert run_plan([kube(tainted=True)], [slurm()]) == []


def test_the_slurm_nodename_label_maps_a_kubernetes_node_to_its_slurm_node() -> None:
    node = kube("k8s-7", labels={keys.LABEL_SLURM_NODE_NAME: "gpu-7"})
    [action] = run_plan([node], [slurm("gpu-7")])
    assert action == AddTaint(slurm_node="gpu-7", kube_node="k8s-7", kube_uid="uid-k8s-7")
    # The Slurm node named like the Kubernetes node is not its counterpart.
    assert run_plan([node], [slurm("k8s-7")]) == []


def test_a_taint_of_another_scheduler_is_reported_not_replaced() -> None:
    foreign = {"key": keys.TAINT_MANAGED_NODE, "value": "other-scheduler", "effect": "NoExecute"}
    [event] = run_plan([kube(taints=[foreign])], [slurm()])
    assert isinstance(event, ReportEvent)
    assert event.reason == TAINT_CONFLICT
    assert "other-scheduler" in event.message


def test_two_kubernetes_nodes_claiming_one_slurm_node_change_nothing_but_say_so() -> None:
    a = kube("a", labels={keys.LABEL_SLURM_NODE_NAME: "s1"}, unschedulable=True)
    b = kube("b", labels={keys.LABEL_SLURM_NODE_NAME: "s1"}, tainted=True)
    actions = run_plan([a, b], [slurm("s1")])
    assert kinds(actions) == ["report_event", "report_event"]
    assert {e.kube_node for e in events(actions)} == {"a", "b"}
    assert all(e.reason == NAME_CONFLICT for e in events(actions))


# -- drain mirroring ------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (kube(unschedulable=True, tainted=True), "Kubernetes node n1 is cordoned"),
        (kube(ready="False", tainted=True), "Kubernetes node n1 is not Ready (KubeletReady)"),
        (
            kube(ready="Unknown", ready_reason="NodeStatusUnknown", tainted=True),
            "is not Ready (NodeStatusUnknown)",
        ),
        (kube(ready=None, tainted=True), "Kubernetes node n1 reports no Ready condition"),
    ],
)
def test_a_cordoned_or_unready_managed_node_is_drained_with_our_reason(node: Json, why: str) -> None:
    [action] = run_plan([node], [slurm()])
    assert isinstance(action, DrainSlurmNode)
    assert action.reason.startswith("slurm-bridge: ")
    assert why in action.reason


def test_our_drain_is_kept_and_its_reason_kept_current() -> None:
    cordoned = kube(unschedulable=True, tainted=True)
    reason = PREFIX + "Kubernetes node n1 is cordoned"
    assert run_plan([cordoned], [slurm(state=("IDLE", "DRAIN"), reason=reason)]) == []
    stale = PREFIX + "Kubernetes node n1 is not Ready"
    [action] = run_plan([cordoned], [slurm(state=("IDLE", "DRAIN"), reason=stale)])
    assert action == DrainSlurmNode(slurm_node="n1", kube_node="n1", kube_uid="uid-n1", reason=reason)


@pytest.mark.parametrize("reason", [PREFIX + "Kubernetes node n1 is cordoned", "", "slurm-bridge:x"])
def test_a_schedulable_ready_node_is_undrained_when_the_drain_is_ours(reason: str) -> None:
    [action] = run_plan([kube(tainted=True)], [slurm(state=("ALLOCATED", "DRAIN"), reason=reason)])
    assert isinstance(action, UndrainSlurmNode)


@pytest.mark.parametrize(
    "node", [kube(tainted=True), kube(unschedulable=True, tainted=True), kube(ready="False")]
)
def test_an_administrators_drain_is_never_touched(node: Json) -> None:
    admin = slurm(state=("IDLE", "DRAIN"), reason="disk replacement, ticket 42")
    assert [a for a in run_plan([node], [admin]) if not isinstance(a, AddTaint)] == []


def test_an_undrain_in_progress_is_not_a_drain() -> None:
    [action] = run_plan([kube(unschedulable=True, tainted=True)], [slurm(state=("IDLE", "DRAIN", "UNDRAIN"))])
    assert isinstance(action, DrainSlurmNode)


# -- registration of external nodes -------------------------------------------


def test_a_labelled_node_is_registered_from_its_allocatable_resources() -> None:
    node = external(
        cpu="7500m",
        memory="16Gi",
        gpus={"nvidia.com/gpu": "2", "amd.com/gpu": "1"},
        partitions=" p1, p2 ,p1,",
        annotations={keys.ANNOTATION_TOPOLOGY_SPEC: "default:sw1"},
        ip="10.1.2.3",
    )
    create, taint = run_plan([node])
    assert isinstance(create, CreateSlurmNode)
    assert create.registration == Registration(
        name="n1",
        cpus=7,  # whole allocatable CPUs only: Slurm must not hand out what the node cannot give
        real_memory=16384,
        gpus=3,
        address="10.1.2.3",
        features=["p1", "p2"],
        topology="default:sw1",
        comment=OURS,
    )
    assert create.registration.node_conf() == (
        "NodeName=n1 State=EXTERNAL CPUs=7 Sockets=1 CoresPerSocket=7 ThreadsPerCore=1 RealMemory=16384 "
        "NodeAddr=10.1.2.3 Features=p1,p2 Gres=gpu:3 Topology=default:sw1"
    )
    assert isinstance(taint, AddTaint)


def test_without_the_partitions_annotation_the_bridges_partition_is_used() -> None:
    create, _ = run_plan([external(partitions=None)])
    assert isinstance(create, CreateSlurmNode)
    assert create.registration.features == ["slurm-bridge"]
    assert "Gres" not in create.registration.node_conf()
    assert "Topology" not in create.registration.node_conf()


def test_the_comment_names_the_kubernetes_node_and_the_scheduler() -> None:
    create, _ = run_plan([external("k8s-1")])
    assert isinstance(create, CreateSlurmNode)
    assert create.slurm_node == create.registration.name == "k8s-1"
    assert json.loads(create.registration.comment)["kubernetesNode"] == "k8s-1"
    assert owned_by(create.registration.comment, SCHEDULER)
    assert not owned_by(create.registration.comment, "another-scheduler")


def test_a_missing_partition_is_reported_and_nothing_registered() -> None:
    actions = run_plan([external(partitions="p1,nope,gone", tainted=True)])
    assert kinds(actions) == ["report_event", "remove_taint"]
    [event] = events(actions)
    assert event.reason == PARTITION_NOT_FOUND
    assert event.warning
    assert "nope, gone" in event.message


def test_a_missing_partition_keeps_an_existing_registration_as_it_is() -> None:
    actions = run_plan([external(partitions="p2,nope", tainted=True)], [ours()])
    assert kinds(actions) == ["report_event"]
    assert events(actions)[0].reason == PARTITION_NOT_FOUND


@pytest.mark.parametrize(
    ("node", "words"),
    [
        (external(partitions=" , "), "names no partition"),
        (external(ip=None), "no InternalIP"),
        (external(ip="not-an-ip"), "no InternalIP"),
        (external(cpu=None), "no allocatable cpu"),
        (external(cpu="500m"), "not one whole CPU"),
        (external(memory="512Ki"), "not one whole MiB"),
        (external(memory="lots"), "allocatable memory"),
        (external(gpus={"nvidia.com/gpu": "x"}), "allocatable nvidia.com/gpu"),
        (external(annotations={keys.ANNOTATION_TOPOLOGY_SPEC: "a State=FUTURE"}), "is not a topology"),
        (external("bad name!"), "not a usable Slurm node name"),
    ],
)
def test_a_node_that_cannot_be_registered_says_why(node: Json, words: str) -> None:
    actions = run_plan([node])
    assert kinds(actions) == ["report_event"]
    [event] = events(actions)
    assert event.reason == REGISTRATION_FAILED
    assert words in event.message


@pytest.mark.parametrize("node", [external(unschedulable=True), external(ready="False")])
def test_registration_waits_until_the_node_is_schedulable_and_ready(node: Json) -> None:
    [event] = run_plan([node])
    assert isinstance(event, ReportEvent)
    assert event.reason == REGISTRATION_DEFERRED
    assert not event.warning


def test_a_registered_node_in_step_needs_nothing() -> None:
    node = external(
        gpus={"nvidia.com/gpu": "2"}, annotations={keys.ANNOTATION_TOPOLOGY_SPEC: "t:s1"}, tainted=True
    )
    assert run_plan([node], [ours(gres="gpu:2(S:0)", topology="t:s1")]) == []


def test_topology_and_address_are_updated_in_place() -> None:
    node = external(
        gpus={"nvidia.com/gpu": "2"},
        annotations={keys.ANNOTATION_TOPOLOGY_SPEC: "t:s2"},
        ip="10.9.9.9",
        tainted=True,
    )
    [update] = run_plan([node], [ours(gres="gpu:2", topology="t:s1")])
    assert update == UpdateSlurmNode(
        slurm_node="n1", kube_node="n1", kube_uid="uid-n1", topology="t:s2", address="10.9.9.9"
    )
    [clear] = run_plan(
        [external(gpus={"nvidia.com/gpu": "2"}, tainted=True)], [ours(gres="gpu:2", topology="t:s1")]
    )
    assert isinstance(clear, UpdateSlurmNode)
    assert clear.changes() == {"topology": ""}


def test_a_labelled_external_node_made_by_hand_is_adopted() -> None:
    [update, taint] = run_plan([external()], [slurm(comment="made by admin")])
    assert update == UpdateSlurmNode(slurm_node="n1", kube_node="n1", kube_uid="uid-n1", comment=OURS)
    assert isinstance(taint, AddTaint)


def test_a_labelled_regular_slurm_node_is_not_registered_but_still_mirrored() -> None:
    actions = run_plan([external(unschedulable=True)], [slurm(ext=False, cpus=64)])
    assert kinds(actions) == ["report_event", "add_taint", "drain_slurm_node"]
    assert events(actions)[0].reason == NOT_EXTERNAL


# -- slurmd nodes (slurm-operator interop): never registered over, never deleted ----

ALIAS = keys.LABEL_EXTERNAL_NODE_ALIAS
SLURMD = {keys.LABEL_SLURM_NODE_NAME: "sn-1"}  # slurm-operator's mark of a node running slurmd


def test_the_upstream_docs_label_registers_a_node_too() -> None:
    node = kube(labels={ALIAS: "true"}, annotations={keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS: "p1"})
    create, taint = run_plan([node])
    assert isinstance(create, CreateSlurmNode)
    assert create.registration == run_plan([external()])[0].registration  # type: ignore[union-attr]
    assert isinstance(taint, AddTaint)
    # Registered under the alias: in step, nothing to do; removing it removes the node.
    assert run_plan([kube(labels={ALIAS: ""}, tainted=True)], [ours(features=("slurm-bridge",))]) == []
    assert kinds(run_plan([kube(tainted=True)], [ours()])) == [
        "drain_slurm_node",
        "delete_slurm_node",
        "remove_taint",
    ]


def test_either_registration_label_changes_the_watch_signature() -> None:
    plain = watch_signature(kube())
    assert watch_signature(kube(labels={ALIAS: ""})) != plain
    assert watch_signature(kube(labels={keys.LABEL_EXTERNAL_NODE: ""})) != plain


@pytest.mark.parametrize("label", [keys.LABEL_EXTERNAL_NODE, ALIAS, None])
@pytest.mark.parametrize(
    ("slurm_nodes", "expected"),
    [
        # slurmd not registered yet (a dynamic slurmd starting): nothing is created in its place.
        ([], []),
        # slurmd's node (in slurm.conf, or dynamic `slurmd -Z`): tainted, cordon mirrored, nothing else.
        ([slurm("sn-1", ext=False)], ["add_taint", "drain_slurm_node"]),
        ([slurm("sn-1", ext=False, state=("IDLE", "DYNAMIC_NORM"))], ["add_taint", "drain_slurm_node"]),
        # Even an external node of ours under its name is neither re-registered nor removed through it.
        ([ours("sn-1", cpus=1, features=("p9",))], ["add_taint", "drain_slurm_node"]),
    ],
)
def test_a_node_running_slurmd_is_never_registered_drained_as_external_or_deleted(
    label: str | None, slurm_nodes: list[Json], expected: list[str]
) -> None:
    labels = {**SLURMD, **({label: "true"} if label else {})}
    cordoned = kube("kn-1", labels=labels, unschedulable=True)
    actions = run_plan([cordoned], slurm_nodes)
    assert [a for a in kinds(actions) if a != "report_event"] == expected
    assert not any(isinstance(a, CreateSlurmNode | DeleteSlurmNode | UpdateSlurmNode) for a in actions)
    for drain in (a for a in actions if isinstance(a, DrainSlurmNode)):
        assert drain.reason == PREFIX + "Kubernetes node kn-1 is cordoned"  # mirrored, not "removing"
    if label is not None:
        [event] = events(actions)
        assert event.reason == SLURMD_NODE
        assert f"{label} is ignored" in event.message
    else:
        assert events(actions) == []
    if slurm_nodes:
        # Schedulable again: our drain is lifted, as on any mapped node.
        [current] = slurm_nodes
        drained = {**current, "state": [*current["state"], "DRAIN"], "reason": actions[-1].reason}  # type: ignore[union-attr]
        again = run_plan([kube("kn-1", labels=labels, tainted=True)], [drained])
        assert [a for a in kinds(again) if a != "report_event"] == ["undrain_slurm_node"]


@pytest.mark.parametrize("label", [keys.LABEL_EXTERNAL_NODE, ALIAS])
@pytest.mark.parametrize(
    "regular",
    [
        slurm(ext=False, cpus=64, features=("batch",)),  # slurm.conf node, shape unlike the Kubernetes node
        slurm(
            ext=False, state=("IDLE", "DYNAMIC_NORM"), comment=OURS
        ),  # dynamic slurmd, even with our comment
        slurm(ext=False, state=("IDLE", "DRAIN"), reason="RMA"),
    ],
)
def test_a_same_named_regular_slurm_node_is_never_re_registered_or_deleted(label: str, regular: Json) -> None:
    for node in (kube(labels={label: "true"}, tainted=True), kube(tainted=True), kube(cpu="8", tainted=True)):
        actions = run_plan([node], [regular])
        assert not any(isinstance(a, CreateSlurmNode | DeleteSlurmNode | UpdateSlurmNode) for a in actions)
        assert not any("removing" in a.reason for a in actions if isinstance(a, DrainSlurmNode))
    labelled = run_plan([kube(labels={label: "true"}, tainted=True)], [regular])
    assert events(labelled)[0].reason == NOT_EXTERNAL
    assert not any(isinstance(a, DeleteSlurmNode) for a in run_plan([], [regular]))


# -- re-registration: CPUs, memory, partitions ----------------------------------


@pytest.mark.parametrize(
    ("node", "change"),
    [
        (external(cpu="8", tainted=True), "CPUs 4 → 8"),
        (external(memory="4000Mi", tainted=True), "memory 8000 → 4000 MiB"),
        (external(partitions="p1,p2", tainted=True), "partitions p1 → p1,p2"),
        # Slurm (with gres.conf) refuses a new GPU count on an existing node.
        (external(gpus={"nvidia.com/gpu": "4"}, tainted=True), "GPUs 0 → 4"),
    ],
)
def test_a_changed_shape_drains_a_busy_node_for_re_registration(node: Json, change: str) -> None:
    [drain] = run_plan([node], [ours(state=("ALLOCATED",))])
    assert isinstance(drain, DrainSlurmNode)
    assert drain.reason == f"{PREFIX}re-registering external node n1: {change}"
    assert run_plan([node], [ours(state=("ALLOCATED", "DRAIN"), reason=drain.reason)]) == []


@pytest.mark.parametrize("state", [("IDLE",), ("IDLE", "DRAIN")])
def test_an_idle_node_is_re_registered_at_once(state: tuple[str, ...]) -> None:
    reason = f"{PREFIX}re-registering external node n1: CPUs 4 → 8"
    delete, create = run_plan([external(cpu="8", tainted=True)], [ours(state=state, reason=reason)])
    assert isinstance(delete, DeleteSlurmNode)
    assert isinstance(create, CreateSlurmNode)
    assert create.registration.cpus == 8


@pytest.mark.parametrize(
    ("plugin", "dra", "gres"),
    [(None, 4, "gpu:4"), ("2", 2, "gpu:2"), ("4", 2, "gpu:4"), (None, 0, "")],
)
def test_gpus_a_dra_driver_publishes_are_registered_once(plugin: str | None, dra: int, gres: str) -> None:
    node = external(gpus={"nvidia.com/gpu": plugin} if plugin else None)
    # As read_snapshot builds it, with the GPUs of the node's ResourceSlices.
    view = kube_node_view(node, dra_gpus=dra)
    assert view["status"].get(DRA_GPUS) == (dra or None)
    snapshot = NodeSnapshot(kube_nodes=[view], slurm_nodes=[], partitions=["p1"])
    actions = plan(snapshot, scheduler_name=SCHEDULER, default_partition="slurm-bridge")
    create = next(a for a in actions if isinstance(a, CreateSlurmNode))
    assert create.registration.gres == gres


def test_dra_gpu_counts_come_from_gpu_drivers_slices_on_each_node() -> None:
    def item(driver: str, node: str | None, devices: int) -> Json:
        spec: Json = {"driver": driver, "devices": [{"name": f"d{i}"} for i in range(devices)]}
        if node:
            spec["nodeName"] = node
        return {"spec": spec}

    slices = [
        item("gpu.nvidia.com", "a", 2),
        item("gpu.nvidia.com", "a", 2),  # a pool in two slices
        item("gpu.example.com", "b", 1),
        item(keys.DRA_CPU_CLASS, "b", 64),  # CPUs are not GPUs
        item("net.example.com", "b", 4),  # nor is another driver's device
        item("gpu.nvidia.com", None, 8),  # not bound to one node
    ]
    assert dra_gpu_counts(slices) == {"a": 4, "b": 1}


@pytest.mark.parametrize(("before", "after"), [("gpu:2", "4"), ("gpu:4", "1"), ("gpu:2(S:0)", "0")])
def test_an_idle_node_with_a_new_gpu_count_is_re_registered(before: str, after: str) -> None:
    node = external(gpus={"nvidia.com/gpu": after}, tainted=True)
    delete, create = run_plan([node], [ours(gres=before)])
    assert isinstance(delete, DeleteSlurmNode)
    assert delete.why == f"re-registering: GPUs {gpu_count(before)} → {after}"
    assert isinstance(create, CreateSlurmNode)
    assert create.registration.gpus == int(after)


def test_re_registration_of_a_busy_node_drained_for_another_reason_of_ours_updates_the_reason() -> None:
    cordoned = PREFIX + "Kubernetes node n1 is cordoned"
    [drain] = run_plan([external(cpu="8", tainted=True)], [ours(state=("MIXED", "DRAIN"), reason=cordoned)])
    assert isinstance(drain, DrainSlurmNode)
    assert "re-registering" in drain.reason


def test_re_registration_never_lifts_an_administrators_drain() -> None:
    actions = run_plan([external(cpu="8", tainted=True)], [ours(state=("IDLE", "DRAIN"), reason="RMA")])
    assert kinds(actions) == ["report_event"]
    assert events(actions)[0].reason == REREGISTRATION_BLOCKED


def test_re_registration_of_a_cordoned_node_waits_until_it_is_back_drained_meanwhile() -> None:
    node = external(cpu="8", unschedulable=True, tainted=True)
    reason = PREFIX + "Kubernetes node n1 is cordoned"
    assert run_plan([node], [ours(state=("IDLE", "DRAIN"), reason=reason)]) == []
    [drain] = run_plan([node], [ours()])
    assert drain == DrainSlurmNode(slurm_node="n1", kube_node="n1", kube_uid="uid-n1", reason=reason)


def test_an_adopted_node_is_marked_ours_before_it_is_re_registered() -> None:
    actions = run_plan([external(cpu="8", tainted=True)], [slurm(state=("IDLE", "DRAIN"), reason="")])
    assert kinds(actions) == ["update_slurm_node", "delete_slurm_node", "create_slurm_node"]


# -- removal --------------------------------------------------------------------


def test_removing_the_label_drains_then_deletes_once_no_job_runs() -> None:
    node = kube(tainted=True)
    [drain] = run_plan([node], [ours(state=("ALLOCATED",))])
    assert isinstance(drain, DrainSlurmNode)
    assert drain.reason.startswith(f"{PREFIX}removing external node n1: label {keys.LABEL_EXTERNAL_NODE}")
    assert run_plan([node], [ours(state=("ALLOCATED", "DRAIN"), reason=drain.reason)]) == []
    assert run_plan([node], [ours(state=("IDLE", "DRAIN"), reason=drain.reason, alloc_cpus=2)]) == []
    delete, untaint = run_plan([node], [ours(state=("IDLE", "DRAIN"), reason=drain.reason)])
    assert isinstance(delete, DeleteSlurmNode)
    assert isinstance(untaint, RemoveTaint)


def test_an_idle_node_losing_its_label_is_drained_and_deleted_in_one_run() -> None:
    assert kinds(run_plan([kube(tainted=True)], [ours()])) == [
        "drain_slurm_node",
        "delete_slurm_node",
        "remove_taint",
    ]


def test_an_administrators_drain_does_not_stop_the_removal() -> None:
    delete, _ = run_plan([kube(tainted=True)], [ours(state=("IDLE", "DRAIN"), reason="RMA")])
    assert isinstance(delete, DeleteSlurmNode)


def test_a_node_whose_kubernetes_node_is_gone_is_removed_too() -> None:
    [drain] = run_plan([], [ours(state=("MIXED",))])
    assert isinstance(drain, DrainSlurmNode)
    assert drain.kube_node is None
    assert "its Kubernetes node is gone" in drain.reason
    [delete] = run_plan([], [ours(state=("IDLE", "DRAIN"), reason=drain.reason)])
    assert isinstance(delete, DeleteSlurmNode)


@pytest.mark.parametrize(
    "node",
    [
        slurm(state=("IDLE", "DRAIN")),  # made by hand
        slurm(state=("IDLE", "DRAIN"), comment=ownership_comment("another-scheduler", "n1")),
        # Another Kubernetes cluster's bridge on the same Slurm, with the same scheduler name.
        slurm(state=("IDLE", "DRAIN"), comment=ownership_comment(SCHEDULER, "n1", "other-cluster")),
        slurm(state=("IDLE", "DRAIN"), comment=OURS, ext=False),  # a slurmd node
        slurm(state=("IDLE", "DRAIN"), comment="{not json"),
    ],
)
def test_only_external_nodes_of_ours_are_ever_deleted(node: Json) -> None:
    assert not any(isinstance(a, DeleteSlurmNode) for a in run_plan([kube(tainted=True)], [node]))
    assert run_plan([], [node]) == []


def test_relabelling_a_node_being_removed_undrains_it() -> None:
    reason = f"{PREFIX}removing external node n1: label removed"
    [undrain] = run_plan([external(tainted=True)], [ours(state=("ALLOCATED", "DRAIN"), reason=reason)])
    assert isinstance(undrain, UndrainSlurmNode)


# -- properties of the whole plan --------------------------------------------------


def cluster() -> tuple[list[Json], list[Json]]:
    kube_nodes = [
        kube("plain"),
        kube("managed", unschedulable=True),
        external("new", partitions="p1"),
        external("bad", partitions="nope"),
        kube("leaving", tainted=True),
        kube("hand", tainted=True),
    ]
    slurm_nodes = [
        slurm("managed"),
        slurm("leaving", comment=ownership_comment(SCHEDULER, "leaving")),
        slurm("orphan", comment=ownership_comment(SCHEDULER, "orphan"), state=("IDLE", "DRAIN")),
        slurm("hand", state=("IDLE", "DRAIN"), reason="admin"),
    ]
    return kube_nodes, slurm_nodes


def test_the_plan_does_not_depend_on_the_order_of_the_snapshot() -> None:
    kube_nodes, slurm_nodes = cluster()
    expected = run_plan(kube_nodes, slurm_nodes)
    assert len(expected) > 5
    shuffler = random.Random(7)
    for _ in range(20):
        shuffler.shuffle(kube_nodes)
        shuffler.shuffle(slurm_nodes)
        assert run_plan(kube_nodes, slurm_nodes) == expected


def test_actions_survive_the_data_converter() -> None:
    kube_nodes, slurm_nodes = cluster()
    actions = run_plan(kube_nodes, slurm_nodes)
    dumped = NodeActions(actions=actions).model_dump_json()
    assert NodeActions.model_validate_json(dumped).actions == actions


def test_batches_never_split_one_nodes_actions() -> None:
    kube_nodes, slurm_nodes = cluster()
    actions = run_plan(kube_nodes, slurm_nodes)
    split = batches(actions, 2)
    assert [a for batch in split for a in batch] == actions
    subjects = [{a.subject for a in batch} for batch in split]
    for i, first in enumerate(subjects):
        for later in subjects[i + 1 :]:
            assert not first & later


def test_a_run_takes_whole_nodes_most_urgent_first_and_counts_the_rest() -> None:
    kube_nodes, slurm_nodes = cluster()
    actions = run_plan(kube_nodes, slurm_nodes)

    chosen, left = most_urgent(actions, 5)

    # Drains first (they keep Slurm jobs off the node), then the taint, then registration;
    # the orphan's delete and the report wait, and nothing is dropped or counted twice.
    assert [(a.subject, a.kind) for a in chosen] == [
        ("leaving", "drain_slurm_node"),
        ("leaving", "delete_slurm_node"),
        ("leaving", "remove_taint"),
        ("managed", "add_taint"),
        ("managed", "drain_slurm_node"),
    ]
    assert left == len(actions) - 5 == 4
    everything, none_left = most_urgent(actions, len(actions))
    assert none_left == 0
    assert sorted(a.model_dump_json() for a in everything) == sorted(a.model_dump_json() for a in actions)


def test_a_run_never_splits_a_node_and_always_takes_one() -> None:
    kube_nodes, slurm_nodes = cluster()
    actions = run_plan(kube_nodes, slurm_nodes)
    for limit in range(1, len(actions) + 1):
        chosen, left = most_urgent(actions, limit)
        subjects = {a.subject for a in chosen}
        assert chosen, limit
        assert len(chosen) <= max(limit, 3)  # the largest node's actions, if alone over the limit
        assert [a for a in actions if a.subject in subjects] == sorted(chosen, key=actions.index)
        assert left == len(actions) - len(chosen)


# -- helpers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("", 0),
        (None, 0),
        ("gpu:2", 2),
        ("gpu:a100:2(S:0-1)", 2),
        ("gpu:1,gpu:h100:2,mps:100", 3),
        ("(null)", 0),
    ],
)
def test_gpu_count(gres: str | None, count: int) -> None:
    assert gpu_count(gres) == count


def test_the_watch_signature_ignores_heartbeats_and_versions_but_not_what_the_plan_reads() -> None:
    node = kube()
    beat = kube()
    beat["metadata"]["resourceVersion"] = "8"
    beat["status"]["conditions"][1]["lastHeartbeatTime"] = "later"
    beat["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = "0"
    assert watch_signature(beat) == watch_signature(node)
    for changed in (
        kube(unschedulable=True),
        kube(ready="False"),
        kube(cpu="8"),
        kube(labels={keys.LABEL_EXTERNAL_NODE: ""}),
        kube(annotations={keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS: "p2"}),
        kube(tainted=True),
        kube(ip="10.0.0.2"),
    ):
        assert watch_signature(changed) != watch_signature(node)


def test_a_node_registered_before_installations_were_recorded_is_adopted_then_deletable() -> None:
    # The comment of an older bridge: no installation. Still ours, and relabelled with it.
    legacy = json.dumps({"managedBy": MANAGED_BY, "scheduler": SCHEDULER, "kubernetesNode": "n1"})
    assert owned_by(legacy, SCHEDULER, "slurm-bridge")
    actions = run_plan([external()], [slurm(comment=legacy)])
    updates = [a for a in actions if isinstance(a, UpdateSlurmNode)]
    assert [u.comment for u in updates] == [OURS]
    assert any(
        isinstance(a, DeleteSlurmNode) for a in run_plan([], [slurm(state=("IDLE", "DRAIN"), comment=legacy)])
    )


def test_another_installations_node_of_the_same_name_is_neither_adopted_nor_deleted() -> None:
    theirs = ownership_comment(SCHEDULER, "n1", "other-cluster")
    assert not owned_by(theirs, SCHEDULER, "slurm-bridge")
    assert owned_by(theirs, SCHEDULER, "other-cluster")
    actions = run_plan([], [slurm(comment=theirs)])
    assert not any(isinstance(a, DeleteSlurmNode | UpdateSlurmNode) for a in actions)
