"""Messages between the watchers, the workflows and the activities.

Small pydantic models only (they cross the Temporal data converter and end up
in workflow histories, so they stay compact and never carry secrets).

Its size (about 430 lines) is the set of messages itself: one place to look up what
crosses the data converter.
"""

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bridge import hostlist
from bridge.failures import SLURM_UNAVAILABLE


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class PodRef(Frozen):
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        """`namespace/name`, the form used in the job's admin_comment."""
        return f"{self.namespace}/{self.name}"


class NoValNumber(Frozen):
    """Slurm's optional number: {set, infinite, number}."""

    set: bool = True
    infinite: bool = False
    number: int = 0


class JobDescription(BaseModel):
    """The job_desc_msg the bridge submits, with Slurm REST v0.0.44 field names.

    Only fields the bridge sets; `to_slurm()` drops the unset ones, so the JSON
    is exactly what goes over the wire (and what `explain` prints).
    """

    name: str
    flags: list[str]
    admin_comment: str
    partition: str
    nodes: str
    minimum_nodes: int
    maximum_nodes: int
    tasks_per_node: int = 1
    cpus_per_task: int | None = None
    memory_per_node: NoValNumber | None = None
    tres_per_node: str | None = None
    shared: list[str] = Field(default_factory=list)
    mcs_label: str | None = None
    current_working_directory: str = "/tmp"
    account: str | None = None
    constraints: str | None = None
    group_id: str | None = None
    user_id: str | None = None
    licenses: str | None = None
    priority: NoValNumber | None = None
    qos: str | None = None
    reservation: str | None = None
    time_limit: NoValNumber | None = None
    wckey: str | None = None
    excluded_nodes: list[str] | None = None
    # The placement workflow's id: ties the job to exactly one placement (a pod
    # re-created under the same name gets another), and lets `squeue -o %k`
    # users find the placement in the Temporal UI.
    comment: str | None = None
    # A heterogeneous job (bridge/components.py): one description per pod shape, submitted
    # together as components 0, 1, ... of one Slurm job. Then this description stands for
    # the whole group (its admin_comment lists every pod, in component order), and each
    # component lists its own pods: Slurm keeps comments per component.
    components: list["JobDescription"] = Field(default_factory=list)

    def to_slurm(self) -> dict[str, object]:
        """One job_desc_msg: this job's, or for a heterogeneous job the first component's."""
        if self.components:
            return self.components[0].to_slurm()
        body = self.model_dump(exclude_none=True, exclude={"components"})
        if self.excluded_nodes:
            # One hostlist expression, as Slurm writes them (`k8s-[001-312,314-999]`): a pod
            # pinned to one of 1,000 numbered nodes sends two ranges, not 999 names. Slurm
            # takes it as given and honours it (checked on slurmctld 26.05, submit and update).
            body["excluded_nodes"] = [hostlist.compress(self.excluded_nodes)]
        return body

    def submission(self) -> dict[str, object]:
        """The body of `POST /job/submit`: `{"job": ...}`, or `{"jobs": [...]}` for components."""
        if self.components:
            return {"jobs": [component.to_slurm() for component in self.components]}
        return {"job": self.to_slurm()}

    def with_comment(self, comment: str) -> "JobDescription":
        """The same job with this comment on it and on every component (each keeps its own)."""
        return self.model_copy(
            update={
                "comment": comment,
                "components": [c.model_copy(update={"comment": comment}) for c in self.components],
            }
        )

    @property
    def pod_keys(self) -> list[str]:
        return list(admin_comment_pods(self.admin_comment) or [])


def admin_comment_for(pod_keys: list[str]) -> str:
    # Compact separators: byte-identical to upstream's Go json.Marshal output.
    return json.dumps({"pods": pod_keys}, separators=(",", ":"))


def admin_comment_pods(admin_comment: str | None) -> list[str] | None:
    """Pod keys of a bridge job, or None for a job that is not ours.

    Stricter than upstream on purpose: any JSON object counted as a bridge job
    there, so a foreign job with a JSON admin_comment could be cancelled.
    """
    if not admin_comment:
        return None
    try:
        decoded = json.loads(admin_comment)
    except ValueError:
        return None
    if not isinstance(decoded, dict) or set(decoded) != {"pods"}:
        return None
    pods = decoded["pods"]
    if not isinstance(pods, list) or not pods or not all(isinstance(p, str) and "/" in p for p in pods):
        return None
    return pods


