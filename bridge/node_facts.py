"""What node sync reads from a node: trimmed views, state predicates, the registration asked for.

Pure helpers shared by the planner (`bridge.node_sync`), the apply activity
(which re-checks Slurm's answer with the same predicates) and the node watcher
(which compares the same trimmed views).
"""

import ipaddress
import json
import math
import re
from collections.abc import Collection, Mapping
from fractions import Fraction
from typing import Any

from bridge import keys
from bridge.dra import DRA_GPUS
from bridge.node_actions import (
    PARTITION_NOT_FOUND,
    REGISTRATION_FAILED,
    Json,
    Registration,
    owned_by,
    ownership_comment,
)
from bridge.quantity import MIB, QuantityError, parse_quantity

NO_EXECUTE = "NoExecute"
# Slurm node states in which a job holds (or is releasing) the node.
BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
SLURM_FIELDS = (
    "name",
    "state",
    "reason",
    "cpus",
    "real_memory",
    "gres",
    "features",
    "address",
    "topology",
    "comment",
    "alloc_cpus",
)
# Values that end up in a node_conf line must not smuggle in more `Key=value` words.
_TOPOLOGY = re.compile(r"[A-Za-z0-9_.:,/\[\]-]{1,256}")
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,253}")


# -- trimming: only what the plan reads crosses Temporal ----------------------


def kube_node_view(node: Mapping[str, Any], *, dra_gpus: int = 0) -> Json:
    """A Kubernetes Node cut down to the fields the plan reads, in the API's own shape.

    `dra_gpus`: the GPUs DRA drivers publish for the node (ResourceSlices), kept in
    the bridge-internal status field `draGpus` when there are any.
    """
    meta = node.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    spec, status = node.get("spec") or {}, node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
            "labels": {
                k: labels[k] for k in (keys.LABEL_SLURM_NODE_NAME, *keys.LABELS_EXTERNAL_NODE) if k in labels
            },
            "annotations": {
                k: annotations[k]
                for k in (keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS, keys.ANNOTATION_TOPOLOGY_SPEC)
                if k in annotations
            },
        },
        "spec": {
            "unschedulable": bool(spec.get("unschedulable")),
            "taints": [t for t in spec.get("taints") or [] if t.get("key") == keys.TAINT_MANAGED_NODE],
        },
        "status": {
            "allocatable": {
                k: allocatable[k] for k in ("cpu", "memory", *keys.GPU_RESOURCES) if k in allocatable
            },
            "conditions": [
                {k: c[k] for k in ("type", "status", "reason") if k in c}
                for c in status.get("conditions") or []
                if c.get("type") == "Ready"
            ],
            "addresses": [a for a in status.get("addresses") or [] if a.get("type") == "InternalIP"],
            **({DRA_GPUS: dra_gpus} if dra_gpus else {}),
        },
    }


def watch_signature(node: Mapping[str, Any]) -> str:
    """What a node watcher compares: a change here can change the plan (resourceVersion cannot)."""
    view = kube_node_view(node)
    view["metadata"].pop("resourceVersion")
    return json.dumps(view, sort_keys=True, separators=(",", ":"))


def slurm_node_view(node: Mapping[str, Any]) -> Json:
    return {k: node[k] for k in SLURM_FIELDS if node.get(k) is not None}


# -- reading a node ------------------------------------------------------------


def kube_name(kube: Json) -> str:
    return str(kube["metadata"]["name"])


def slurm_name(kube: Json) -> str:
    labels = kube["metadata"].get("labels") or {}
    return str(labels.get(keys.LABEL_SLURM_NODE_NAME) or kube_name(kube))


def registration_label(kube: Json) -> str | None:
    """The label asking node sync to register this node as an external Slurm node, if any."""
    labels = kube["metadata"].get("labels") or {}
    return next((label for label in keys.LABELS_EXTERNAL_NODE if label in labels), None)


def runs_slurmd(kube: Json) -> bool:
    """Marked as a node where slurmd runs: slurm-operator labels its nodes with their Slurm name.

    Node sync never registers such a node as an external one, nor drains or deletes it as one:
    the Slurm node of that name is (or is about to be) slurmd's own.
    """
    return bool((kube["metadata"].get("labels") or {}).get(keys.LABEL_SLURM_NODE_NAME))


