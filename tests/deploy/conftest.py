"""The chart installed on the real API server (tests/kube_real), for the tests that need it.

Session-wide, as the API server is: the chart's accounts and RBAC are cluster-scoped in part
(ClusterRoles and their bindings), and installing them again would change nothing.
"""

from collections.abc import Iterator

import pytest

from tests.deploy.chart import NAMESPACE, manifests
from tests.deploy.real_chart import ChartIdentity, install_identity
from tests.kube_real.apiserver import ApiServer
from tests.kube_real.cluster import RealCluster


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
