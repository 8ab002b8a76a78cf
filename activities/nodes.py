"""Node sync's I/O, as Temporal activities: read both sides and plan, apply a planned batch.

Reading raises on any failure, so no plan is ever made from partial data.
Applying is idempotent (a retried batch changes nothing twice) and re-checks
Slurm right before every drain, undrain and delete, so a plan made a moment
ago can never lift a drain an administrator set since, or delete a node that
is not an external node of ours.
"""

import contextlib
import hashlib
import socket
from typing import Any

from temporalio import activity

from activities.kube import now
from activities.node_source import unbound_bridge_pods
from bridge import hostlist, keys
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses
from bridge.dra import RESOURCE_GROUP, dra_gpu_counts
from bridge.node_actions import (
    DEFAULT_INSTALLATION,
    DELETED,
    DRAINED,
    REGISTERED,
    REJECTED,
    UNDRAINED,
    UPDATED,
    AddTaint,
    ApplyReport,
    CreateSlurmNode,
    DeleteSlurmNode,
    DrainSlurmNode,
    NodeAction,
    NodeActions,
    NodeSnapshot,
    NodeSyncPlan,
    NodeSyncRequest,
    RemoveTaint,
    ReportEvent,
    UndrainSlurmNode,
    UpdateSlurmNode,
    owned_by,
)
from bridge.node_facts import (
    NO_EXECUTE,
    drain_is_ours,
    is_busy,
    is_drained,
    is_external,
    kube_node_view,
    slurm_node_view,
)
from bridge.node_sync import most_urgent, plan
from bridge.pod_events import job_id_label
from bridge.slurm_api import JobDescMsg, UpdateNodeMsg
from clients.kube_client import (
    MERGE_PATCH,
    Json,
    KubeClient,
    KubeConflict,
    KubeError,
    KubeNotFound,
    api_path,
)
from clients.slurm_client import SlurmClient
from clients.slurm_errors import ESLURM_NODES_BUSY, SlurmNotFound, SlurmRejected

# Temporal's activity logger: each line carries the workflow and activity ids.
log = activity.logger

EVENT_NAMESPACE = "default"  # where Events about cluster-scoped objects live
TAINT_ATTEMPTS = 5
# slurmctld's answer when a node of that name exists already.
ESLURM_NODE_ALREADY_EXISTS = 2168


class Skip(Exception):
    """Nothing to do for this action any more; the message says why."""


class Wait(Skip):
    """Not yet (a job still runs there): this node's later actions wait for another run too."""


