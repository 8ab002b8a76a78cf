"""What a run is asked (`Options`) and what it measured (`Results`, by `Phase`)."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.kube import PodTimes
from bench.probes import RequestStats
from bench.reference import ReferenceRun
from bench.slurm import SchedulerPass
from testbed.history_cost import HistoryCost


@dataclass
class Options:
    scenario: str
    pods: int
    nodes: int
    cpus: int
    memory_mb: int
    concurrency: int
    watch_interval: float
    warmup: int
    reference: int
    finish_rate: float | None
    hold: float
    recheck: float
    paced: int
    paced_load: float
    probes: int
    foreign_jobs: int
    levels: tuple[int, ...]  # site: the numbers of live placements measured at
    max_cached_workflows: int | None
    timeout: float
    json_path: str | None
    followers: int = 0  # worker processes beside the in-process one (the leader), following it
    kube: str = "fake"  # the API server: "fake" (testbed/kube_fake) or "real" (kube-apiserver + etcd)


@dataclass
class SiteLevel:
    """What was measured with `live` placements in flight."""

    live: int
    bound: int = 0
    fill_placements: int = 0  # placements added to reach this level
    fill_seconds: float = 0.0
    hold_seconds: float = 0.0
    hold_cpu: dict[str, float | None] = field(default_factory=dict)
    paused_seconds: float = 0.0
    paused_cpu: dict[str, float | None] = field(default_factory=dict)  # the job watcher held back
    watcher: RequestStats = field(default_factory=RequestStats)  # its requests during the hold
    watcher_passes: int = 0
    hold_actions: float = 0.0  # the dev server's billable actions during the hold
    rss_worker_kb: int | None = None
    rss_server_kb: int | None = None
    rss_follower_kb: int | None = None
    probes: list[dict[str, float | None]] = field(default_factory=list)


@dataclass
class Phase:
    """One measured stretch of the run: its pods, wall clock and CPU."""

    pods: list[PodTimes] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    cpu: dict[str, float | None] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return placement_rate(self.pods)


@dataclass
class Results:
    options: Options
    started: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    slurm_jobs_at_start: int | None = None
    foreign_submitted: int = 0
    burst: Phase = field(default_factory=Phase)
    whole: Phase = field(default_factory=Phase)  # burst + hold + finish
    paced: Phase = field(default_factory=Phase)
    paced_rate: float = 0.0
    idle: Phase = field(default_factory=Phase)  # bridge running, no placement: the background
    hold: Phase = field(default_factory=Phase)
    reference: ReferenceRun | None = None
    # The same reference run before the burst too: the machine's speed drifts within a run
    # (a 2 vCPU VM's reference rate moved 44-60/s between runs, its CPU per workflow with it),
    # and the ratio is taken against the mean of both sides of the placements.
    reference_before: ReferenceRun | None = None

    @property
    def reference_rate(self) -> float | None:
        rates = [run.rate for run in (self.reference_before, self.reference) if run is not None and run.rate]
        return sum(rates) / len(rates) if rates else None

    @property
    def ratio(self) -> float | None:
        reference = self.reference_rate
        return (self.burst.rate or 0.0) / reference if reference else None

    reference_cpu: dict[str, float | None] = field(default_factory=dict)
    costs: list[HistoryCost] = field(default_factory=list)  # per placement, hold window left out
    paced_costs: list[HistoryCost] = field(default_factory=list)
    waiting_costs: list[HistoryCost] = field(default_factory=list)  # per placement, hold window only
    reference_costs: list[HistoryCost] = field(default_factory=list)
    # phase → each placement's step durations from its history (bench/probes.py: STEP_ROWS)
    steps: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"burst": [], "paced": []})
    failures: list[str] = field(default_factory=list)
    rss_kb: dict[str, int | None] = field(default_factory=dict)
    in_flight: int | None = None
    cache_size: int | None = None  # the worker's max_cached_workflows
    activity_slots: int | None = None  # the worker's max_concurrent_activities
    rss_curve: list[tuple[int, int | None]] = field(default_factory=list)  # (submitted, worker RSS)
    paused: Phase = field(default_factory=Phase)  # the job watcher paused: the Slurm daemons without it
    slurm_activities: RequestStats = field(default_factory=RequestStats)
    slurm_watcher: RequestStats = field(default_factory=RequestStats)
    slurm_hold: RequestStats = field(default_factory=RequestStats)  # the watcher while holding
    watcher_passes_hold: int = 0
    kube_requests: Counter[str] = field(default_factory=Counter)
    kube_seconds: dict[str, float] = field(default_factory=dict)  # by operation, summed
    server_actions: dict[str, float] = field(default_factory=dict)
    server_requests: dict[str, float] = field(default_factory=dict)
    server_not_found: dict[str, float] = field(default_factory=dict)
    server_actions_reference: dict[str, float] = field(default_factory=dict)
    hold_actions: dict[str, float] = field(default_factory=dict)
    latencies: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # phase → figure → s
    running_from_log: dict[str, tuple[int, int]] = field(default_factory=dict)  # phase → (found, jobs)
    passes: dict[str, list[SchedulerPass]] = field(default_factory=dict)  # phase → slurmctld's passes
    # phase → jobs first seen RUNNING by the watcher
    via_watcher: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)  # phase → pending reasons read, by job
    probes: list[dict[str, float | None]] = field(default_factory=list)  # pending scenario
    site_levels: list[SiteLevel] = field(default_factory=list)  # site scenario
    pending_reasons: Counter[str] = field(default_factory=Counter)
    observer: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def placement_rate(placed: Sequence[PodTimes]) -> float | None:
    created = [t.created for t in placed if t.created]
    bound = [t.bound for t in placed if t.bound]
    if not created or not bound or max(bound) <= min(created):
        return None
    return len(bound) / (max(bound) - min(created))
