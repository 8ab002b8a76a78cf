"""RBAC grants exactly the verbs the bridge uses: no wildcards, nothing more, nothing less."""

from tests.deploy.chart import NAMESPACE, Manifest, find, manifests, one, walk

Grant = tuple[str, str, str]  # (API group, resource, verb)


def grants(*verbs_by_resource: tuple[str, list[str], list[str]]) -> set[Grant]:
    return {(group, r, v) for group, resources, verbs in verbs_by_resource for r in resources for v in verbs}


WORKER = grants(
    ("", ["pods"], ["get", "list", "watch", "patch", "delete"]),
    ("", ["pods/binding"], ["create"]),
    ("", ["pods/eviction"], ["create"]),
    ("", ["pods/status"], ["patch"]),
    ("", ["events"], ["create", "patch"]),
    ("", ["nodes"], ["get", "list", "watch", "patch"]),
    # Owner lookups for workload grouping: read-only single gets.
    ("batch", ["jobs"], ["get"]),
    ("apps", ["replicasets", "deployments", "statefulsets"], ["get"]),
    ("jobset.x-k8s.io", ["jobsets"], ["get"]),
    ("leaderworkerset.x-k8s.io", ["leaderworkersets"], ["get"]),
    # PodGroups: owner lookups, and a watch while a pod waits for its PodGroup to be created.
    ("scheduling.x-k8s.io", ["podgroups"], ["get", "list", "watch"]),
    ("scheduling.k8s.io", ["podgroups"], ["get", "list", "watch"]),
    ("scheduling.k8s.io", ["workloads"], ["get"]),
    # The built-in PodGroup's PodGroupScheduled condition.
    ("scheduling.k8s.io", ["podgroups/status"], ["patch"]),
    # DRA claims pinned to Slurm's devices (activities/dra.py).
    ("resource.k8s.io", ["resourceclaims"], ["list", "create", "delete"]),
    ("resource.k8s.io", ["resourceclaims/status"], ["patch"]),
    ("resource.k8s.io", ["deviceclasses", "resourceslices"], ["list"]),
)
WORKER_LEASES = grants(("coordination.k8s.io", ["leases"], ["get", "create", "update"]))
WEBHOOK = grants(
    ("", ["namespaces"], ["get", "list", "watch"]),
    # The cluster's DeviceClasses (list + watch into a cache, a get for one not cached yet):
    # a pod asking for one that does not exist is refused (webhook/device_classes.py).
    ("resource.k8s.io", ["deviceclasses"], ["get", "list", "watch"]),
)


def granted(role: Manifest) -> set[Grant]:
    found: set[Grant] = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule
        assert "nonResourceURLs" not in rule
        found |= grants(*((group, rule["resources"], rule["verbs"]) for group in rule["apiGroups"]))
    return found


def bound_to(documents: list[Manifest], kind: str, role: str) -> set[str]:
    subjects = set()
    for binding in find(documents, kind):
        if binding["roleRef"]["name"] == role:
            subjects |= {
                f"{s['namespace']}/{s['name']}" for s in binding["subjects"] if s["kind"] == "ServiceAccount"
            }
    return subjects


def test_no_wildcards_anywhere() -> None:
    documents = manifests()
    roles = find(documents, "ClusterRole") + find(documents, "Role")
    assert roles
    for role in roles:
        for value in walk(role["rules"]):
            assert value != "*", f"wildcard in {role['kind']} {role['metadata']['name']}"
    assert all(b["roleRef"]["name"] != "cluster-admin" for b in find(documents, "ClusterRoleBinding"))


def test_worker_gets_exactly_its_verbs() -> None:
    documents = manifests()
    role = one(documents, "ClusterRole", "slurm-bridge")
    assert granted(role) == WORKER
    assert bound_to(documents, "ClusterRoleBinding", "slurm-bridge") == {f"{NAMESPACE}/slurm-bridge"}
    # Leases only in the release namespace.
    leases = one(documents, "Role")
    assert leases["metadata"]["namespace"] == NAMESPACE
    assert granted(leases) == WORKER_LEASES
    assert bound_to(documents, "RoleBinding", leases["metadata"]["name"]) == {f"{NAMESPACE}/slurm-bridge"}
    worker = one(documents, "Deployment", "slurm-bridge")
    assert worker["spec"]["template"]["spec"]["serviceAccountName"] == "slurm-bridge"


def test_webhook_only_reads_namespaces_and_device_classes() -> None:
    documents = manifests()
    assert granted(one(documents, "ClusterRole", "slurm-bridge-webhook")) == WEBHOOK
    assert bound_to(documents, "ClusterRoleBinding", "slurm-bridge-webhook") == {
        f"{NAMESPACE}/slurm-bridge-webhook"
    }
    webhook = one(documents, "Deployment", "slurm-bridge-webhook")
    assert webhook["spec"]["template"]["spec"]["serviceAccountName"] == "slurm-bridge-webhook"


def test_all_grants_of_the_chart() -> None:
    # Every role the chart renders, together: nothing beyond the two sets above.
    documents = manifests()
    everything = set().union(*(granted(r) for r in find(documents, "ClusterRole") + find(documents, "Role")))
    assert everything == WORKER | WORKER_LEASES | WEBHOOK


def test_rbac_can_be_left_to_the_cluster_admin() -> None:
    documents = manifests({"rbac": {"create": False}})
    kinds = {d["kind"] for d in documents}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
