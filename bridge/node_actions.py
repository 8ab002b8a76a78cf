"""Messages of node sync: the snapshot it reads, the actions it plans, what it reports.

Small pydantic models. The plan and the reports cross the Temporal data converter and are
what the Temporal UI shows for each run (what the bridge decided, what it did); the snapshot
stays inside the planning activity, since both sides in full outgrow Temporal's payload limit
at a few thousand nodes.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from bridge import keys
from bridge.models import Frozen

Json = dict[str, Any]

# Event reasons on Kubernetes Nodes (`kubectl describe node` / `kubectl get events`).
PARTITION_NOT_FOUND = "SlurmPartitionNotFound"
REGISTRATION_FAILED = "SlurmNodeRegistrationFailed"
REGISTRATION_DEFERRED = "SlurmNodeRegistrationDeferred"
REREGISTRATION_BLOCKED = "SlurmNodeReregistrationBlocked"
NOT_EXTERNAL = "SlurmNodeNotExternal"
SLURMD_NODE = "SlurmNodeRunsSlurmd"
NAME_CONFLICT = "SlurmNodeNameConflict"
TAINT_CONFLICT = "SlurmNodeTaintConflict"
REGISTERED = "SlurmNodeRegistered"
UPDATED = "SlurmNodeUpdated"
DRAINED = "SlurmNodeDrained"
UNDRAINED = "SlurmNodeUndrained"
DELETED = "SlurmNodeDeleted"
REJECTED = "SlurmNodeRejected"

MANAGED_BY = "slurm-bridge"


DEFAULT_INSTALLATION = keys.DEFAULT_INSTALLATION
# Actions one run applies at most; the rest wait for the next run. Keeps a run's plan (about
# 0.4 KiB an action) below Temporal's 512 KB payload warning, and a run to about ten seconds
# of requests (about 10 ms an action).
MAX_ACTIONS_PER_RUN = 1000


def ownership_comment(scheduler_name: str, kube_node: str, installation: str = DEFAULT_INSTALLATION) -> str:
    """The Slurm node comment that marks an external node as registered by this bridge.

    Deletion needs proof of ownership: an external node an administrator made by
    hand, or another bridge registered, must never be removed by this one. Two
    Kubernetes clusters often share one Slurm with the same (default) scheduler
    name, so the installation is part of the proof.
    """
    return json.dumps(
        {
            "managedBy": MANAGED_BY,
            "scheduler": scheduler_name,
            "installation": installation,
            "kubernetesNode": kube_node,
        },
        separators=(",", ":"),
    )


def owned_by(comment: str | None, scheduler_name: str, installation: str = DEFAULT_INSTALLATION) -> bool:
    """Registered by this bridge. A comment written before installations were recorded counts as
    ours (the node sync that finds it writes the installation into it)."""
    try:
        decoded = json.loads(comment or "")
    except ValueError:
        return False
    return (
        isinstance(decoded, dict)
        and decoded.get("managedBy") == MANAGED_BY
        and decoded.get("scheduler") == scheduler_name
        and decoded.get("installation", installation) == installation
    )


class NodeSyncRequest(Frozen):
    """Input of every scheduled run; the worker rewrites it in the Schedule at each start."""

    scheduler_name: str
    default_partition: str  # features of an external node without the partitions annotation
    installation: str = DEFAULT_INSTALLATION  # whose external nodes these are (the comment says)
    max_actions: int = Field(MAX_ACTIONS_PER_RUN, ge=1)


class NodeSnapshot(BaseModel):
    """Everything one run decides on, read in one go (trimmed to what the plan needs).

    Never an activity's result: about 0.4 KiB a node on each side.
    """

    kube_nodes: list[Json]
    slurm_nodes: list[Json]
    partitions: list[str]


class Registration(Frozen):
    """An external Slurm node as a labelled Kubernetes node asks for it."""

    name: str
    cpus: int
    real_memory: int  # MiB
    gpus: int
    address: str
    features: list[str]
    topology: str
    comment: str

    @property
    def gres(self) -> str:
        return f"gpu:{self.gpus}" if self.gpus else ""

    def node_conf(self) -> str:
        """`scontrol create`'s node line. Every value was validated to hold no spaces or `=`."""
        words = [
            f"NodeName={self.name}",
            "State=EXTERNAL",
            f"CPUs={self.cpus}",
            "Sockets=1",
            f"CoresPerSocket={self.cpus}",
            "ThreadsPerCore=1",
            f"RealMemory={self.real_memory}",
            # An unresolvable NodeAddr stalls slurmctld for seconds on every allocation.
            f"NodeAddr={self.address}",
            f"Features={','.join(self.features)}",
        ]
        if self.gres:
            words.append(f"Gres={self.gres}")
        if self.topology:
            words.append(f"Topology={self.topology}")
        return " ".join(words)

    def summary(self) -> str:
        gpus = f", {self.gpus} GPUs" if self.gpus else ""
        return (
            f"{self.cpus} CPUs, {self.real_memory} MiB{gpus}, partitions {','.join(self.features)}, "
            f"address {self.address}"
        )


