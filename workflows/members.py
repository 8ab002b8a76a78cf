"""What the placement workflow knows about its pods.

Pure bookkeeping over the pod watcher's signals (no commands): the group's
members, the latest facts per pod, and the questions the placement asks of them.
"""

from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from bridge.models import PlacementRequest, PodEvent, PodRef


class PlacementFailed(Exception):
    """A placement that cannot succeed as requested; the message is for the user."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class GroupMembers:
    request: PlacementRequest
    members: dict[str, PodRef]  # uid → pod, in the job's order once submitted
    pods: dict[str, PodEvent]  # uid → the latest facts
    translated_annotations: dict[str, str]  # uid → annotations the job was built from

    def _merge(self, event: PodEvent) -> PodEvent:
        """Record a pod's facts; terminal facts are sticky, so a stale snapshot cannot undo them."""
        previous = self.pods.get(event.pod.uid)
        if previous is not None:
            event = event.model_copy(
                update={
                    "gone": event.gone or previous.gone,
                    "deleting": event.deleting or previous.deleting,
                    "phase": previous.phase if previous.terminal and not event.terminal else event.phase,
                    "node_name": event.node_name or previous.node_name,
                }
            )
        self.pods[event.pod.uid] = event
        return event

    def _pods(self) -> list[PodRef]:
        return list(self.members.values())

    def _live_members(self) -> list[PodRef]:
        return [
            ref
            for uid, ref in self.members.items()
            if not ((event := self.pods.get(uid)) and (event.terminal or event.deleting))
        ]

    def _pods_finished(self) -> bool:
        """All pods terminal (or gone), or deleted before they ever ran."""
        events = [self.pods.get(p.uid) for p in self._pods()]
        if not all(events):
            return False
        return all(e is not None and (e.terminal or (e.deleting and not e.node_name)) for e in events)

    def _current_annotations(self) -> dict[str, str]:
        return {uid: event.job_annotations for uid, event in self.pods.items() if uid in self.members}

    def _annotations_changed(self) -> bool:
        return any(
            self.translated_annotations.get(uid, annotations) != annotations
            for uid, annotations in self._current_annotations().items()
        )

    def _record_bind_latency(self) -> None:
        created = [e.created for uid, e in self.pods.items() if uid in self.members and e.created]
        if not created:
            return
        first = datetime.fromisoformat(min(created).replace("Z", "+00:00"))
        seconds = max((workflow.now() - first).total_seconds(), 0.0)
        workflow.metric_meter().create_histogram_float(
            "slurm_bridge_pod_created_to_bound_seconds", "pod creation to binding, per placement", unit="s"
        ).record(seconds, {"kind": self.request.kind})
