"""Prometheus metrics of the webhook, served on `/metrics`.

A registry per app instead of the global one: tests (and anything embedding
the app twice) would otherwise collide on duplicate metric names.
"""

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "slurm_bridge_webhook_admission_decisions",
            "Admission decisions, by endpoint, operation and outcome.",
            ["endpoint", "operation", "allowed"],
            registry=self.registry,
        )
        self.rejected_requests = Counter(
            "slurm_bridge_webhook_rejected_requests",
            "Requests answered with an HTTP error (malformed, too large, too slow) instead of a decision.",
            ["endpoint", "code"],
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "slurm_bridge_webhook_internal_errors",
            "Decisions that failed inside the webhook and were answered with a denial.",
            ["endpoint"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "slurm_bridge_webhook_admission_duration_seconds",
            "Time from the request's arrival to the answer.",
            ["endpoint"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )

    def decision(self, endpoint: str, operation: str, allowed: bool) -> None:
        self.decisions.labels(endpoint, operation, "true" if allowed else "false").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
