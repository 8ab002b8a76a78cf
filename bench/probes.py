"""Measuring instruments for the benchmarks: /proc CPU and memory, request counters (history costs: testbed).

Everything here reads; nothing changes the system under test. CPU and memory
come from /proc (utime + stime, VmRSS), so a figure is attributed to the
process (or, inside this process, the thread) that spent it.

Its size (about 420 lines) is every figure's probe (CPU, memory, requests, scheduling
passes), each small, kept together so the report reads them from one place.
"""

import os
import re
import socket
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from testbed.history_cost import HistoryCost, history_cost, local_activity_type

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# -- /proc ---------------------------------------------------------------------


def _stat_fields(path: str) -> list[str] | None:
    """Fields of a /proc/.../stat line after the command name (which may contain spaces)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def cpu_seconds(pid: int | None, tid: int | None = None) -> float | None:
    """User + system CPU seconds of a process (or one of its threads); None when it is gone."""
    if pid is None:
        return None
    fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat")
    if fields is None:
        return None
    # After the command: state(0) ppid(1) ... utime(11) stime(12).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_cpu_seconds() -> tuple[float, float]:
    """This process: (main thread, Temporal SDK core threads) CPU seconds.

    The SDK core (Rust, tokio) names its threads `tokio-*`; Python threads keep
    the process name. The rest of the process (the benchmark's driver threads:
    pod observer, kubelet, pod creation; including ones that have exited) is
    total - main - sdk.
    """
    pid = os.getpid()
    main = cpu_seconds(pid, pid) or 0.0
    sdk = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("tokio"):
            sdk += cpu_seconds(pid, int(tid)) or 0.0
    return main, sdk


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (every process, ours and everyone else's)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS


def memory_kb(pid: int | None, key: str = "VmRSS") -> int | None:
    """A line of /proc/<pid>/status in KiB (VmRSS: now, VmHWM: peak)."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def child_pid(comm: str) -> int | None:
    """The pid of this process's child whose command name is `comm` (the dev server: `temporal`)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        fields = text[text.rfind(")") + 2 :].split()
        if name == comm and int(fields[1]) == me:
            return int(entry)
    return None


def _argv0(pid: str) -> str:
    return os.path.basename(
        Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    )


def pids_by_comm(comm: str, root: Path | None = None) -> list[int]:
    """Processes named `comm`, optionally only those living in the chroot `root` (read-only look-up).

    Named by their command name or by the first word of their command line: slurmctld re-executes
    itself on `scontrol reconfigure` through the file its `slurmctld` link points to, and its
    command name becomes that file's (Debian: `slurmctld-wlm`) while its command line stays.
    """
    found = []
    wanted_root = os.path.realpath(root) if root is not None else None
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != comm and _argv0(entry) != comm:
                continue
            if wanted_root is not None and os.path.realpath(f"/proc/{entry}/root") != wanted_root:
                continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def _sum_cpu(pids: Sequence[int]) -> float | None:
    """CPU seconds of these processes together; None with none (or once any is gone)."""
    seconds = [cpu_seconds(pid) for pid in pids]
    return None if not seconds or None in seconds else sum(s for s in seconds if s is not None)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds of every process that works for a placement, at one instant."""

    at: float
    process: float  # this process: bridge (worker + watchers) and the benchmark's driver threads
    main_thread: float  # asyncio loop: workflow and activity code, watchers, kube/Slurm clients
    sdk_core: float  # Temporal SDK core (Rust): gRPC, polling, history handling
    server: float | None  # the Temporal dev server
    kube: float | None  # the Kubernetes API server (the fake's process, or kube-apiserver + etcd)
    slurmctld: float | None
    slurmrestd: float | None
    machine: float  # every process on the box, ours and everyone else's
    follower: float | None = None  # the follower worker processes together, when the run has any

    @classmethod
    def take(
        cls,
        server: int | None,
        kube: Sequence[int],
        slurmctld: int | None,
        slurmrestd: int | None,
        followers: Sequence[int] = (),
    ) -> "CpuSample":
        main, sdk = thread_cpu_seconds()
        return cls(
            at=time.monotonic(),
            process=cpu_seconds(os.getpid()) or 0.0,
            main_thread=main,
            sdk_core=sdk,
            server=cpu_seconds(server),
            kube=_sum_cpu(kube),
            slurmctld=cpu_seconds(slurmctld),
            slurmrestd=cpu_seconds(slurmrestd),
            machine=machine_busy_seconds(),
            follower=_sum_cpu(followers),
        )

    def since(self, earlier: "CpuSample") -> dict[str, float | None]:
        def delta(now: float | None, then: float | None) -> float | None:
            return None if now is None or then is None else now - then

        process = self.process - earlier.process
        main = self.main_thread - earlier.main_thread
        sdk = self.sdk_core - earlier.sdk_core
        return {
            "wall": self.at - earlier.at,
            "process": process,
            "main_thread": main,
            "sdk_core": sdk,
            "other_threads": process - main - sdk,
            "server": delta(self.server, earlier.server),
            "kube": delta(self.kube, earlier.kube),
            "slurmctld": delta(self.slurmctld, earlier.slurmctld),
            "slurmrestd": delta(self.slurmrestd, earlier.slurmrestd),
            "machine": self.machine - earlier.machine,
            "follower": delta(self.follower, earlier.follower),
        }


