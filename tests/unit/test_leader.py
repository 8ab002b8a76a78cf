"""Lease leader election against the fake API server over real HTTP.

Each candidate has its own connection, as separate replicas would. Timings are
short (a 1 s lease), so some waits are bounded real time: that is what is under
test. A shared counter checks that two `lead()` calls never overlap.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from clients.kube_client import Json, KubeClient
from clients.leader import LeaderElector, LeaderTimings
from testbed.kube_fake import FakeKubeServer
from testbed.waiting import until
from worker.settings import ConfigurationError, WorkerSettings, load_settings

FAST = LeaderTimings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.2)
LEASES = r"^/apis/coordination\.k8s\.io/v1/namespaces/default/leases"


class Work:
    """What leaders do: counts who leads, and fails the test if two ever do at once."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.most_at_once = 0
        self.log: list[str] = []
        self.changed = asyncio.Condition()

    def lead(self, who: str) -> Callable[[], Awaitable[None]]:
        async def lead() -> None:
            self.active.add(who)
            self.most_at_once = max(self.most_at_once, len(self.active))
            try:
                await self._note(f"{who} leads")
                await asyncio.Event().wait()  # until cancelled
            finally:
                self.active.discard(who)
                await self._note(f"{who} stops")

        return lead

    async def until(self, predicate: Callable[["Work"], bool], timeout: float = 10.0) -> float:
        """Wait until `predicate(self)` after a change of leader; returns the seconds it took."""
        started = time.monotonic()
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: predicate(self)), timeout)
        return time.monotonic() - started

    async def _note(self, entry: str) -> None:
        self.log.append(entry)
        async with self.changed:
            self.changed.notify_all()


class Candidates:
    """Electors on one fake API server, each on its own connection, run as tasks."""

    def __init__(self, kube: FakeKubeServer) -> None:
        self.kube = kube
        self.work = Work()
        self.electors: dict[str, LeaderElector] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.clients: list[KubeClient] = []

    def start(self, who: str, timings: LeaderTimings = FAST, *, release: bool = True) -> LeaderElector:
        client = KubeClient(self.kube.aio_configuration())
        self.clients.append(client)
        elector = LeaderElector(client, "default", "bridge", who, timings, release_on_cancel=release)
        self.electors[who] = elector
        self.tasks[who] = asyncio.create_task(elector.run(self.work.lead(who)), name=f"elector {who}")
        return elector

    async def stop(self, who: str) -> None:
        task = self.tasks.pop(who)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def leaders(self) -> list[str]:
        return [who for who, elector in self.electors.items() if elector.is_leader and who in self.tasks]

    def lease(self) -> Json:
        lease = self.kube.get_object("leases.coordination.k8s.io", "bridge", "default")
        assert lease is not None
        spec: Json = lease["spec"]
        return spec

    async def close(self) -> None:
        for who in list(self.tasks):
            await self.stop(who)
        for client in self.clients:
            await client.close()


@pytest.fixture
async def candidates(kube: FakeKubeServer) -> AsyncIterator[Candidates]:
    running = Candidates(kube)
    yield running
    await running.close()
    assert running.work.most_at_once <= 1, running.work.log


def writes(kube: FakeKubeServer) -> int:
    return sum(1 for r in kube.requests if r.method in ("POST", "PUT") and "/leases" in r.path)


async def test_one_of_two_candidates_leads_and_keeps_renewing(
    kube: FakeKubeServer, candidates: Candidates
) -> None:
    a, b = candidates.start("a"), candidates.start("b")
    await candidates.work.until(lambda w: len(w.active) == 1)
    await kube.wait_for_async(lambda: writes(kube) >= 6)  # five renewals after the create
    [leader] = candidates.leaders()
    standby = b if leader == "a" else a
    await kube.wait_for_async(lambda: standby.leader == leader)
    assert candidates.work.log == [f"{leader} leads"]
    assert standby.leader == leader
    assert not standby.is_leader
    spec = candidates.lease()
    assert spec["holderIdentity"] == leader
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0
    assert spec["renewTime"] > spec["acquireTime"]
    assert a.healthy
    assert b.healthy


async def test_a_clean_stop_hands_over_without_waiting_for_the_lease(candidates: Candidates) -> None:
    slow = LeaderTimings(lease_duration=5.0, renew_deadline=2.0, retry_period=0.2)
    candidates.start("a", slow)
    await candidates.work.until(lambda w: w.active == {"a"})
    candidates.start("b", slow)
    await candidates.kube.wait_for_async(lambda: candidates.electors["b"].leader == "a")
    started = time.monotonic()
    await candidates.stop("a")
    await candidates.work.until(lambda w: w.active == {"b"})
    assert time.monotonic() - started < 2.5  # a lease of 5 s was not waited out
    assert candidates.work.log == ["a leads", "a stops", "b leads"]
    spec = candidates.lease()
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)


async def test_a_leader_that_dies_is_replaced_after_the_lease_duration(candidates: Candidates) -> None:
    candidates.start("a", release=False)
    await candidates.work.until(lambda w: w.active == {"a"})
    candidates.start("b")
    await candidates.kube.wait_for_async(lambda: candidates.electors["b"].leader == "a")
    started = time.monotonic()
    await candidates.stop("a")  # gone without a word: the Lease still names it
    assert candidates.lease()["holderIdentity"] == "a"
    took = await candidates.work.until(lambda w: w.active == {"b"})
    # b waits a lease duration after the last renewal it saw (at most one retry period before the stop).
    assert took >= FAST.lease_duration - FAST.retry_period - 0.1
    assert time.monotonic() - started < 4.0
    spec = candidates.lease()
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)