PLACEMENT_ID_PREFIX = "placement/"
GENERATION_SEPARATOR = "@"


def workflow_id_of(placement_id: str) -> str:
    """The placement workflow's id: the placement id (a job's comment) without `@<generation>`.

    `placement/<installation>/<group key>@<generation>` → `placement/<installation>/<group key>`
    (docs/architecture.md, "Placement ids"); ValueError for any other string.
    """
    installation_of(placement_id)
    return placement_id.rpartition(GENERATION_SEPARATOR)[0]


def installation_of(placement_id: str) -> str:
    """The bridge installation a placement id names.

    ValueError for a string that is not a placement id, and for a `placement/` id
    without `<installation>/<group key>` or `@<generation>` (malformed).
    """
    if not placement_id.startswith(PLACEMENT_ID_PREFIX):
        raise ValueError(f"not a placement id: {placement_id!r}")
    head, separator, generation = placement_id[len(PLACEMENT_ID_PREFIX) :].rpartition(GENERATION_SEPARATOR)
    installation, slash, group_key = head.partition("/")
    if not (separator and installation and slash and group_key and generation):
        raise ValueError(f"malformed placement id: {placement_id!r}")
    return installation


class PlacementRequest(Frozen):
    """Input of a placement workflow: the pods it places (one, for a bare pod).

    Group members that appear later join by signal; the job is submitted once
    `min_pods` members exist.
    """

    group: str  # human-readable identity: "ns/pod" for a bare pod, the group's name otherwise
    namespace: str
    pods: list[PodRef]
    kind: str = "Pod"  # Pod, Job, JobSet, LeaderWorkerSet, PodGroup
    min_pods: int = 1
    # The bridge installation that placed the pods (docs/architecture.md, "Placement ids").
    installation: str = ""
    generation: str = ""  # uid of the pod that opened this generation; default: the first pod's
    # An operator retry or an adoption: a job of this placement may exist, look before submitting.
    recovery: bool = False
    # Seconds a bound pod being deleted may take beyond its grace period before its job is released.
    deletion_slack_seconds: float = 60.0
    # How long a PodDisruptionBudget may block the eviction of pods whose job ended before they are deleted.
    eviction_patience_seconds: float = 300.0
    # How long one step (an activity and its retries) may keep failing before the pods are told
    # (PlacementStuck) and it is tried again at workflow level.
    step_bound_seconds: float = 300.0
    # A step's attempt that has not heartbeaten this long is tried again elsewhere: its worker died
    # (a worker heartbeats only for attempts that run a third of this long, worker/heartbeat.py).
    step_heartbeat_seconds: float = 15.0
    # Continue-as-new beyond this many history events (Temporal's limit is 51,200; tests go lower).
    history_events_limit: int = 2_000
    # What the starter saw of the pods (applied before run(): no start signal needed).
    events: list["PodEvent"] = Field(default_factory=list)
    # Set by continue-as-new: the placement goes on where it was.
    carry: "PlacementCarry | None" = None


class PodEvent(Frozen):
    """A change of a pod, as the pod watcher saw it."""

    pod: PodRef
    phase: str = "Pending"
    node_name: str | None = None
    deleting: bool = False  # deletionTimestamp set
    deletion_grace_seconds: int = 30
    gone: bool = False  # the object no longer exists
    resource_version: str = ""
    # The pod's slurmjob.slinky.slurm.net/* annotations, canonical JSON: a change
    # while the job is pending updates the job.
    job_annotations: str = ""
    created: str = ""  # metadata.creationTimestamp (RFC 3339), for the pod-created → bound metric

    @property
    def terminal(self) -> bool:
        return self.gone or self.phase in ("Succeeded", "Failed")