# -- HTTP request counting -----------------------------------------------------

_ID_SEGMENT = re.compile(r"/\d+(?=/|$)")


def slurm_operation(method: str, path: str) -> str:
    """`GET /job/{id}` for `GET /slurm/v0.0.44/job/42`."""
    path = re.sub(r"^/slurm/v[0-9.]+", "", path)
    return f"{method} {_ID_SEGMENT.sub('/{id}', path)}"


@dataclass
class RequestStats:
    count: Counter[str] = field(default_factory=Counter)
    bytes_in: Counter[str] = field(default_factory=Counter)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # to headers

    def reset(self) -> None:
        self.count.clear()
        self.bytes_in.clear()
        self.seconds.clear()

    def snapshot(self) -> "RequestStats":
        return RequestStats(Counter(self.count), Counter(self.bytes_in), defaultdict(float, self.seconds))


class _CountingStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, stats: RequestStats, operation: str) -> None:
        self._inner = inner
        self._stats = stats
        self._operation = operation

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._stats.bytes_in[self._operation] += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CountingTransport(httpx.AsyncBaseTransport):
    """Wraps httpx's transport: requests, response bytes and time per Slurm operation."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()
        self.stats = RequestStats()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        operation = slurm_operation(request.method, request.url.path)
        started = time.perf_counter()
        response = await self._inner.handle_async_request(request)
        self.stats.count[operation] += 1
        self.stats.seconds[operation] += time.perf_counter() - started
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CountingStream(response.stream, self.stats, operation)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


_KUBE_NAME = re.compile(r"(/namespaces/[^/]+)|(/(pods|nodes|events)/[^/]+)")


def kube_operation(method: str, path: str, query: dict[str, str]) -> str:
    """`PATCH /api/v1/namespaces/{ns}/pods/{name}` for a concrete path; watches marked as such."""

    def generic(match: re.Match[str]) -> str:
        if match.group(1):
            return "/namespaces/{ns}"
        return f"/{match.group(3)}/{{name}}"

    operation = f"{method} {_KUBE_NAME.sub(generic, path)}"
    return operation + " (watch)" if query.get("watch") in ("true", "1") else operation


# -- statistics ----------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- Temporal histories --------------------------------------------------------


def event_time(event: HistoryEvent) -> float:
    """When the server recorded the event (Unix seconds)."""
    return event.event_time.seconds + event.event_time.nanos / 1e9


def split_history(
    events: Iterable[HistoryEvent], start: float, end: float
) -> tuple[HistoryCost, HistoryCost]:
    """(cost outside [start, end), cost inside it): a placement's own steps, and what waiting cost."""
    outside: list[HistoryEvent] = []
    inside: list[HistoryEvent] = []
    for event in events:
        (inside if start <= event_time(event) < end else outside).append(event)
    return history_cost(outside), history_cost(inside)


# The steps of a placement's path to bound, from its history (the server's clock).
STEP_ROWS = (
    ("start -> first workflow task started", "start_to_task"),
    ("first task started -> prepare_and_submit started", "task_to_submit"),
    ("prepare_and_submit runs", "submit_runs"),
    ("job_changed signal -> its workflow task started", "signal_to_task"),
    ("that task started -> bind started", "task_to_bind"),
    ("bind runs (pod bound inside)", "bind_runs"),
    ("that task, with bind as local activity, runs", "task_with_local_bind"),
)