async def test_the_leader_stops_at_once_when_another_holder_takes_the_lease(
    kube: FakeKubeServer, candidates: Candidates
) -> None:
    a = candidates.start("a")
    await candidates.work.until(lambda w: w.active == {"a"})

    def intrude(lease: Json) -> None:
        lease["spec"].update(holderIdentity="intruder", leaseDurationSeconds=30)

    kube.update_object("leases.coordination.k8s.io", "bridge", intrude, "default")
    took = await candidates.work.until(lambda w: not w.active)
    assert took < FAST.renew_deadline  # seen at its next renewal, not after the deadline
    assert not a.is_leader
    assert a.leader == "intruder"
    # It keeps competing, and leaves a valid lease of someone else alone.
    kube.clear_requests()
    await kube.wait_for_async(lambda: sum(r.method == "GET" for r in kube.requests) >= 3)
    assert writes(kube) == 0
    assert candidates.lease()["holderIdentity"] == "intruder"
    assert a.healthy


@pytest.mark.parametrize("fault", ["errors", "hangs"])
async def test_a_leader_that_cannot_renew_stops_within_the_renew_deadline(
    kube: FakeKubeServer, candidates: Candidates, fault: str
) -> None:
    a = candidates.start("a")
    await candidates.work.until(lambda w: w.active == {"a"})
    await kube.wait_for_async(lambda: writes(kube) >= 2)  # renewing
    if fault == "errors":
        kube.fail_next("*", LEASES, 500, count=1_000_000)
    else:
        kube.delay_next("*", LEASES, 30.0, count=1_000_000)
    took = await candidates.work.until(lambda w: not w.active)
    # It kept trying until the deadline (its last renewal was at most one retry period
    # before the fault), and stopped well before anyone else could take the lease.
    assert FAST.renew_deadline - FAST.retry_period - 0.1 <= took < FAST.lease_duration
    assert not a.is_leader
    # Unhealthy once the API server has been silent for a lease duration: computed when asked.
    problem = await until(a.check, "the elector to report itself unhealthy", timeout=5)
    assert "no answer about Lease default/bridge" in problem


async def test_never_two_leaders_through_crashes_and_restarts(candidates: Candidates) -> None:
    for who in ("a", "b", "c"):
        candidates.start(who)
    for turn in range(4):
        await candidates.work.until(lambda w: len(w.active) == 1)
        [leader] = candidates.work.active
        # Every other leader crashes: its successor waits out the lease it still holds.
        candidates.electors[leader].release_on_cancel = turn % 2 == 0
        await candidates.stop(leader)
        candidates.start(f"{leader}{turn}")
    await candidates.work.until(lambda w: len(w.active) == 1)
    assert candidates.work.most_at_once == 1


async def test_work_that_ends_by_itself_gives_the_lease_up(kube: FakeKubeServer) -> None:
    client = KubeClient(kube.aio_configuration())
    calls: list[int] = []
    second = asyncio.Event()

    async def lead() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("work failed")
        second.set()
        await asyncio.Event().wait()

    elector = LeaderElector(client, "default", "bridge", "a", FAST)
    task = asyncio.create_task(elector.run(lead))
    try:
        await asyncio.wait_for(second.wait(), 5)
        released = [r for r in kube.requests if r.method == "PUT" and r.body["spec"]["holderIdentity"] == ""]
        assert len(released) == 1
        assert released[0].body["spec"]["leaseDurationSeconds"] == 1
        assert elector.is_leader
        assert elector.terms == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()
    assert not elector.is_leader
    assert elector.check() == "leader election is not running"
    assert kube.get_object("leases.coordination.k8s.io", "bridge", "default")["spec"]["holderIdentity"] == ""


def test_timings_are_checked_as_client_go_does() -> None:
    assert LeaderTimings().lease_duration_seconds == 15
    assert LeaderTimings(1.5, 1.0, 0.2).lease_duration_seconds == 2
    with pytest.raises(ValueError, match="lease duration must be greater"):
        LeaderTimings(10, 10, 2)
    with pytest.raises(ValueError, match=r"renew deadline must be greater than 1\.2"):
        LeaderTimings(15, 2.4, 2)


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    path.write_text("x")
    return path


def test_leader_settings(monkeypatch: pytest.MonkeyPatch, token: Path, tmp_path: Path) -> None:
    monkeypatch.setattr(WorkerSettings, "service_account_namespace_file", tmp_path / "missing")
    settings = load_settings(slurm_jwt_file=token)
    assert not settings.leader_election
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (15, 10, 2)
    assert (settings.lease_name, settings.lease_namespace) == ("slurm-bridge", "default")

    mounted = tmp_path / "namespace"
    mounted.write_text("slurm-bridge-system\n")
    monkeypatch.setattr(WorkerSettings, "service_account_namespace_file", mounted)
    monkeypatch.setenv("LEADER_ELECTION", "true")
    monkeypatch.setenv("LEASE_DURATION", "30")
    settings = load_settings(slurm_jwt_file=token, renew_deadline=20.0)
    assert settings.leader_election
    assert settings.lease_namespace == "slurm-bridge-system"
    assert LeaderTimings(settings.lease_duration, settings.renew_deadline, settings.retry_period)
    assert load_settings(slurm_jwt_file=token, lease_namespace="ops").lease_namespace == "ops"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"renew_deadline": 15.0}, "invalid setting RENEW_DEADLINE (--renew-deadline): must be less than"),
        ({"retry_period": 9.0}, "invalid setting RETRY_PERIOD (--retry-period): 1.2 x RETRY_PERIOD"),
        ({"lease_duration": 0.5}, "invalid setting LEASE_DURATION"),
        ({"lease_name": "Not_A_Name"}, "invalid setting LEASE_NAME"),
    ],
)
def test_leader_settings_errors_are_one_line(token: Path, overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        load_settings(slurm_jwt_file=token, **overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)
