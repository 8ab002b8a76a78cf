"""The bridge's own Prometheus metrics, served with the Temporal SDK's on METRICS_PORT.

They go through Temporal's metric meter, so one endpoint carries both the SDK's
series (workflow and activity latencies, task slots, sticky cache) and these.
"""

from collections.abc import Callable

from temporalio.common import MetricMeter

SlurmObserver = Callable[[str, str, float], None]


def slurm_observer(meter: MetricMeter) -> SlurmObserver:
    """Counts and times every slurmrestd request by operation and outcome."""
    requests = meter.create_counter(
        "slurm_bridge_slurm_requests", "slurmrestd requests by operation and outcome"
    )
    latency = meter.create_histogram_float(
        "slurm_bridge_slurm_request_seconds", "slurmrestd request latency", unit="s"
    )

    def observe(operation: str, outcome: str, seconds: float) -> None:
        attributes = {"operation": operation, "outcome": outcome}
        requests.add(1, attributes)
        latency.record(seconds, attributes)

    return observe


def slurm_health_observer(meter: MetricMeter) -> Callable[[bool], None]:
    """The Slurm-health gate, as seen by this replica: 1 while Slurm answers, 0 while it is away."""
    available = meter.create_gauge(
        "slurm_bridge_slurm_available", "1 while Slurm answers, 0 while the Slurm-health gate is closed"
    )
    outages = meter.create_counter("slurm_bridge_slurm_outages", "times the Slurm-health gate closed")
    available.set(1)

    def observe(is_available: bool) -> None:
        available.set(1 if is_available else 0)
        if not is_available:
            outages.add(1)

    return observe
