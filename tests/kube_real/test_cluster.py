"""The real-API-server test bed does what the harness relies on (its own checks, on the real server)."""

import httpx

from testbed.kube_real.apiserver import ApiServer
from testbed.kube_real.cluster import NOT_READY_TAINT, RealCluster
from testbed.waiting import wait_until
from tests.deploy.real_chart import ChartIdentity


def test_a_ready_node_has_no_not_ready_taint_and_a_new_one_keeps_it(real_cluster: RealCluster) -> None:
    ready = real_cluster.create_node(f"{real_cluster.namespace}-ready")
    waiting = real_cluster.create_node(f"{real_cluster.namespace}-waiting", ready=False)
    assert not [t for t in ready["spec"].get("taints") or [] if t["key"] == NOT_READY_TAINT]
    # The API server's admission taints every new node; only the node lifecycle controller lifts it.
    assert [t["effect"] for t in waiting["spec"]["taints"] if t["key"] == NOT_READY_TAINT] == ["NoSchedule"]


def test_waits_follow_the_pod_through_its_watch(real_cluster: RealCluster) -> None:
    ns = real_cluster.namespace
    pod = {"metadata": {"name": "p", "namespace": ns}, "spec": {"containers": [{"name": "m", "image": "x"}]}}
    real_cluster.create_object("pods", pod)
    assert (real_cluster.get_object("pods", "p", ns) or {})["status"]["phase"] == "Pending"
    real_cluster.set_pod_phase(ns, "p", "Running")

    def phase() -> str | None:
        return str((real_cluster.get_object("pods", "p", ns) or {})["status"].get("phase"))

    assert real_cluster.wait_for(lambda: phase() == "Running", 5)


def test_the_audit_log_names_what_an_account_was_refused(
    real_apiserver: ApiServer, chart_identity: ChartIdentity
) -> None:
    """What the e2e stacks rely on to fail a test whose bridge was refused anything."""
    since = real_apiserver.audit_offset()
    account = chart_identity.bystander  # bound to nothing by the chart
    answer = httpx.get(
        f"{real_apiserver.url}/api/v1/pods",
        headers={"Authorization": f"Bearer {account.token}"},
        verify=real_apiserver.tls_context(),
    )
    assert answer.status_code == 403

    def refused() -> list[str]:
        return real_apiserver.refused(account.username, since)

    # The audit log is written shortly after the answer (by another process: polled).
    wait_until(refused, "the refusal in the audit log", timeout=10, interval=0.1)
    assert refused() == ["list /api/v1/pods -> 403"]
