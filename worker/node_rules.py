"""Keep pending jobs' `excluded_nodes` in step with the nodes' labels, taints and cordons.

A pending job was submitted with the nodes its pods could not run on excluded.
When nodes change (a label, a taint, a cordon), the set can change under it:
after each burst of node changes (the node watcher coalesces them) this looks
at the bridge's submitted-but-unbound pods, recomputes each job's exclusions
with Kubernetes' rules and tells only the placements whose set changed
(`nodes_changed`); the placement updates its job in an activity. So a node
change costs one pod listing, one job read per pending job and a signal only
where something is to be done. A node Kubernetes deleted stays excluded while
Slurm still has it (`with_departed_nodes`: one node listing a pass when there is one);
node sync lifts that exclusion once it has drained the node, before deleting it.
"""

import asyncio
import logging
from collections import defaultdict

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.node_source import SlurmNodeNames, list_bridge_nodes, unbound_bridge_pods, with_departed_nodes
from bridge import hostlist
from bridge.feasibility import excluded_slurm_nodes, group_feasibility
from bridge.models import installation_of, workflow_id_of
from bridge.pod_events import claim_of, het_offset_label, job_id_label
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
        told = 0
        in_slurm = SlurmNodeNames(self.slurm)
        for job_id, pods in jobs.items():
            try:
                components = [c.model_dump(mode="json") for c in await self.slurm.get_job_components(job_id)]
            except SlurmNotFound:
                continue
            if "PENDING" not in (components[0].get("job_state") or []):
                continue  # allocated already: the exclusions no longer matter
            # A heterogeneous job's component excludes what its own pods (by their offset label)
            # may not run on; an ordinary job what any of its pods may not.
            by_offset: dict[int, list[Json]] = {}
            for pod in pods:
                by_offset.setdefault(het_offset_label(pod) if len(components) > 1 else 0, []).append(pod)
            changed = False
            for offset, job in enumerate(components):
                current = set(hostlist.expand(job.get("excluded_nodes") or ""))
                feasibility = group_feasibility(by_offset.get(offset, []), nodes)
                excluded = await with_departed_nodes(
                    in_slurm, excluded_slurm_nodes(feasibility), current, nodes
                )
                changed = changed or set(excluded or []) != current
            if not changed:
                continue
            try:
                await self.temporal.get_workflow_handle(workflow_id_of(claims[job_id])).signal(
                    PlacementWorkflow.nodes_changed
                )
            except RPCError as error:
                if error.status != RPCStatusCode.NOT_FOUND:
                    raise
                continue
            told += 1
        self.told += told
        return told
