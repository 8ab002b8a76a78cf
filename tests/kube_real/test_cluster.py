"""The real-API-server test bed does what the harness relies on (its own checks, on the real server)."""

from tests.kube_real.cluster import NOT_READY_TAINT, RealCluster


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
