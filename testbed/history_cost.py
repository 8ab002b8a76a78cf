"""What one workflow execution cost Temporal, counted from its history: events, bytes, billable
actions (Temporal Cloud's rules), signals and activities.

The benchmarks report it (bench/probes.py, bench/placement/); end-to-end tests hold a
placement's history to a budget (tests/e2e/test_placement.py, tests/e2e/test_slurm_outage.py).
"""

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

PATCH_MARKER = "core_patch"
LOCAL_ACTIVITY_MARKER = "core_local_activity"


def local_activity_type(event: HistoryEvent) -> str | None:
    """The activity type a local activity's marker records (None: not one, or unreadable)."""
    attributes = event.marker_recorded_event_attributes
    if attributes.marker_name != LOCAL_ACTIVITY_MARKER:
        return None
    data = attributes.details.get("data")
    if data is None or not data.payloads:
        return None
    try:
        recorded = json.loads(data.payloads[0].data)
    except ValueError:
        return None
    kind = recorded.get("activity_type") if isinstance(recorded, dict) else None
    return kind if isinstance(kind, str) else None


@dataclass
class HistoryCost:
    """What one workflow execution cost Temporal, counted from its history."""

    events: int = 0
    bytes: int = 0
    workflow_tasks: int = 0
    actions: Counter[str] = field(default_factory=Counter)  # by kind, Temporal Cloud's rules
    signals: Counter[str] = field(default_factory=Counter)  # by signal name
    activities: Counter[str] = field(default_factory=Counter)  # by activity type
    activity_retries: int = 0

    @property
    def billable_actions(self) -> int:
        return sum(self.actions.values())


def history_cost(events: Iterable[HistoryEvent]) -> HistoryCost:
    """Events, bytes and billable actions (Temporal Cloud's rules: docs.temporal.io/cloud/actions).

    Actions: the workflow start; each activity scheduled (and each retry); each
    signal received; each UpsertWorkflowSearchAttributes; each timer started; and
    the markers a workflow task records (local activities), one per workflow task
    whatever their number, as the server's `action` counter has it (BatchMarkers).
    Patch markers (`workflow.patched`) are free.
    """
    cost = HistoryCost()
    marked_tasks: set[int] = set()  # workflow tasks whose markers were counted
    task = 0
    for event in events:
        cost.events += 1
        cost.bytes += event.ByteSize()
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            cost.actions["start"] += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            cost.actions["activity"] += 1
            cost.activities[event.activity_task_scheduled_event_attributes.activity_type.name] += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            retries = max(event.activity_task_started_event_attributes.attempt - 1, 0)
            cost.activity_retries += retries
            cost.actions["activity retry"] += retries
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            cost.actions["signal"] += 1
            cost.signals[event.workflow_execution_signaled_event_attributes.signal_name] += 1
        elif kind == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            cost.actions["upsert"] += 1
        elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
            cost.actions["timer"] += 1
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            cost.workflow_tasks += 1
            task = event.event_id
        elif (
            kind == EventType.EVENT_TYPE_MARKER_RECORDED
            and event.marker_recorded_event_attributes.marker_name != PATCH_MARKER
        ):
            if (local := local_activity_type(event)) is not None:
                cost.activities[local] += 1
            if task not in marked_tasks:
                marked_tasks.add(task)
                cost.actions["local activities"] += 1
    return cost
