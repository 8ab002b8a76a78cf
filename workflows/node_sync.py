"""NodeSyncWorkflow: one short, bounded run of node sync: read → plan → apply.

Started by the Temporal Schedule `slurm-bridge-node-sync` (every
NODE_SYNC_INTERVAL seconds, and at once when the node watcher sees a relevant
change). No loops, no signals, no continue-as-new: each run's history is a
handful of events whatever the uptime, and the next run starts from scratch.

The plan is made here from the snapshot, so the Temporal UI shows, per run,
what the bridge saw (the read's result), what it decided (the apply's input)
and what it did (the result). A failed read fails the run before any plan
exists: nothing is ever removed, undrained or deleted on missing data.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.nodes import NodeActivities
    from bridge.models import NodeSnapshotInput
    from bridge.node_actions import NodeAction, NodeActions, NodeSyncRequest, NodeSyncResult
    from bridge.node_sync import plan

NODE_SYNC_ID_PREFIX = "node-sync"
# Few attempts: the next scheduled run re-reads both sides anyway, and a run
# that keeps failing should show as failed in the UI rather than hang.
SYNC_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
READ_TIMEOUT = timedelta(seconds=60)
APPLY_TIMEOUT = timedelta(seconds=120)
# Actions per apply activity: keeps each attempt short and each payload small.
BATCH_SIZE = 50


@workflow.defn
class NodeSyncWorkflow:
    @workflow.run
    async def run(self, request: NodeSyncRequest) -> NodeSyncResult:
        snapshot = await workflow.execute_activity_method(
            NodeActivities.read_node_snapshot,
            NodeSnapshotInput(),
            start_to_close_timeout=READ_TIMEOUT,
            retry_policy=SYNC_RETRY,
            summary="read Kubernetes nodes, Slurm nodes and partitions",
        )
        actions = plan(
            snapshot,
            scheduler_name=request.scheduler_name,
            default_partition=request.default_partition,
            installation=request.installation,
        )
        result = NodeSyncResult(
            kube_nodes=len(snapshot.kube_nodes),
            slurm_nodes=len(snapshot.slurm_nodes),
            planned=[action.describe() for action in actions],
        )
        for batch in batches(actions, BATCH_SIZE):
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
    groups: dict[str, list[NodeAction]] = {}
    for action in actions:
        groups.setdefault(action.subject, []).append(action)
    result: list[list[NodeAction]] = []
    for group in groups.values():
        if not result or len(result[-1]) + len(group) > size:
            result.append([])
        result[-1].extend(group)
    return [batch for batch in result if batch]