def step_durations(events: Sequence[HistoryEvent]) -> dict[str, float]:
    """Seconds each step of STEP_ROWS took in one placement's history (absent: not found).

    Where a placement's time goes between its own steps: queueing in Temporal (a task
    waiting for a worker), the workflow's code, and each activity's run.
    """
    wake = wake_times(events)
    times: dict[str, float] = {}
    task_after_signal = wake.get("task_started")
    if task_after_signal is not None:
        times["signal_to_task"] = task_after_signal - wake["signal"]
        if "bound_task_completed" in wake:
            # A local bind runs inside the workflow task the signal woke.
            times["task_with_local_bind"] = wake["bound_task_completed"] - task_after_signal
    started_at: float | None = None
    first_task: float | None = None
    activity_started: dict[int, float] = {}  # scheduled event id → started
    activity_name: dict[int, str] = {}  # scheduled event id → activity type
    for event in events:
        at, kind = event_time(event), event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            started_at = at
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and first_task is None:
            first_task = at
            if started_at is not None:
                times["start_to_task"] = at - started_at
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activity_name[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            scheduled = event.activity_task_started_event_attributes.scheduled_event_id
            activity_started[scheduled] = at
            name = activity_name.get(scheduled)
            if name == "prepare_and_submit" and first_task is not None:
                times.setdefault("task_to_submit", at - first_task)
            elif name == "bind" and task_after_signal is not None:
                times.setdefault("task_to_bind", at - task_after_signal)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
            name, began = activity_name.get(scheduled), activity_started.get(scheduled)
            if began is not None and name == "prepare_and_submit":
                times.setdefault("submit_runs", at - began)
            elif began is not None and name == "bind":
                times.setdefault("bind_runs", at - began)
    return times


def wake_times(events: Sequence[HistoryEvent]) -> dict[str, float]:
    """When (server's clock) the first `job_changed` signal was recorded, the workflow task it woke
    started, and the task that bound the pods (its local `bind`'s marker follows it) completed.

    With the watcher's and the pod observer's own times, the legs of Slurm RUNNING -> bound: the
    signal's delivery, the task's wait for a worker, and the task's run with the bind inside.
    """
    times: dict[str, float] = {}
    completed: float | None = None
    for event in events:
        at, kind = event_time(event), event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            if event.workflow_execution_signaled_event_attributes.signal_name == "job_changed":
                times.setdefault("signal", at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and "signal" in times:
            times.setdefault("task_started", at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            completed = at
        elif (
            kind == EventType.EVENT_TYPE_MARKER_RECORDED
            and local_activity_type(event) == "bind"
            and completed is not None
        ):
            times.setdefault("bound_task_completed", completed)
    return times


def recheck_times(first: float, cap: float, horizon: float) -> list[float]:
    """When a re-check that starts at `first` and doubles up to `cap` fires, within `horizon` (same unit).

    The placement workflow's safety re-check after a bind (workflows/placement.py:
    DEFAULT_RECHECK, doubled while nothing changes, up to MAX_RECHECK).
    """
    times: list[float] = []
    interval, at = first, first
    while at <= horizon:
        times.append(at)
        interval = min(interval * 2, cap)
        at += interval
    return times


# -- Temporal server metrics ---------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """A Prometheus text page as {(name, labels): value}; empty when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        labels = frozenset(_LABEL.findall(match.group(2) or ""))
        try:
            samples[(match.group(1), labels)] = float(match.group(3))
        except ValueError:
            continue
    return samples


def metric_by(samples: Samples, name: str, label: str, **where: str) -> dict[str, float]:
    """Sum of a counter by one label, over the samples whose labels include `where`.

    The dev server reports most request counters twice (service_name frontend
    and history): pass service_name="frontend" to count each RPC once.
    """
    out: defaultdict[str, float] = defaultdict(float)
    for (metric, labels), value in samples.items():
        if metric != name:
            continue
        found = dict(labels)
        if all(found.get(key) == wanted for key, wanted in where.items()):
            out[found.get(label, "")] += value
    return dict(out)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
