"""Keep pending jobs' `excluded_nodes` in step with the nodes' labels, taints and cordons.

A pending job was submitted with the nodes its pods could not run on excluded.
When nodes change (a label, a taint, a cordon), the set can change under it:
after each burst of node changes (the node watcher coalesces them) this looks
at the bridge's submitted-but-unbound pods, recomputes each job's exclusions
with Kubernetes' rules and tells only the placements whose set changed
(`nodes_changed`); the placement updates its job in an activity. So a node
change costs one pod listing and a signal only where something is to be done.
Each distinct set of pod node rules is checked against the nodes once per pass
(`ExclusionsByRules`), and a pending job is read from Slurm only when what its
pods ask for differs from what Slurm had when the job was last read: a burst
that concerns none of 5,000 pending jobs reads none of them. A node Kubernetes deleted stays excluded while
Slurm still has it (`with_departed_nodes`: one node listing a pass when there is one);
node sync lifts that exclusion once it has drained the node, before deleting it.
"""

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.node_source import (
    SlurmNodeNames,
    list_bridge_nodes,
    unbound_bridge_pods,
    unsubmitted_scheduler_pods,
    with_departed_nodes,
)
from bridge import hostlist
from bridge.feasibility import ExclusionsByRules, node_name
from bridge.models import installation_of, workflow_id_of
from bridge.pod_events import claim_of, het_offset_label, job_id_label
from bridge.translate import pod_key
from clients.kube_client import Json, KubeClient
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmNotFound
from workflows.placement import PlacementWorkflow

log = logging.getLogger(__name__)


