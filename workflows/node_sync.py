"""NodeSyncWorkflow: one short, bounded run of node sync: read and plan → apply.

Started by the Temporal Schedule `slurm-bridge-node-sync` (every
NODE_SYNC_INTERVAL seconds, and at once when the node watcher sees a relevant
change). No loops, no signals, no continue-as-new: each run's history is a
handful of events whatever the uptime, and the next run starts from scratch.

The plan is made in the activity that reads both sides (two full node lists
outgrow Temporal's payload limit at a few thousand nodes) and holds at most
`max_actions` of them, most urgent first; the rest wait for the next run. The
Temporal UI shows, per run, what the bridge decided (the plan), what it did
(each apply's result) and how many changes it left for later. A failed read
fails the run before any plan exists: nothing is ever removed, undrained or
deleted on missing data.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.nodes import NodeActivities
    from bridge.node_actions import NodeAction, NodeActions, NodeSyncRequest, NodeSyncResult
    from bridge.node_sync import by_subject

NODE_SYNC_ID_PREFIX = "node-sync"
# Few attempts: the next scheduled run re-reads both sides anyway, and a run
# that keeps failing should show as failed in the UI rather than hang.
SYNC_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
PLAN_TIMEOUT = timedelta(seconds=60)
APPLY_TIMEOUT = timedelta(seconds=120)
# Actions per apply activity: keeps each attempt short and each payload small.
BATCH_SIZE = 50


@workflow.defn
class NodeSyncWorkflow:
    @workflow.run
    async def run(self, request: NodeSyncRequest) -> NodeSyncResult:
        planned = await workflow.execute_activity_method(
            NodeActivities.plan_node_sync,
            request,
            start_to_close_timeout=PLAN_TIMEOUT,
            retry_policy=SYNC_RETRY,
            summary="read Kubernetes nodes, Slurm nodes and partitions; plan",
        )
        result = NodeSyncResult(
            kube_nodes=planned.kube_nodes,
            slurm_nodes=planned.slurm_nodes,
            planned=[action.describe() for action in planned.actions],
            deferred=planned.deferred,
        )
        for batch in batches(planned.actions, BATCH_SIZE):
            report = await workflow.execute_activity_method(
                NodeActivities.apply_node_actions,
                NodeActions(actions=batch),
                start_to_close_timeout=APPLY_TIMEOUT,
                retry_policy=SYNC_RETRY,
                summary=f"apply {len(batch)} node changes",
            )
            result.add(report)
        return result


def batches(actions: list[NodeAction], size: int) -> list[list[NodeAction]]:
    """Batches of about `size`, never splitting one node's actions (they depend on each other)."""
    result: list[list[NodeAction]] = []
    for group in by_subject(actions):
        if not result or len(result[-1]) + len(group) > size:
            result.append([])
        result[-1].extend(group)
    return [batch for batch in result if batch]
