"""Every well-known name the bridge reads or writes, in one place.

The strings are the ones Slinky's slurm-bridge uses, unchanged, so manifests,
Kyverno policies and `squeue`/`scontrol` habits written for it keep working.
"""

from typing import Final

DEFAULT_SCHEDULER_NAME: Final = "slurm-bridge-scheduler"
DEFAULT_PARTITION: Final = "slurm-bridge"
# The installation a bridge is when INSTALLATION_ID is not set: in placement ids, job comments
# and the ownership comment of the external nodes it registers.
DEFAULT_INSTALLATION: Final = "slurm-bridge"
DEFAULT_MCS_LABEL: Final = "kubernetes"

SCHEDULER_PREFIX: Final = "scheduler.slinky.slurm.net/"
SLURMJOB_PREFIX: Final = "slurmjob.slinky.slurm.net/"

# Pod label with the Slurm job id; the same value on every pod of one job.
LABEL_SLURM_JOB_ID: Final = SCHEDULER_PREFIX + "slurm-jobid"
# Pod annotation with the Kubernetes node picked from the Slurm allocation.
ANNOTATION_SLURM_NODE: Final = "slinky.slurm.net/slurm-node"
# Added before a job is submitted, removed once the job is gone: a pod cannot
# disappear while a Slurm job still holds resources for it.
FINALIZER: Final = SCHEDULER_PREFIX + "finalizer"

# Node side.
TAINT_MANAGED_NODE: Final = "slinky.slurm.net/managed-node"
LABEL_SLURM_NODE_NAME: Final = "slinky.slurm.net/slurm-nodename"
LABEL_EXTERNAL_NODE: Final = SCHEDULER_PREFIX + "external-node"
# The same request under the name upstream's docs use; either label (any value) registers the node.
LABEL_EXTERNAL_NODE_ALIAS: Final = SCHEDULER_PREFIX + "slurm-bridge-external-node"
LABELS_EXTERNAL_NODE: Final = (LABEL_EXTERNAL_NODE, LABEL_EXTERNAL_NODE_ALIAS)
ANNOTATION_EXTERNAL_NODE_PARTITIONS: Final = SCHEDULER_PREFIX + "external-node-partitions"
ANNOTATION_TOPOLOGY_SPEC: Final = "topology.slinky.slurm.net/spec"

# Extended resources that become `gres/gpu=N`.
GPU_RESOURCES: Final = ("nvidia.com/gpu", "amd.com/gpu")
DRA_RESOURCE_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
# The CPU DRA driver's class. Which classes the bridge honours, and what each becomes in
# Slurm, is the operator's (DRA_DEVICE_CLASSES, bridge/device_classes.py).
DRA_CPU_CLASS: Final = "dra.cpu"

# The pod condition the bridge writes while a pod waits for (or fails) placement,
# the one kube-scheduler writes too, so `kubectl describe` shows it where users look.
CONDITION_POD_SCHEDULED: Final = "PodScheduled"
# Bridge-owned pod condition: why the pod's Slurm job ended (PreemptedBySlurm, SlurmTimeLimit, …).
# Its own type, because an eviction overwrites DisruptionTarget with EvictionByEvictionAPI.
CONDITION_SLURM_JOB_ENDED: Final = "SlurmJobEnded"

# Slurm job flag that makes a placeholder job no slurmd ever launches.
EXTERNAL_JOB_FLAG: Final = "EXTERNAL_JOB"
# Prefix of every drain reason the bridge sets; a drain without it is an admin's.
DRAIN_REASON_PREFIX: Final = "slurm-bridge: "

# The Temporal workflow type of a placement, named like its class (workflows/placement.py):
# one type (docs/architecture.md, "Workflow versioning"), and the visibility query clause
# that matches it.
PLACEMENT_WORKFLOW_TYPE: Final = "PlacementWorkflow"
PLACEMENT_TYPE_CLAUSE: Final = f"WorkflowType = '{PLACEMENT_WORKFLOW_TYPE}'"

# Bridge-owned (not a Slinky key): the placement id (docs/architecture.md) that
# claimed the pod, written with the finalizer. The pod watcher signals only that
# placement and never starts another for a claimed pod.
ANNOTATION_PLACEMENT: Final = "slurm-bridge/placement"
# How a group whose pods differ is sized: "per-pod" (a heterogeneous job, one component per
# pod shape) or "largest-pod" (one job, every node sized by the largest pod). On the workload
# (or a pod placed alone); the worker's HETEROGENEOUS_JOBS setting is the default.
ANNOTATION_SIZING: Final = "slurm-bridge/sizing"
# On each pod of a heterogeneous job: the component it belongs to (its job id is the leader's).
LABEL_HET_JOB_OFFSET: Final = SCHEDULER_PREFIX + "slurm-het-job-offset"

# Bridge-owned: the leader's report of its watchers' health, written on its
# Lease with every renewal and read by `slurm-bridge status` / `list`.
ANNOTATION_WATCHER_HEALTH: Final = "slurm-bridge/watchers"