class ExclusionRefresher:
    def __init__(
        self,
        kube: KubeClient,
        slurm: SlurmClient,
        temporal: Client,
        *,
        scheduler_name: str,
        installation: str,
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        self.temporal = temporal
        self.scheduler_name = scheduler_name
        self.installation = installation
        self.refreshes = 0  # passes finished: one per burst of node changes
        self.told = 0  # placements told that their job's exclusions changed
        self.job_reads = 0  # pending jobs read from Slurm to compare their exclusions
        self.rule_sets = 0  # distinct pod node-rule sets checked against the nodes, over all passes
        # Pending job → the exclusions (per component) its pods asked for when Slurm was last
        # read to have exactly those: while the pods and nodes still ask for the same, the job
        # is not read again. A burst of node changes then reads only the jobs it concerns.
        self._in_step: dict[int, tuple[frozenset[str], ...]] = {}
        self._finished = asyncio.Condition()

    async def refresh(self) -> int:
        """Tell the pending placements whose usable nodes changed; returns how many."""
        try:
            return await self._refresh()
        finally:
            async with self._finished:
                self.refreshes += 1
                self._finished.notify_all()

    async def wait_for_passes(self, count: int) -> None:
        """Until `count` passes have finished (an event for whoever must know a pass is over)."""
        async with self._finished:
            await self._finished.wait_for(lambda: self.refreshes >= count)

    async def _refresh(self) -> int:
        nodes = await list_bridge_nodes(self.kube, self.scheduler_name)
        if not nodes:
            return 0
        jobs: dict[int, list[Json]] = defaultdict(list)
        claims: dict[int, str] = {}
        for pod in await unbound_bridge_pods(self.kube, self.scheduler_name):
            claim, job_id = claim_of(pod), job_id_label(pod)
            if claim is None or job_id is None or installation_of(claim) != self.installation:
                continue
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            jobs[job_id].append(pod)
            claims[job_id] = claim
        # Jobs no pod waits for any more are forgotten: memory follows the pending pods.
        self._in_step = {job_id: wanted for job_id, wanted in self._in_step.items() if job_id in jobs}
        rules = ExclusionsByRules(nodes)
        told = 0
        in_slurm = SlurmNodeNames(self.slurm)
        for job_id, pods in jobs.items():
            # A heterogeneous job's component excludes what its own pods (by their offset label)
            # may not run on; an ordinary job what any of its pods may not.
            by_offset: dict[int, list[Json]] = {}
            for pod in pods:
                by_offset.setdefault(het_offset_label(pod) or 0, []).append(pod)
            wanted = tuple(rules.of_group(by_offset[offset]) for offset in sorted(by_offset))
            if self._in_step.get(job_id) == wanted:
                continue  # Slurm had exactly these exclusions when last read: nothing to read
            self.job_reads += 1
            try:
                components = [c.model_dump(mode="json") for c in await self.slurm.get_job_components(job_id)]
            except SlurmNotFound:
                continue
            if "PENDING" not in (components[0].get("job_state") or []):
                continue  # allocated already: the exclusions no longer matter
            if len(components) == 1:
                by_offset = {0: pods}  # every pod in the one job, whatever labels it carries
            changed = False
            for offset, job in enumerate(components):
                current = set(hostlist.expand(job.get("excluded_nodes") or ""))
                own = rules.of_group(by_offset.get(offset, []))
                excluded = await with_departed_nodes(in_slurm, sorted(own) or None, current, nodes)
                changed = changed or set(excluded or []) != current
            if not changed:
                self._in_step[job_id] = wanted  # as computed before the read: what the next pass compares
                continue
            # Told, not yet in step: read again on the next pass, until the placement's update shows.
            self._in_step.pop(job_id, None)
            try:
                await self.temporal.get_workflow_handle(workflow_id_of(claims[job_id])).signal(
                    PlacementWorkflow.nodes_changed
                )
            except RPCError as error:
                if error.status != RPCStatusCode.NOT_FOUND:
                    raise
                continue
            told += 1
        self.rule_sets += rules.rule_sets
        self.told += told
        return told


class UnschedulableWakes:
    """Which placements that no node could take a burst of node changes concerns.

    Such a placement decides from the bridge's nodes and, for each of its pods, the nodes the
    pod may not run on and why (`bridge.feasibility`: the verdict and the summary its pods are
    told). After a burst, only the placements for which either changed since the previous burst
    are woken; one whose pods cannot be found, or that is new since the previous burst, is woken
    as before. So a burst that concerns none of 1,000 such placements costs one node and one pod
    listing instead of 1,000 signals and 1,000 `prepare_and_submit` runs.
    """

    def __init__(self, kube: KubeClient, *, scheduler_name: str) -> None:
        self.kube = kube
        self.scheduler_name = scheduler_name
        self.skipped = 0  # placements not woken: their pods' view of the nodes had not changed
        self._views: dict[str, object] = {}  # workflow id → the view at the previous burst

    async def select(self, workflow_ids: Sequence[str]) -> list[str]:
        """The placements among `workflow_ids` to wake, in the order given."""
        if not workflow_ids:
            self._views = {}
            return []
        nodes = await list_bridge_nodes(self.kube, self.scheduler_name)
        pods_of: dict[str, list[Json]] = defaultdict(list)
        for pod in await unsubmitted_scheduler_pods(self.kube, self.scheduler_name):
            claim = claim_of(pod)
            with contextlib.suppress(ValueError):
                if claim is not None:
                    pods_of[workflow_id_of(claim)].append(pod)
        rules = ExclusionsByRules(nodes)
        names = frozenset(node_name(node) for node in nodes)
        views: dict[str, object] = {}
        wake = []
        for workflow_id in workflow_ids:
            pods = pods_of.get(workflow_id)
            if not pods:
                wake.append(workflow_id)  # nothing to compare with: woken, as every one was before
                continue
            view = (names, frozenset((pod_key(pod), rules.reasons_of_pod(pod)) for pod in pods))
            views[workflow_id] = view
            if self._views.get(workflow_id) == view:
                self.skipped += 1
            else:
                wake.append(workflow_id)
        self._views = views  # memory follows the placements waiting for a node
        return wake
