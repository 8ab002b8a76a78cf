"""The real Slurm test bed: slurmctld + slurmrestd from `hack/slurm-sid.sh`.

Tests never share Slurm objects: each gets its own external nodes and a dynamic
partition holding exactly them (`make_partition`), so tests running at the same
time, or jobs a test leaves behind, cannot disturb one another.

Deliberately independent of `clients.slurm_client`: set-up and clean-up go
through `scontrol` (and plain HTTP for cancelling), so a bug in the client under
test cannot hide itself by also breaking the clean-up.

Its size (about 690 lines) is one driver of the chroot's daemons and its users, nodes
and partitions; a test or benchmark needs all of it at once.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import httpx

from bridge.hostlist import compress
from testbed import waiting

REPO = Path(__file__).resolve().parent.parent
SLURM_SID = REPO / "hack" / "slurm-sid.sh"

# Job states after which a job holds nothing (job_state's base states).
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


# slurm.conf's partitions over every node with the feature slurm-bridge: the default
# one never preempts; a bridge-high job preempts (cancels) bridge-low jobs.
DEFAULT_PARTITION = "slurm-bridge"
LOW_PARTITION = "bridge-low"
HIGH_PARTITION = "bridge-high"
FOREIGN_JOB_NAME = "foreign"
# Bulk-cancel answers per job that are fine: the job has ended, or is gone already.
ESLURM_INVALID_JOB_ID = 2017
ESLURM_ALREADY_DONE = 2021
# How slurmctld logs the start of a job (LogTimeFormat=iso8601_ms, the chroot's UTC):
# by the main scheduler at info level, by the backfill scheduler only with
# SlurmctldDebug=verbose and DebugFlags=HetJob (see docs/slurm-testbed.md).
JOB_START_LINE = re.compile(
    r"^\[(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] "
    r"(?:sched: Allocate JobId=(?P<main>\d+) "
    r"|sched/backfill: _start_job: HETJOB: Started JobId=(?P<backfill>\d+) )"
)

T = TypeVar("T")


class SlurmBedError(RuntimeError):
    """The test bed could not do what a test asked (script failed, Slurm refused)."""


def wait_until(
    check: Callable[[], T | None], what: waiting.What, timeout: float = 15.0, interval: float = 0.05
) -> T:
    """`testbed.waiting.wait_until` for the bed's own waits on Slurm (which tells nobody of a
    change) and the benchmarks': its timeout is a `SlurmBedError`, as the bed's other failures are."""
    try:
        return waiting.wait_until(check, what, timeout, interval)
    except waiting.ConditionTimeout as error:
        raise SlurmBedError(str(error)) from None


@dataclass(frozen=True)
class ForeignUser:
    """The bed's second, unprivileged Slurm user: its jobs are not the bridge's."""

    name: str
    jwt_file: Path

    def token(self) -> str:
        return self.jwt_file.read_text().strip().removeprefix("SLURM_JWT=")


class BedJob(NamedTuple):
    job_id: int
    states: tuple[str, ...]
    comment: str = ""  # the bridge's `<workflow id>@<generation>`

    @property
    def ended(self) -> bool:
        return bool(ENDED_STATES.intersection(self.states))


@dataclass
class TestPartition:
    """A dynamic partition and the external nodes made for one test."""

    __test__ = False  # not a pytest test class, despite the name

    bed: SlurmTestBed = field(repr=False)
    name: str
    node_names: list[str]
    cpus: int
    memory_mb: int

    @property
    def nodes_expression(self) -> str:
        return compress(self.node_names)

    def cleanup(self) -> None:
        """Cancel every job in the partition, then delete the partition and its nodes."""
        for job in self.bed.jobs_in_partition(self.name):
            if not job.ended:
                self.bed.cancel_job(job.job_id)
        self.bed.wait_for_ended_jobs(self.name)
        self.bed.scontrol_quiet("delete", f"PartitionName={self.name}")
        self.bed.delete_nodes(self.node_names)


@dataclass
class ExtraRestd:
    """A slurmrestd of one test's own, on a free port, in front of the shared slurmctld.

    Stopping it is an outage for the bridge under test only: the bed's own
    slurmrestd, which every other test uses, keeps running.
    """

    bed: SlurmTestBed = field(repr=False)
    port: int
    slurm_conf: str | None = None  # inside the chroot; None: the bed's own /etc/slurm/slurm.conf

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _pidfile(self) -> str:
        return f"/run/slurm/slurmrestd-{self.port}.pid"  # inside the chroot

    def start(self, timeout: float = 15.0) -> None:
        """Start it (as hack/slurm-sid.sh does) and return once it answers HTTP."""
        log = f"/var/log/slurm/slurmrestd-{self.port}.log"
        _run(["chroot", str(self.bed.root), "touch", log], timeout=30)
        _run(["chroot", str(self.bed.root), "chown", "slurmrestd", log], timeout=30)
        # rest_auth/jwt wants SLURM_JWT=daemon in slurmrestd's environment; it runs as slurmrestd.
        conf = [f"SLURM_CONF={self.slurm_conf}"] if self.slurm_conf else []
        _run(
            [
                "chroot", str(self.bed.root), "env", "SLURM_JWT=daemon", *conf,
                "start-stop-daemon", "--start", "--background", "--make-pidfile",
                "--pidfile", self._pidfile, "--chuid", "slurmrestd:slurmrestd", "--output", log,
                "--exec", "/usr/sbin/slurmrestd", "--", "-a", "rest_auth/jwt", f"127.0.0.1:{self.port}",
            ],
            timeout=30,
        )  # fmt: skip

        def answers() -> bool:
            try:
                httpx.get(f"{self.url}/", timeout=1)
            except httpx.TransportError:
                return False
            return True

        wait_until(answers, f"slurmrestd answering on port {self.port}", timeout=timeout, interval=0.1)

    def stop(self) -> None:
        """SIGINT, as slurm-sid.sh stops its slurmrestd; returns once the process is gone."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGINT)
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), f"slurmrestd {pid} stopped", timeout=15)
            (self.bed.root / self._pidfile.lstrip("/")).unlink(missing_ok=True)
        if self.slurm_conf:  # a configuration of its own (unreachable_controller_slurmrestd)
            shutil.rmtree(self.bed.root / Path(self.slurm_conf).parent.relative_to("/"), ignore_errors=True)

    def pid(self) -> int | None:
        """Its pid while it runs; only ever a process of the bed's chroot."""
        try:
            pid = int((self.bed.root / self._pidfile.lstrip("/")).read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            root = os.path.realpath(f"/proc/{pid}/root")
        except OSError:
            return None
        return pid if root == os.path.realpath(self.bed.root) else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class SlurmTestBed:
    """Handle on the running Slurm; `SlurmTestBed.up()` starts it if needed."""

    def __init__(
        self,
        rest_url: str,
        user_name: str,
        jwt_file: Path,
        script: Path = SLURM_SID,
        foreign: ForeignUser | None = None,
    ) -> None:
        self.rest_url = rest_url
        self.user_name = user_name
        self.jwt_file = jwt_file
        self.script = script
        self._foreign = foreign
        # Dynamic partitions are not saved: slurmctld forgets them on restart
        # (and kills their jobs: "Killing JobId=N on defunct partition").
        self._partitions_to_restore: list[PartitionSpec] = []
        self._lock_fd: int | None = None

    @classmethod
    def up(cls, script: Path = SLURM_SID) -> SlurmTestBed:
        """Run `slurm-sid.sh up` (idempotent, cached) and read the env lines it prints."""
        env = _parse_env(_run([str(script), "up"], timeout=900))
        missing = {"SLURM_REST_URL", "SLURM_USER_NAME", "SLURM_JWT_FILE"} - env.keys()
        if missing:
            raise SlurmBedError(f"{script} up printed no {', '.join(sorted(missing))}")
        return cls(
            env["SLURM_REST_URL"], env["SLURM_USER_NAME"], Path(env["SLURM_JWT_FILE"]), script, _foreign(env)
        )

    # scontrol and REST

    def scontrol(self, *args: str) -> str:
        """`scontrol ARGS...` inside the chroot; its stdout, or SlurmBedError with its stderr."""
        return _run([str(self.script), "scontrol", *args], timeout=60)

    def scontrol_quiet(self, *args: str) -> None:
        """scontrol for clean-up: an object that is already gone is fine."""
        try:
            self.scontrol(*args)
        except SlurmBedError as error:
            # scontrol delete of an unknown partition or node: "Invalid ... name specified".
            if "name specified" not in str(error):
                raise

    def token(self) -> str:
        return self.jwt_file.read_text().strip().removeprefix("SLURM_JWT=")

    def rest(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """A raw slurmrestd call (`path` below /slurm/v0.0.44)."""
        headers = {"X-SLURM-USER-NAME": self.user_name, "X-SLURM-USER-TOKEN": self.token()}
        url = f"{self.rest_url}/slurm/v0.0.44{path}"
        return httpx.request(method, url, headers=headers, json=body, timeout=30)

    @property
    def root(self) -> Path:
        """The chroot the daemons run in."""
        return self.jwt_file.parent / "root"

    def extra_slurmrestd(self) -> ExtraRestd:
        """A slurmrestd of the caller's own on a free port (stop it with `.stop()`)."""
        restd = ExtraRestd(self, _free_port())
        restd.start()
        return restd

    def unreachable_controller_slurmrestd(self) -> ExtraRestd:
        """A slurmrestd of the caller's own whose slurmctld never answers (stop it with `.stop()`).

        It reads a copy of the bed's configuration that names port 1 as SlurmctldPort, where
        nothing listens and nothing unprivileged can: to its clients it looks exactly like a
        stopped slurmctld (502, error 1800 after slurmrestd's own retries), while every other
        test keeps the shared slurmctld.
        """
        port = _free_port()
        conf_dir = self.root / f"run/slurm/unreachable-{port}"
        conf_dir.mkdir(parents=True, exist_ok=True)
        source = self.root / "etc/slurm"
        for name in ("gres.conf", "plugstack.conf"):  # read from slurm.conf's own directory
            if (source / name).exists():
                shutil.copy(source / name, conf_dir / name)
        conf = (source / "slurm.conf").read_text()
        (conf_dir / "slurm.conf").write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=1", conf))
        conf_dir.chmod(0o755)
        for path in conf_dir.iterdir():
            path.chmod(0o644)
        restd = ExtraRestd(self, port, slurm_conf=f"/run/slurm/unreachable-{port}/slurm.conf")
        restd.start()
        return restd

    def mint_token(self, path: Path, lifespan: int) -> None:
        """A token for the bridge's Slurm user, valid `lifespan` seconds, renamed into `path`."""
        token = self.scontrol("token", f"username={self.user_name}", f"lifespan={lifespan}")
        token = token.strip().removeprefix("SLURM_JWT=")
        if not token:
            raise SlurmBedError("scontrol token printed nothing")
        staged = path.with_name(f".{path.name}.new")
        staged.write_text(token)
        staged.replace(path)

    def write_expired_token(self, path: Path) -> None:
        """A token for the bridge's Slurm user that expired a minute ago, renamed into `path`.

        Signed HS256 with the bed's own key (/etc/slurm/jwt_hs256.key), as `scontrol token`
        signs them, so slurmrestd refuses it for its expiry only; no waiting for one to run out.
        """
        key = (self.root / "etc/slurm/jwt_hs256.key").read_bytes()
        now = int(time.time())

        def part(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        header = part(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        claims = part(json.dumps({"iat": now - 120, "exp": now - 60, "sun": self.user_name}).encode())
        signature = part(hmac.new(key, f"{header}.{claims}".encode(), hashlib.sha256).digest())
        staged = path.with_name(f".{path.name}.new")
        staged.write_text(f"{header}.{claims}.{signature}")
        staged.replace(path)

    @staticmethod
    def token_in(path: Path) -> str:
        return path.read_text().strip().removeprefix("SLURM_JWT=")

    # Partitions, nodes, jobs

    def make_partition(
        self,
        nodes: int = 1,
        cpus: int = 4,
        memory_mb: int = 8000,
        gres: str | Sequence[str] | None = None,
    ) -> TestPartition:
        """Fresh external nodes (NodeAddr 127.0.0.1) and a partition of exactly those nodes.

        `gres` is every node's Gres ("gpu:2"), or one per node (["gpu:1", "gpu:2"], "" for none).
        """
        name = f"sbt-{secrets.token_hex(4)}"
        node_names = [f"{name}-n{index}" for index in range(1, nodes + 1)]
        partition = TestPartition(self, name, node_names, cpus, memory_mb)
        per_node = [gres or ""] * nodes if gres is None or isinstance(gres, str) else list(gres)
        if len(per_node) != nodes:
            raise ValueError(f"{len(per_node)} gres for {nodes} nodes")
        node_args = [
            "State=EXTERNAL",
            "Sockets=1",
            f"CoresPerSocket={cpus}",
            "ThreadsPerCore=1",
            f"CPUs={cpus}",
            f"RealMemory={memory_mb}",
            # Not "slurm-bridge": that feature would add the nodes to the default partition.
            f"Features={name}",
            # A name that does not resolve stalls slurmctld ~10 s per allocation.
            "NodeAddr=127.0.0.1",
        ]
        # Nodes of one Gres are made together: one scontrol call per distinct Gres.
        by_gres: dict[str, list[str]] = {}
        for node, node_gres in zip(node_names, per_node, strict=True):
            by_gres.setdefault(node_gres, []).append(node)
        try:
            for node_gres, names in by_gres.items():
                extra = [f"Gres={node_gres}"] if node_gres else []
                self.scontrol("create", f"NodeName={compress(names)}", *node_args, *extra)
                if node_gres:
                    self._check_gres(names[0], node_gres)
            self.scontrol(
                "create",
                f"PartitionName={name}",
                f"Nodes={partition.nodes_expression}",
                "MaxTime=INFINITE",
                "State=UP",
            )
        except BaseException:
            partition.cleanup()
            raise
        return partition

    def _check_gres(self, node: str, gres: str) -> None:
        shown = self.scontrol("show", "node", node)
        if "Gres=(null)" in shown:
            # slurmctld drops a Gres its slurm.conf has no GresTypes for, silently.
            raise SlurmBedError(f"Gres={gres} was not applied to {node}: slurm.conf needs GresTypes")

    def delete_nodes(self, names: list[str]) -> None:
        # One by one: a hostlist with one unknown name would leave the others behind.
        for name in names:
            self._delete_node(name)

    def _delete_node(self, name: str) -> None:
        # Jobs that just ended may keep their node "busy" for a moment; retry briefly.
        busy: list[str] = []

        def deleted() -> bool:
            try:
                self.scontrol_quiet("delete", f"NodeName={name}")
            except SlurmBedError as error:
                if "busy" not in str(error).lower():
                    raise
                busy[:] = [str(error)]
                return False
            return True

        wait_until(deleted, lambda: f"node {name} deleted, not busy ({busy[-1]})", timeout=10, interval=0.1)

    def create_slurmd_node(self, name: str, cpus: int = 4, memory_mb: int = 8000) -> None:
        """A dynamic, non-external node: the nearest this bed gets to a `slurmd -Z` registration.

        No slurmd runs here, and `scontrol create` takes only State=FUTURE, CLOUD or EXTERNAL.
        A FUTURE node is left out of slurmrestd's node list (to the bridge, slurmd has not
        registered yet); State=CLOUD gives IDLE+CLOUD+POWERED_DOWN+DYNAMIC_NORM: DYNAMIC_NORM
        and not EXTERNAL, as a registered `slurmd -Z` node is, plus the power-save flags. Slurm
        allocates it, but a job there stays RUNNING+CONFIGURING (POWER_UP_NODE): no slurmd ever
        registers, and with no power saving configured the bed left one so for over 10 minutes.
        Delete it with `delete_nodes`.
        """
        self.scontrol(
            "create",
            f"NodeName={name}",
            "State=CLOUD",
            f"CPUs={cpus}",
            f"RealMemory={memory_mb}",
            "NodeAddr=127.0.0.1",  # a name that does not resolve stalls slurmctld
        )

    def node(self, name: str) -> dict[str, Any] | None:
        """A Slurm node as `scontrol --json show node` reports it (FUTURE nodes included); None if gone."""
        data = json.loads(self.scontrol("--future", "--json", "show", "node"))
        return next((node for node in data.get("nodes") or [] if node.get("name") == name), None)

    def jobs_in_partition(self, name: str) -> list[BedJob]:
        data = json.loads(self.scontrol("--json", "show", "job"))
        return [
            BedJob(int(job["job_id"]), tuple(job.get("job_state") or ()), str(job.get("comment") or ""))
            for job in data.get("jobs") or []
            if job.get("partition") == name
        ]

    def cancel_job(self, job_id: int) -> None:
        response = self.rest("DELETE", f"/job/{job_id}")
        if response.status_code != 200:
            raise SlurmBedError(f"cancelling job {job_id}: HTTP {response.status_code} {response.text[:300]}")

    def wait_for_ended_jobs(self, partition: str, timeout: float = 15.0) -> None:
        live: list[BedJob] = []

        def all_ended() -> bool:
            live[:] = [job for job in self.jobs_in_partition(partition) if not job.ended]
            return not live

        wait_until(
            all_ended, lambda: f"the jobs of partition {partition} ended (still live: {live})", timeout
        )

    def job_states(self, job_ids: Iterable[int]) -> dict[int, tuple[str, ...]]:
        """These jobs' states, from the cheap `GET /jobs/state/?job_id=A&job_id=B` (forgotten: absent)."""
        ids = sorted(set(job_ids))
        states: dict[int, tuple[str, ...]] = {}
        for start in range(0, len(ids), 500):
            # Repeat the parameter: a comma-separated list is refused (HTTP 500 or 422).
            query = "&".join(f"job_id={job_id}" for job_id in ids[start : start + 500])
            response = self.rest("GET", f"/jobs/state/?{query}")
            if response.status_code != 200:
                raise SlurmBedError(f"GET /jobs/state/: HTTP {response.status_code} {response.text[:300]}")
            for job in response.json().get("jobs") or []:
                # A heterogeneous job's components come as "<component id>+<offset>": each is
                # kept under its own id (the bridge's client folds them into the leader's).
                states[int(str(job["job_id"]).partition("+")[0])] = tuple(job.get("state") or ())
        return states

    # Foreign jobs: another user's, to fill Slurm the way a shared cluster is

    @property
    def foreign_user(self) -> ForeignUser:
        if self._foreign is None:
            # A bed made from the env file alone (bench/placement/): the same file has it.
            env_file = self.jwt_file.parent / "env"
            env = _parse_env(env_file.read_text()) if env_file.exists() else {}
            self._foreign = _foreign(env)
        if self._foreign is None:
            raise SlurmBedError(f"{self.script} up printed no SLURM_FOREIGN_USER_NAME: run it again")
        return self._foreign

    def submit_foreign_jobs(
        self,
        n: int,
        partition: str = DEFAULT_PARTITION,
        *,
        name: str = FOREIGN_JOB_NAME,
        concurrency: int = 8,
    ) -> list[int]:
        """Submit `n` held external jobs as the foreign user; their ids, in submission order.

        Held jobs never start, so they take no node: they only make Slurm busy
        (its job list, every listing the bridge asks for). Keep-alive HTTP on
        `concurrency` connections: 500 to 800 jobs/s here. Remove them with
        `cancel_foreign_jobs`: other sessions share this Slurm.
        """
        user = self.foreign_user
        body = {
            "job": {
                "name": name,
                "flags": ["EXTERNAL_JOB"],
                "hold": True,
                "nodes": "1",
                "partition": partition,
                "current_working_directory": "/tmp",
            }
        }
        headers = {"X-SLURM-USER-NAME": user.name, "X-SLURM-USER-TOKEN": user.token()}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        failed = threading.Event()  # after the first failure, the rest are not even tried

        def submit(client: httpx.Client) -> int | None:
            if failed.is_set():
                return None
            try:
                response = client.post("/job/submit", json=body)
                if response.status_code == 200:
                    return int(response.json()["job_id"])
                error = f"HTTP {response.status_code} {response.text[:300]}"
            except httpx.HTTPError as exc:
                error = repr(exc)
            failed.set()
            raise SlurmBedError(f"submitting a foreign job: {error}")

        url = f"{self.rest_url}/slurm/v0.0.44"
        with (
            httpx.Client(base_url=url, headers=headers, limits=limits, timeout=60) as client,
            ThreadPoolExecutor(concurrency) as pool,
        ):
            futures = [pool.submit(submit, client) for _ in range(n)]
        job_ids = [job_id for future in futures if future.exception() is None and (job_id := future.result())]
        if failed.is_set():
            if job_ids:
                self.cancel_foreign_jobs(job_ids)
            error = next(exc for future in futures if (exc := future.exception()))
            raise SlurmBedError(f"{len(job_ids)} of {n} foreign jobs submitted, then cancelled: {error}")
        return job_ids

    def cancel_foreign_jobs(self, job_ids: Iterable[int] | None = None, *, name: str | None = None) -> None:
        """Cancel the foreign user's jobs: those of `job_ids`, else all of them (or those called `name`).

        With the bridge's operator token and always filtered by the foreign user, so it can only
        ever cancel foreign jobs. (Not the foreign user's own token: when a non-operator signals
        another user's job, slurmctld 26.05 with accounting_storage/none deadlocks.)
        """
        self.cancel_jobs(job_ids, name=name, user_name=self.foreign_user.name)

    def cancel_jobs(
        self, job_ids: Iterable[int] | None = None, *, name: str | None = None, user_name: str | None = None
    ) -> None:
        """Cancel many jobs in one bulk `DELETE /jobs/`: those of `job_ids` (else every job of the
        user, or those called `name`), of `user_name` only (the bridge's user by default).

        One request, where cancelling 10,000 jobs one `DELETE /job/{id}` at a time takes minutes.
        Jobs that already ended, or that Slurm no longer knows, count as cancelled.
        """
        user = user_name or self.user_name
        request: dict[str, Any] = {"user_name": user}
        if job_ids is not None:
            request["jobs"] = [str(job_id) for job_id in job_ids]
            if not request["jobs"]:
                return
        if name is not None:
            request["job_name"] = name
        headers = {"X-SLURM-USER-NAME": self.user_name, "X-SLURM-USER-TOKEN": self.token()}
        response = httpx.request(
            "DELETE", f"{self.rest_url}/slurm/v0.0.44/jobs/", headers=headers, json=request, timeout=300
        )
        if response.status_code != 200:
            raise SlurmBedError(
                f"cancelling jobs of {user}: HTTP {response.status_code} {response.text[:300]}"
            )
        # Only failures are listed, per job.
        failures = [
            entry
            for entry in response.json().get("status") or []
            if (entry.get("error") or {}).get("code") not in (ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE)
        ]
        if failures:
            raise SlurmBedError(f"cancelling jobs of {user}: {len(failures)} refused, e.g. {failures[:3]}")

    # slurmctld

    @property
    def slurmctld_log(self) -> Path:
        return self.jwt_file.parent / "root" / "var" / "log" / "slurm" / "slurmctld.log"

    def job_start_times(self, job_ids: Iterable[int]) -> dict[int, datetime]:
        """When slurmctld started these jobs, to the millisecond, from its log (absent: not started)."""
        return {job_id: at for job_id, (at, _) in self.job_starts(job_ids).items()}

    def job_starts(self, job_ids: Iterable[int]) -> dict[int, tuple[datetime, str]]:
        """When and by which scheduler ("main" or "backfill") slurmctld started these jobs."""
        wanted = set(job_ids)
        starts: dict[int, tuple[datetime, str]] = {}
        with self.slurmctld_log.open(errors="replace") as log:
            for line in log:
                match = JOB_START_LINE.match(line)
                if match and (job_id := int(match["main"] or match["backfill"])) in wanted:
                    at = datetime.fromisoformat(match["time"]).replace(tzinfo=UTC)
                    starts[job_id] = (at, "main" if match["main"] else "backfill")
        return starts

    @property
    def slurmctld_pidfile(self) -> Path:
        return self.jwt_file.parent / "root" / "run" / "slurm" / "slurmctld.pid"

    def stop_slurmctld(self) -> None:
        """Stop slurmctld the way an outage would (SIGTERM via its pid file); slurmrestd stays up.

        Until `start()`, the bed holds slurm-sid.sh's lock: another session's
        `up` (or scontrol) waits instead of quietly restarting slurmctld.
        """
        self._partitions_to_restore = [spec for spec in self._partitions() if spec.dynamic]
        self._lock()
        try:
            pid = self._slurmctld_pid()
            os.kill(pid, signal.SIGTERM)
            wait_until(
                lambda: not Path(f"/proc/{pid}").exists(), f"slurmctld (pid {pid}) stopped", 30, interval=0.1
            )
        except BaseException:
            self._unlock()
            raise

    def start(self) -> None:
        """`slurm-sid.sh up` again (state kept), then re-create the dynamic partitions it forgot."""
        self._unlock()
        fresh = SlurmTestBed.up(self.script)
        self.rest_url, self.user_name, self.jwt_file = fresh.rest_url, fresh.user_name, fresh.jwt_file
        self._foreign = fresh._foreign or self._foreign
        existing = {spec.name for spec in self._partitions()}
        for spec in self._partitions_to_restore:
            if spec.name not in existing:
                try:
                    self.scontrol("create", *spec.create_args())
                except SlurmBedError as error:
                    # Its nodes were deleted meanwhile (a test or benchmark sharing this Slurm
                    # finished): nothing is left to restore.
                    if "Invalid node name" not in str(error):
                        raise
        self._partitions_to_restore = []

    def restart_slurmctld(self) -> None:
        self.stop_slurmctld()
        self.start()

    def _lock(self) -> None:
        fd = os.open(self.jwt_file.parent / ".lock", os.O_WRONLY | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits while a slurm-sid.sh command runs
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _slurmctld_pid(self) -> int:
        try:
            pid = int(self.slurmctld_pidfile.read_text().strip())
        except (OSError, ValueError) as error:
            raise SlurmBedError(f"no slurmctld pid in {self.slurmctld_pidfile}: {error}") from error
        # Only ever signal our own daemon: the pid must live in the bed's chroot.
        root = self.jwt_file.parent / "root"
        if os.path.realpath(f"/proc/{pid}/root") != os.path.realpath(root):
            raise SlurmBedError(f"pid {pid} from {self.slurmctld_pidfile} is not the bed's slurmctld")
        return pid

    def _partitions(self) -> list[PartitionSpec]:
        data = json.loads(self.scontrol("--json", "show", "partition"))
        return [PartitionSpec.from_json(partition) for partition in data.get("partitions") or []]


class PartitionSpec(NamedTuple):
    """What it takes to `scontrol create` a partition again."""

    name: str
    nodes: str
    max_time: str
    state: str
    dynamic: bool  # made by `scontrol create`, not slurm.conf (whose partitions use NodeSets)

    @classmethod
    def from_json(cls, partition: dict[str, Any]) -> PartitionSpec:
        max_time = (partition.get("maximums") or {}).get("time") or {}
        return cls(
            name=partition["name"],
            nodes=(partition.get("nodes") or {}).get("configured") or "",
            max_time="INFINITE" if max_time.get("infinite") else str(max_time.get("number", 0)),
            state=((partition.get("partition") or {}).get("state") or ["UP"])[0],
            dynamic=not partition.get("node_sets"),
        )

    def create_args(self) -> list[str]:
        return [
            f"PartitionName={self.name}",
            f"Nodes={self.nodes}",
            f"MaxTime={self.max_time}",
            f"State={self.state}",
        ]


def _run(command: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SlurmBedError(f"{' '.join(command)}: {error}") from error
    if done.returncode != 0:
        raise SlurmBedError(
            f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}"
        )
    return done.stdout


def _foreign(env: dict[str, str]) -> ForeignUser | None:
    if "SLURM_FOREIGN_USER_NAME" in env and "SLURM_FOREIGN_JWT_FILE" in env:
        return ForeignUser(env["SLURM_FOREIGN_USER_NAME"], Path(env["SLURM_FOREIGN_JWT_FILE"]))
    return None


def _parse_env(output: str) -> dict[str, str]:
    env = {}
    for line in output.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.startswith("SLURM_"):
            env[key] = value
    return env
