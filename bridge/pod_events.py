"""A pod as the placement workflow sees it: the few facts it acts on."""

import json
from typing import Any

from bridge import keys
from bridge.models import PLACEMENT_ID_PREFIX, PodEvent, PodRef, installation_of

Json = dict[str, Any]


def job_annotations(pod: Json) -> str:
    """The pod's slurmjob.slinky.slurm.net/* annotations as canonical JSON (compared for changes)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return json.dumps(
        {k: v for k, v in annotations.items() if k.startswith(keys.SLURMJOB_PREFIX)}, sort_keys=True
    )


def pod_event(pod: Json, *, gone: bool = False) -> PodEvent:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    grace = meta.get("deletionGracePeriodSeconds") or spec.get("terminationGracePeriodSeconds") or 30
    return PodEvent(
        pod=PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        phase=status.get("phase") or "Pending",
        node_name=spec.get("nodeName") or None,
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_grace_seconds=int(grace),
        gone=gone,
        resource_version=meta.get("resourceVersion", ""),
        created=meta.get("creationTimestamp", ""),
        job_annotations=job_annotations(pod),
    )


def job_id_label(pod: Json) -> int | None:
    """The Slurm job id the pod's label names, if it is a number."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(keys.LABEL_SLURM_JOB_ID)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def claim_of(pod: Json) -> str | None:
    """The placement id that claimed the pod, if the annotation is well-formed and names its namespace."""
    meta = pod["metadata"]
    claim = (meta.get("annotations") or {}).get(keys.ANNOTATION_PLACEMENT)
    if not isinstance(claim, str):
        return None
    try:
        installation = installation_of(claim)
    except ValueError:
        return None
    # placement/<installation>/<namespace>/...: a pod can only ever name its own namespace's placements.
    namespace = claim[len(PLACEMENT_ID_PREFIX) + len(installation) + 1 :].split("/", 1)[0]
    return claim if namespace == meta.get("namespace") else None


def het_offset_label(pod: Json) -> int:
    """The heterogeneous job component the pod belongs to, from its label (0 without one)."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(keys.LABEL_HET_JOB_OFFSET)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0