class NodeActivities:
    def __init__(
        self,
        kube: KubeClient,
        slurm: SlurmClient,
        *,
        scheduler_name: str,
        installation: str = DEFAULT_INSTALLATION,
        honoured: DeviceClasses = DEFAULT_DEVICE_CLASSES,
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        self.scheduler_name = scheduler_name
        self.installation = installation
        # DRA_DEVICE_CLASSES: the devices of the classes Slurm counts as `gpu` are a node's GPUs.
        self.gpu_drivers = honoured.gpu_drivers()
        self.instance = socket.gethostname()

    # -- reading -------------------------------------------------------------

    @activity.defn(name="plan_node_sync")
    async def plan_node_sync(self, request: NodeSyncRequest) -> NodeSyncPlan:
        """Read both sides and plan; the plan's most urgent `max_actions` for this run.

        Planned here rather than in the workflow: both sides in full are about 0.4 KiB a node
        each, above Temporal's payload limit (2 MB) from a few thousand nodes, while the plan
        is as large as the changes and bounded by `max_actions`."""
        snapshot = await self.read_snapshot()
        actions = plan(
            snapshot,
            scheduler_name=request.scheduler_name,
            default_partition=request.default_partition,
            installation=request.installation,
        )
        chosen, deferred = most_urgent(actions, request.max_actions)
        if deferred:
            log.info("node sync: %d actions planned, %d left for the next run", len(actions), deferred)
        return NodeSyncPlan(
            kube_nodes=len(snapshot.kube_nodes),
            slurm_nodes=len(snapshot.slurm_nodes),
            actions=chosen,
            deferred=deferred,
        )

    async def read_snapshot(self) -> NodeSnapshot:
        """Both sides in full, or an exception: a partial read must never become a plan."""
        listed = await self.kube.request("GET", api_path("nodes"))
        dra_gpus = await self._dra_gpus()
        slurm_nodes = await self.slurm.list_nodes()
        partitions = await self.slurm.list_partitions()
        views = [
            kube_node_view(node, dra_gpus=dra_gpus.get((node.get("metadata") or {}).get("name", ""), 0))
            for node in listed.get("items") or []
        ]
        return NodeSnapshot(
            kube_nodes=views,
            slurm_nodes=[slurm_node_view(node.model_dump(mode="json")) for node in slurm_nodes],
            partitions=sorted(p.name for p in partitions if p.name),
        )

    async def _dra_gpus(self) -> dict[str, int]:
        """GPUs a DRA driver of an honoured GPU class publishes per node (ResourceSlices)."""
        try:
            listed = await self.kube.request("GET", api_path("resourceslices", group=RESOURCE_GROUP))
        except KubeNotFound:
            # A collection that is served is never 404 (an empty one is a 200 with no items):
            # resource.k8s.io/v1 is not served (before Kubernetes 1.34 the API server answers
            # a text "404 page not found"), so no DRA devices. Any other read's 404 stays an error.
            return {}
        return dra_gpu_counts(listed.get("items") or [], self.gpu_drivers)

    # -- applying ------------------------------------------------------------

    @activity.defn(name="apply_node_actions")
    async def apply_node_actions(self, batch: NodeActions) -> ApplyReport:
        """Apply in order. A final refusal is reported on the node and skips that node's later
        actions; anything transient (Slurm or Kubernetes unreachable) raises, and the retried
        batch finds the actions already done."""
        report = ApplyReport()
        refused: set[str] = set()
        for action in batch.actions:
            what = action.describe()
            if action.subject in refused:
                report.skipped.append(f"{what}: an earlier action on this node did not complete")
                continue
            try:
                await self._apply(action)
            except Wait as wait:
                refused.add(action.subject)
                report.skipped.append(f"{what}: {wait}")
            except Skip as skip:
                report.skipped.append(f"{what}: {skip}")
            except (SlurmRejected, SlurmNotFound) as error:
                refused.add(action.subject)
                report.failed.append(f"{what}: {error}")
                log.warning("node sync: %s: Slurm refused: %s", what, error)
                await self._event(action, REJECTED, f"Slurm refused to {what}: {error.message}", warning=True)
            else:
                report.applied.append(what)
                log.info("node sync: %s", what)
        return report

    async def _apply(self, action: NodeAction) -> None:
        match action:
            case AddTaint() | RemoveTaint():
                await self._edit_taint(action)
            case CreateSlurmNode():
                await self._create(action)
            case UpdateSlurmNode():
                await self._update(action)
            case DrainSlurmNode():
                await self._drain(action)
            case UndrainSlurmNode():
                await self._undrain(action)
            case DeleteSlurmNode():
                await self._delete(action)
            case ReportEvent():
                await self._event(action, action.reason, action.message, warning=action.warning)

    # -- Kubernetes: taints ----------------------------------------------------

    async def _edit_taint(self, action: AddTaint | RemoveTaint) -> None:
        assert action.kube_node is not None
        add = isinstance(action, AddTaint)
        ours = {"key": keys.TAINT_MANAGED_NODE, "value": self.scheduler_name, "effect": NO_EXECUTE}
        path = api_path("nodes", name=action.kube_node)
        for _ in range(TAINT_ATTEMPTS):
            try:
                node = await self.kube.request("GET", path)
            except KubeNotFound:
                raise Skip("the Kubernetes node is gone") from None
            taints: list[Json] = list((node.get("spec") or {}).get("taints") or [])
            kept = [t for t in taints if not _same_taint(t, ours)]
            wanted = [*kept, ours] if add else kept
            if len(wanted) == len(taints):
                raise Skip("already so")
            # resourceVersion makes this a compare-and-swap: the list is replaced whole
            # (merge patch), so a concurrent edit by anyone else must make us re-read.
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": wanted},
            }
            try:
                await self.kube.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
            except KubeConflict:
                continue
            except KubeNotFound:
                raise Skip("the Kubernetes node is gone") from None
            return
        raise KubeConflict(409, "Conflict", f"node {action.kube_node} kept changing; taint edit retried")

    # -- Slurm -----------------------------------------------------------------

    async def _current(self, name: str) -> Json:
        node = await self.slurm.get_node(name)
        if node is None:
            raise Skip("Slurm has no such node")
        return slurm_node_view(node.model_dump(mode="json"))

    async def _create(self, action: CreateSlurmNode) -> None:
        registration = action.registration
        if await self.slurm.get_node(action.slurm_node) is not None:
            raise Skip("Slurm has this node already")
        try:
            await self.slurm.create_node(registration.node_conf())
        except SlurmRejected as error:
            if ESLURM_NODE_ALREADY_EXISTS not in error.error_numbers:
                raise
        # node_conf has no Comment, and a Slurm without GresTypes=gpu drops Gres there
        # while it keeps it on update: both are set right after.
        gres = registration.gres or None
        await self.slurm.update_node(
            action.slurm_node, UpdateNodeMsg(comment=registration.comment, gres=gres)
        )
        message = f"registered as external Slurm node {action.slurm_node}: {registration.summary()}"
        await self._event(action, REGISTERED, message, warning=False)

    async def _update(self, action: UpdateSlurmNode) -> None:
        changes = action.changes()
        update = UpdateNodeMsg(
            topology_str=action.topology,
            address=[action.address] if action.address is not None else None,
            gres=action.gres,
            comment=action.comment,
        )
        try:
            await self.slurm.update_node(action.slurm_node, update)
        except SlurmNotFound:
            raise Skip("Slurm has no such node") from None
        if set(changes) - {"comment"}:
            shown = ", ".join(f"{k}={v!r}" for k, v in changes.items() if k != "comment")
            await self._event(
                action, UPDATED, f"Slurm node {action.slurm_node} updated: {shown}", warning=False
            )

    async def _drain(self, action: DrainSlurmNode) -> None:
        current = await self._current(action.slurm_node)
        if is_drained(current):
            if not drain_is_ours(current.get("reason")):
                raise Skip(f"drained by someone else ({current.get('reason')!r}); left alone")
            if current.get("reason") == action.reason:
                raise Skip("already drained")
        await self._update_state(action.slurm_node, UpdateNodeMsg(state=["DRAIN"], reason=action.reason))
        await self._event(
            action, DRAINED, f"Slurm node {action.slurm_node} drained: {action.reason}", warning=False
        )

    async def _undrain(self, action: UndrainSlurmNode) -> None:
        current = await self._current(action.slurm_node)
        if not is_drained(current):
            raise Skip("not drained")
        if not drain_is_ours(current.get("reason")):
            raise Skip(f"drained by someone else ({current.get('reason')!r}); left alone")
        await self._update_state(action.slurm_node, UpdateNodeMsg(state=["UNDRAIN"]))
        await self._event(action, UNDRAINED, f"Slurm node {action.slurm_node} undrained", warning=False)

    async def _update_state(self, name: str, update: UpdateNodeMsg) -> None:
        try:
            await self.slurm.update_node(name, update)
        except SlurmNotFound:
            raise Skip("Slurm has no such node") from None

    async def _delete(self, action: DeleteSlurmNode) -> None:
        current = await self._current(action.slurm_node)
        # Checked again here, against Slurm's answer of this instant: only an
        # external node of ours with no job is ever deleted (and slurmctld checks the job too).
        if not is_external(current):
            raise Wait("not an external node; never deleted")
        if not owned_by(current.get("comment"), self.scheduler_name, self.installation):
            raise Wait("not registered by this bridge; never deleted")
        if is_busy(current):
            raise Wait("a job still runs there; deleted once it ends")
        if is_drained(current):
            await self._release_exclusions(action.slurm_node)
        try:
            await self.slurm.delete_node(action.slurm_node)
        except SlurmNotFound:
            raise Skip("Slurm has no such node") from None
        except SlurmRejected as error:
            if ESLURM_NODES_BUSY in error.error_numbers:
                raise Wait("a job still runs there; deleted once it ends") from None
            raise
        await self._event(
            action, DELETED, f"Slurm node {action.slurm_node} deleted: {action.why}", warning=False
        )

    async def _release_exclusions(self, slurm_node: str) -> None:
        """Pending jobs of the bridge's pods stop naming the node before Slurm forgets it.

        slurmctld refuses any update of a job whose excluded nodes name a node it no longer has,
        and on restart drops such a job (Slinky slurm-bridge #43), so the name must go first.
        The node is drained: lifting its exclusion lets no job start there.
        """
        job_ids = {job_id_label(pod) for pod in await unbound_bridge_pods(self.kube, self.scheduler_name)}
        for job_id in sorted(j for j in job_ids if j is not None):
            try:
                # A heterogeneous job's components each have their own exclusions.
                components = await self.slurm.get_job_components(job_id)
            except SlurmNotFound:
                continue
            for job in components:
                excluded = hostlist.expand(job.excluded_nodes or "")
                if "PENDING" not in (job.job_state or []) or slurm_node not in excluded:
                    continue
                rest = [name for name in excluded if name != slurm_node]
                # An empty list counts as unnamed in an update: [""] is what clears it.
                await self.slurm.update_job(
                    int(job.job_id or job_id),
                    JobDescMsg(excluded_nodes=[hostlist.compress(rest)] if rest else [""]),
                )

    # -- Kubernetes: events ----------------------------------------------------

    async def _event(self, action: NodeAction, reason: str, message: str, *, warning: bool) -> None:
        """Best effort, one Event per distinct message and node (its count grows on repeats)."""
        if action.kube_node is None:
            return
        digest = hashlib.sha256(f"{reason}\n{message}".encode()).hexdigest()[:16]
        name = f"{action.kube_node[:200]}.{digest}"
        try:
            await self._post_event(name, action, reason, message, warning)
        except KubeError as error:
            log.warning("node sync: event %s on node %s not recorded: %s", reason, action.kube_node, error)

    async def _post_event(
        self, name: str, action: NodeAction, reason: str, message: str, warning: bool
    ) -> None:
        stamp = now()
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": EVENT_NAMESPACE},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": action.kube_node,
                "uid": action.kube_uid or action.kube_node,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.scheduler_name},
            "reportingComponent": self.scheduler_name,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        path = api_path("events", namespace=EVENT_NAMESPACE)
        try:
            await self.kube.request("POST", path, body=event)
            return
        except KubeConflict:
            pass  # the same event again: count it on the existing one
        # The worker may create and patch Events, not read them: the first patch's answer
        # is the event, whose count the second one raises (compare-and-swap on its version).
        path = api_path("events", namespace=EVENT_NAMESPACE, name=name)
        seen = await self.kube.request("PATCH", path, body={"lastTimestamp": stamp}, content_type=MERGE_PATCH)
        count = int(seen.get("count") or 1) + 1
        patch = {"metadata": {"resourceVersion": seen["metadata"]["resourceVersion"]}, "count": count}
        with contextlib.suppress(KubeConflict):  # changed meanwhile: the count is a courtesy
            await self.kube.request("PATCH", path, body=patch, content_type=MERGE_PATCH)


def _same_taint(taint: Json, ours: Json) -> bool:
    return all(taint.get(k) == v for k, v in ours.items())