JobStateName = str
# A job in one of these states is over for good (a requeued one starts again as a new run).
ENDED_JOB_STATES = frozenset(
    {
        "CANCELLED",
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


class JobEvent(Frozen):
    """A change of a Slurm job, as the central job watcher saw it."""

    job_id: int
    states: list[JobStateName]
    reason: str = ""
    nodes: list[str] = Field(default_factory=list)  # Slurm node names, in allocation order
    gone: bool = False  # Slurm no longer knows the job
    restarts: int = 0  # Slurm's restart_cnt: a requeued job starts over (pending again)
    components: int = 1  # a heterogeneous job's components, as read (bridge/slurm_jobs.py)

    @property
    def running(self) -> bool:
        return not self.gone and "RUNNING" in self.states

    @property
    def pending(self) -> bool:
        return not self.gone and "PENDING" in self.states

    @property
    def progress(self) -> tuple[int, int]:
        """How far the job has come; a view of a job never goes back (reads and signals may cross)."""
        if self.gone:
            stage = 3
        elif ENDED_JOB_STATES.intersection(self.states):
            stage = 2
        elif self.pending or not self.states:
            stage = 0
        else:
            stage = 1  # running, or on its way out of it (completing, suspended…)
        return (self.restarts, stage)

    @property
    def summary(self) -> str:
        if self.gone:
            return "gone"
        state = "+".join(self.states) or "UNKNOWN"
        return f"{state} ({self.reason})" if self.reason and self.reason != "None" else state


# Why a job ended, as the pod's Event and condition say it (and `slurm-bridge status`).
END_REASONS = {
    "PREEMPTED": ("PreemptedBySlurm", "preempted by Slurm for higher-priority work"),
    "TIMEOUT": ("SlurmTimeLimit", "reached its Slurm time limit"),
    "DEADLINE": ("SlurmTimeLimit", "reached its Slurm deadline"),
    "CANCELLED": ("SlurmJobCancelled", "cancelled in Slurm"),
    "NODE_FAIL": ("SlurmNodeFailure", "lost its node in Slurm"),
    "BOOT_FAIL": ("SlurmNodeFailure", "could not boot its node in Slurm"),
}


def end_reason(job: JobEvent) -> tuple[str, str]:
    """(reason, words) for a job that ended while its pods ran: PreemptedBySlurm, SlurmTimeLimit, …"""
    if job.gone:
        return "SlurmJobGone", "is no longer known to Slurm"
    for state in job.states:
        if state in END_REASONS:
            return END_REASONS[state]
    return "SlurmJobEnded", f"ended in Slurm ({job.summary})"


class SubmitResult(Frozen):
    job_id: int
    created: bool  # False: an existing job for these pods was adopted


Phase = Literal[
    "Translating", "Unschedulable", "Submitted", "Pending", "Running", "Bound", "Cleaning", "Done", "Failed"
]


class PhaseChange(Frozen):
    phase: Phase
    at: str  # ISO timestamp (workflow time)
    detail: str = ""


class PlacementState(BaseModel):
    """What the `state` query returns: where a placement is and how it got there."""

    group: str
    pods: list[str] = Field(default_factory=list)  # members, "ns/name"
    phase: Phase = "Translating"
    job_id: int | None = None
    # A heterogeneous job's Slurm job ids, leader first (its components: job_id + offset); [] else.
    job_components: list[int] = Field(default_factory=list)
    job_state: str = ""
    pending_reason: str = ""
    nodes: list[str] = Field(default_factory=list)  # Slurm node names, as allocated
    kube_nodes: list[str] = Field(default_factory=list)  # the Kubernetes nodes the pods are bound to
    claims: list[str] = Field(default_factory=list)  # ResourceClaims pinning Slurm's devices, "ns/name"
    failure: str = ""
    end_reason: str = ""  # why the job ended under running pods (PreemptedBySlurm, SlurmTimeLimit, …)
    slurm_unavailable: str = ""  # while a step waits for Slurm (away, or taking no new job): why
    history: list[PhaseChange] = Field(default_factory=list)


# -- placement v2: what the three folded activities take and give -------------


class PrepareInput(Frozen):
    request: PlacementRequest  # pods: the live members, any order
    placement_id: str  # the Slurm job's comment
    since: int  # Unix seconds before which this placement cannot have submitted anything
    recovery: bool  # look for an existing job of this placement before submitting
    reported: str = ""  # the unschedulable verdict the pods were last told (not told again)


class Prepared(Frozen):
    """What prepare_and_submit did: the job, or why there is nothing to submit."""

    submitted: bool
    pods: list[PodRef]  # the members in the job's order (pod i takes allocated node i)
    job_id: int = 0
    partition: str = ""
    created: bool = True  # False: an existing job of this placement was adopted
    components: int = 1  # a heterogeneous job's components
    job: JobEvent | None = None  # the job as read right after submission
    annotations: dict[str, str] = Field(default_factory=dict)  # uid → job annotations translated
    detail: str = ""  # why nothing was submitted
    # No bridge node passes the pods' node rules (kube-scheduler's words): nothing submitted;
    # the pods keep their claim and wait for the nodes to change.
    unschedulable: str = ""


class BindInput(Frozen):
    pods: list[PodRef]
    job_id: int
    scheduler_name: str = ""
    # Bind even though pods of an ended bridge job still terminate on the nodes (waited long enough).
    force: bool = False
    # The placement whose job this must be (its comment); "" (placements before it): not checked.
    placement_id: str = ""


class BindResult(Frozen):
    job: JobEvent  # read afresh before binding
    slurm_nodes: list[str] = Field(default_factory=list)  # allocated, one per pod; empty: not bound
    nodes: list[str] = Field(default_factory=list)  # Kubernetes nodes, pod i on nodes[i]
    # Not bound yet: pods of an ended bridge job still terminate on the allocated nodes.
    waiting_for: list[str] = Field(default_factory=list)  # "ns/name"
    grace_seconds: float = 0.0  # the longest grace period among them
    claims: list[str] = Field(default_factory=list)  # ResourceClaims written for DRA pods, "ns/name"


class ReleaseInput(Frozen):
    """Give back what a placement holds, telling the pods why."""

    pods: list[PodRef]
    reason: str  # Event (and condition) reason
    message: str
    job_id: int | None = None
    cancel_job: bool = False
    remove_pods: bool = False  # the job ended: the pods must go
    warning: bool = False
    condition: bool = False  # also PodScheduled=False with reason and message (a failed placement)
    # With remove_pods: delete instead of evict (a PodDisruptionBudget blocked eviction for too long).
    force_delete: bool = False
    # The ResourceClaims the placement's bind wrote ("ns/name"); [] (no DRA pod, or not bound):
    # none is looked for, which spares the release a listing of the namespace's claims.
    claims: list[str] = Field(default_factory=list)


# -- the placement's smaller steps, and node sync's read: one input each ------------------
# A single model per activity, so that a field can be added later with a default.


class ReportPendingInput(Frozen):
    """Why the pods wait: PodScheduled=False and an Event (report_pending)."""

    pods: list[PodRef]
    job_id: int
    reason: str  # Slurm's pending reason, or the bridge's own (WaitingForNode) with a message
    message: str = ""  # "": Slurm's reason, told as "Slurm job <id> is pending: <reason>"


class UpdatePendingJobInput(Frozen):
    """The pods' annotations or the usable nodes changed while the job is pending (update_pending_job)."""

    request: PlacementRequest  # pods: today's members
    job_id: int


class CheckJobInput(Frozen):
    """The safety re-check's read of the job (check_job)."""

    job_id: int


class SlurmUnavailableInput(Frozen):
    """Why the pods wait on Slurm (report_slurm_unavailable): it is away, or takes no new job."""

    pods: list[PodRef]
    message: str
    condition: bool  # also PodScheduled=False (pods not bound yet)
    reason: str = SLURM_UNAVAILABLE  # the Event's and the condition's reason (or SLURM_BUSY)


class TellPodsInput(Frozen):
    """An Event on each pod, and nothing else (tell_pods)."""

    pods: list[PodRef]
    reason: str
    message: str
    warning: bool = False


class PlacementCarry(BaseModel):
    """A placement's state across continue-as-new (same workflow id, same generation)."""

    state: PlacementState
    members: list[PodRef]
    pods: list[PodEvent]
    submitted: bool = True  # False: continued while no node fitted; the new run prepares again
    job: JobEvent | None = None
    translated_annotations: dict[str, str] = Field(default_factory=dict)
    recheck_seconds: float = 600.0
    slurm_nodes: list[str] = Field(default_factory=list)
    newcomers: list[PodRef] = Field(default_factory=list)


PlacementRequest.model_rebuild()