class _Action(Frozen):
    """One change. `slurm_node` and `kube_node` name what it is about (either may be unknown)."""

    slurm_node: str
    kube_node: str | None = None
    kube_uid: str | None = None

    @property
    def subject(self) -> str:
        """Actions on one subject run in order; after a final failure the rest are skipped."""
        return self.kube_node or f"slurm:{self.slurm_node}"


class AddTaint(_Action):
    kind: Literal["add_taint"] = "add_taint"

    def describe(self) -> str:
        return f"taint Kubernetes node {self.kube_node}"


class RemoveTaint(_Action):
    kind: Literal["remove_taint"] = "remove_taint"

    def describe(self) -> str:
        return f"untaint Kubernetes node {self.kube_node}"


class CreateSlurmNode(_Action):
    kind: Literal["create_slurm_node"] = "create_slurm_node"
    registration: Registration

    def describe(self) -> str:
        return f"register Slurm node {self.slurm_node} ({self.registration.summary()})"


class UpdateSlurmNode(_Action):
    """Fields Slurm can change in place; None leaves a field alone."""

    kind: Literal["update_slurm_node"] = "update_slurm_node"
    topology: str | None = None
    address: str | None = None
    gres: str | None = None
    comment: str | None = None

    def changes(self) -> dict[str, str]:
        fields = {
            "topology": self.topology,
            "address": self.address,
            "gres": self.gres,
            "comment": self.comment,
        }
        return {name: value for name, value in fields.items() if value is not None}

    def describe(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in self.changes().items())
        return f"update Slurm node {self.slurm_node} ({shown})"


class DrainSlurmNode(_Action):
    kind: Literal["drain_slurm_node"] = "drain_slurm_node"
    reason: str

    def describe(self) -> str:
        return f"drain Slurm node {self.slurm_node}: {self.reason}"


class UndrainSlurmNode(_Action):
    kind: Literal["undrain_slurm_node"] = "undrain_slurm_node"

    def describe(self) -> str:
        return f"undrain Slurm node {self.slurm_node}"


class DeleteSlurmNode(_Action):
    kind: Literal["delete_slurm_node"] = "delete_slurm_node"
    why: str

    def describe(self) -> str:
        return f"delete Slurm node {self.slurm_node} ({self.why})"


class ReportEvent(_Action):
    kind: Literal["report_event"] = "report_event"
    reason: str
    message: str
    warning: bool = True

    def describe(self) -> str:
        return f"event {self.reason} on Kubernetes node {self.kube_node}: {self.message}"


NodeAction = Annotated[
    AddTaint
    | RemoveTaint
    | CreateSlurmNode
    | UpdateSlurmNode
    | DrainSlurmNode
    | UndrainSlurmNode
    | DeleteSlurmNode
    | ReportEvent,
    Field(discriminator="kind"),
]


class NodeActions(BaseModel):
    """One batch for the apply activity."""

    actions: list[NodeAction]


class ApplyReport(BaseModel):
    applied: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)  # nothing to do any more, or waiting (busy node)
    failed: list[str] = Field(default_factory=list)  # refused for good; reported as an Event


class NodeSyncPlan(BaseModel):
    """What one run will do: the most urgent actions, and how many wait for the next run."""

    kube_nodes: int
    slurm_nodes: int
    actions: list[NodeAction]
    deferred: int = 0


class NodeSyncResult(ApplyReport):
    kube_nodes: int = 0
    slurm_nodes: int = 0
    planned: list[str] = Field(default_factory=list)
    deferred: int = 0  # actions planned beyond the run's limit, left for the next run

    def add(self, report: ApplyReport) -> None:
        self.applied += report.applied
        self.skipped += report.skipped
        self.failed += report.failed