def drain_wanted(kube: Json) -> str | None:
    """Why Slurm must not start jobs on this node now, or None when it may."""
    name = kube_name(kube)
    if (kube.get("spec") or {}).get("unschedulable"):
        return f"Kubernetes node {name} is cordoned"
    conditions = (kube.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        return f"Kubernetes node {name} reports no Ready condition"
    if ready.get("status") != "True":
        detail = f" ({ready['reason']})" if ready.get("reason") else ""
        return f"Kubernetes node {name} is not Ready{detail}"
    return None


def is_external(node: Json) -> bool:
    return "EXTERNAL" in (node.get("state") or [])


def registered_by_us(node: Json, scheduler_name: str) -> bool:
    """An external Slurm node this bridge registered (its comment says so): the only kind it deletes.

    A node slurmd registered (in slurm.conf, or dynamic: DYNAMIC_NORM without EXTERNAL)
    never is, whatever its comment.
    """
    return is_external(node) and owned_by(node.get("comment"), scheduler_name)


def is_drained(node: Json) -> bool:
    """DRAIN set (draining or drained); UNDRAIN means an undrain is already on its way."""
    state = node.get("state") or []
    return "DRAIN" in state and "UNDRAIN" not in state


def is_busy(node: Json) -> bool:
    return bool(BUSY_STATES.intersection(node.get("state") or [])) or bool(node.get("alloc_cpus"))


def drain_is_ours(reason: str | None) -> bool:
    """Our prefix, or no reason at all: the only drains the bridge may lift."""
    text = (reason or "").strip()
    return not text or text.startswith(keys.DRAIN_REASON_PREFIX.strip())


def gpu_count(gres: str | None) -> int:
    """GPUs in a Slurm gres string: "gpu:2", "gpu:a100:2(S:0-1)", "gpu:1,gpu:h100:2"."""
    total = 0
    for entry in (gres or "").split(","):
        parts = entry.split("(", 1)[0].strip().split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


# -- what a labelled node asks for -------------------------------------------


Problem = tuple[str, str]  # (event reason, message)


def _quantity(allocatable: Mapping[str, Any], name: str, problems: list[Problem]) -> Fraction | None:
    raw = allocatable.get(name)
    if raw is None:
        return None
    try:
        return parse_quantity(str(raw))
    except QuantityError as error:
        problems.append((REGISTRATION_FAILED, f"allocatable {name}: {error}"))
        return None


def _whole(allocatable: Mapping[str, Any], name: str, unit: int, problems: list[Problem]) -> int:
    """A required allocatable resource in whole `unit`s (rounded down: never promise more)."""
    if name not in allocatable:
        problems.append((REGISTRATION_FAILED, f"the node reports no allocatable {name}"))
        return 0
    quantity = _quantity(allocatable, name, problems)
    if quantity is None:
        return 0
    whole = math.floor(quantity / unit)
    if whole < 1:
        what = "CPU" if name == "cpu" else "MiB"
        problems.append(
            (REGISTRATION_FAILED, f"allocatable {name} is {allocatable[name]!r}: not one whole {what}")
        )
    return whole


def _partitions(kube: Json, default: str, existing: Collection[str], problems: list[Problem]) -> list[str]:
    annotation = keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS
    raw = (kube["metadata"].get("annotations") or {}).get(annotation)
    if raw is None:
        wanted = [default]
    else:
        wanted = list(dict.fromkeys(p.strip() for p in str(raw).split(",") if p.strip()))
        if not wanted:
            problems.append((REGISTRATION_FAILED, f"annotation {annotation} names no partition"))
    missing = [p for p in wanted if p not in existing]
    if missing:
        problems.append(
            (
                PARTITION_NOT_FOUND,
                f"Slurm has no partition {', '.join(missing)} (annotation {annotation}="
                f"{raw if raw is not None else default!r}); the Slurm node is not "
                "registered with these partitions",
            )
        )
    return wanted


def desired_registration(
    kube: Json, name: str, *, scheduler_name: str, default_partition: str, partitions: Collection[str]
) -> tuple[Registration | None, list[Problem]]:
    """The external Slurm node a labelled Kubernetes node asks for, or the problems that prevent it."""
    problems: list[Problem] = []
    if not _SLURM_NAME.fullmatch(name):
        problems.append((REGISTRATION_FAILED, f"{name!r} is not a usable Slurm node name"))
    features = _partitions(kube, default_partition, partitions, problems)
    status = kube.get("status") or {}
    allocatable = status.get("allocatable") or {}
    cpus = _whole(allocatable, "cpu", 1, problems)
    real_memory = _whole(allocatable, "memory", MIB, problems)
    plugin_gpus = sum(math.floor(q) for r in keys.GPU_RESOURCES if (q := _quantity(allocatable, r, problems)))
    # A DRA GPU driver publishes the same GPUs as ResourceSlices (read with the snapshot); a
    # node running both it and the device plugin has them once, not twice.
    gpus = max(plugin_gpus, int(status.get(DRA_GPUS) or 0))
    addresses = [a.get("address", "") for a in status.get("addresses") or [] if a.get("type") == "InternalIP"]
    address = _first_ip(addresses)
    if address is None:
        # The node name as NodeAddr may not resolve, which stalls slurmctld on every allocation.
        problems.append((REGISTRATION_FAILED, "the node has no InternalIP address for Slurm's NodeAddr"))
    topology = str((kube["metadata"].get("annotations") or {}).get(keys.ANNOTATION_TOPOLOGY_SPEC, "")).strip()
    if topology and not _TOPOLOGY.fullmatch(topology):
        problems.append(
            (
                REGISTRATION_FAILED,
                f"annotation {keys.ANNOTATION_TOPOLOGY_SPEC}={topology!r} is not a topology",
            )
        )
    if problems or address is None:
        return None, problems
    registration = Registration(
        name=name,
        cpus=cpus,
        real_memory=real_memory,
        gpus=gpus,
        address=address,
        features=features,
        topology=topology,
        comment=ownership_comment(scheduler_name, kube_name(kube)),
    )
    return registration, []


def _first_ip(addresses: list[str]) -> str | None:
    for address in addresses:
        try:
            return str(ipaddress.ip_address(address.strip()))
        except ValueError:
            continue
    return None


def rules_signature(node: Json) -> str:
    """What Kubernetes' node rules for pods look at: labels, taints, cordon, Ready (not heartbeats)."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    ready = [
        c.get("status")
        for c in (node.get("status") or {}).get("conditions") or []
        if c.get("type") == "Ready"
    ]
    return json.dumps(
        [meta.get("labels") or {}, spec.get("taints") or [], bool(spec.get("unschedulable")), ready],
        sort_keys=True,
    )
