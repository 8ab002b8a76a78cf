"""The chart's own identity, enforced by a real authorizer (kube-apiserver v1.28, testbed/kube_real).

tests/deploy/test_rbac.py holds what the chart must grant (the request-to-grant mapping:
WORKER, WORKER_LEASES, WEBHOOK) and tests/e2e/test_rbac_in_use.py maps each request the bridge
sends to the grant an authorizer checks. Here the rendered chart's ServiceAccounts and RBAC are
applied to a real API server, and with tokens of those accounts (TokenRequest):

- the authorizer allows every grant of the mapping and nothing else the accounts could ask for,
  and the RBAC rules it resolves for them are exactly the mapping (nothing granted unused);
- the worker's own code, run with the worker's token, is never refused: a whole placement on
  real Slurm and Temporal (watchers, claim, binding, pending reason, eviction, Lease), and the
  node-sync, owner-lookup and deletion calls a placement does not make; the requests for API
  groups 1.28 does not serve (DRA, JobSet, LeaderWorkerSet, PodGroups) pass the authorizer too;
- `slurm-bridge doctor` finds every permission it checks.

The worker's requests are recorded with the status the API server answered (RecordingKubeClient),
so a refusal the code absorbs (a watcher backing off after a 403) fails the test all the same.
"""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from activities.kube import KubeActivities, KubeSettings
from activities.kube_reader import KubeReader
from activities.nodes import EVENT_NAMESPACE, NodeActivities
from activities.placement import PlacementActivities
from activities.slurm import SlurmActivities
from bridge import grouping, keys
from bridge.dra import RESOURCE_GROUP
from bridge.grouping import (
    BUILTIN_SCHEDULING_APIS,
    COSCHEDULING_PODGROUP,
    JOBSET,
    LWS,
    SCHEDULING_GROUP,
    Kind,
)
from bridge.models import PodRef
from bridge.node_actions import AddTaint, NodeActions, RemoveTaint, ReportEvent
from clients.kube_client import api_path, load_configuration
from clients.slurm_client import SlurmClient
from testbed.kube_real.apiserver import ApiServer
from testbed.kube_real.cluster import RealCluster
from testbed.slurm_bed import SlurmTestBed
from tests.deploy.chart import NAMESPACE, one
from tests.deploy.real_chart import (
    Account,
    Call,
    ChartIdentity,
    RecordingKubeClient,
    grants_used,
    refused,
)
from tests.deploy.test_rbac import WEBHOOK, WORKER, WORKER_LEASES, Grant
from tests.e2e.harness import bed_client, bed_settings, bound, finished_cleanly, job_id_of, make_pod
from worker.doctor import Doctor, DoctorSettings
from worker.main import Bridge
from worker.settings import load

Json = dict[str, Any]
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# Cluster-scoped resources of the mapping: checked without a namespace only.
CLUSTER_SCOPED = {"nodes", "namespaces", "deviceclasses", "resourceslices"}
# What neither component may touch in any way: credentials (the Slurm JWT and Temporal keys live
# in Secrets), exec and logs, node proxies, the cluster's RBAC and admission, other workloads.
OUT_OF_REACH = {
    ("", "secrets"),
    ("", "configmaps"),
    ("", "serviceaccounts"),
    ("", "serviceaccounts/token"),
    ("", "pods/exec"),
    ("", "pods/log"),
    ("", "pods/attach"),
    ("", "nodes/proxy"),
    ("", "nodes/status"),
    ("", "persistentvolumeclaims"),
    ("apps", "daemonsets"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    ("certificates.k8s.io", "certificatesigningrequests"),
}


def as_account(server: ApiServer, account: Account) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url,
        verify=server.tls_context(),
        headers={"Authorization": f"Bearer {account.token}"},
        timeout=30,
    )


async def may(client: httpx.AsyncClient, grant: Grant, namespace: str | None) -> bool:
    """The real authorizer's answer for the token's own account (SelfSubjectAccessReview)."""
    group, resource, verb = grant
    plural, _, sub = resource.partition("/")
    attributes = {"group": group, "resource": plural, "verb": verb}
    if sub:
        attributes["subresource"] = sub
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = await client.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=review)
    answer.raise_for_status()
    return bool(answer.json()["status"].get("allowed"))


async def decisions(
    client: httpx.AsyncClient, asked: Iterable[tuple[Grant, str | None]]
) -> dict[tuple[Grant, str | None], bool]:
    """Many reviews at once (a dozen in flight: each is a millisecond of the server's time)."""
    gate = asyncio.Semaphore(12)

    async def one_review(grant: Grant, namespace: str | None) -> bool:
        async with gate:
            return await may(client, grant, namespace)

    pairs = list(asked)
    answers = await asyncio.gather(*(one_review(g, n) for g, n in pairs))
    return dict(zip(pairs, answers, strict=True))


def expected_for(identity: ChartIdentity, account: Account, namespace: str | None) -> set[Grant]:
    """The mapping for this account where the request is made."""
    if account == identity.webhook:
        return set(WEBHOOK)
    assert account == identity.worker
    return WORKER | WORKER_LEASES if namespace == identity.namespace else set(WORKER)


# -- the authorizer -------------------------------------------------------------------------------


async def test_the_tokens_are_the_chart_service_accounts(
    real_apiserver: ApiServer, chart_identity: ChartIdentity
) -> None:
    for account in (chart_identity.worker, chart_identity.webhook):
        async with as_account(real_apiserver, account) as client:
            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            answer = await client.post("/apis/authentication.k8s.io/v1/selfsubjectreviews", json=review)
        user = answer.raise_for_status().json()["status"]["userInfo"]
        assert user["username"] == account.username
        assert f"system:serviceaccounts:{NAMESPACE}" in user["groups"]
    # The accounts the chart's pods run as, in the release namespace: the webhook's
    # matchConditions and BRIDGE_SERVICE_ACCOUNTS name the worker by exactly this username.
    assert chart_identity.worker.username == "system:serviceaccount:slurm-bridge:slurm-bridge"
    assert chart_identity.webhook.username == "system:serviceaccount:slurm-bridge:slurm-bridge-webhook"


async def test_the_authorizer_allows_the_mapping_and_refuses_everything_else(
    real_apiserver: ApiServer, chart_identity: ChartIdentity, real_cluster: RealCluster
) -> None:
    # Every resource the mapping names and some it must never reach, with every verb: cluster-wide
    # (the watchers list and watch all namespaces), in the release namespace (the Lease Role), and
    # in a namespace of users.
    mapping = WORKER | WORKER_LEASES | WEBHOOK
    resources = {(group, resource) for group, resource, _ in mapping} | OUT_OF_REACH
    wrong: list[str] = []
    for account in (chart_identity.worker, chart_identity.webhook):
        asked = [
            ((group, resource, verb), namespace)
            for group, resource in sorted(resources)
            for verb in VERBS
            for namespace in (None, chart_identity.namespace, real_cluster.namespace)
            if namespace is None or resource.split("/")[0] not in CLUSTER_SCOPED
        ]
        async with as_account(real_apiserver, account) as client:
            answers = await decisions(client, asked)
        for (grant, namespace), allowed in answers.items():
            if allowed != (grant in expected_for(chart_identity, account, namespace)):
                where = f"in {namespace}" if namespace else "cluster-wide"
                wrong.append(f"{account.name}: {grant} {where}: {'allowed' if allowed else 'refused'}")
    assert wrong == []


async def test_a_request_outside_the_mapping_is_refused(
    real_apiserver: ApiServer, chart_identity: ChartIdentity, real_cluster: RealCluster
) -> None:
    # Real requests, not reviews: the Slurm JWT's Secret, a pod of the users' own, another
    # namespace's Leases; the webhook's token may not even read pods.
    async with as_account(real_apiserver, chart_identity.worker) as worker:
        assert (
            await worker.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/slurm-bridge-token")
        ).status_code == 403
        pod = make_pod(real_cluster.namespace, "not-ours")
        assert (
            await worker.post(f"/api/v1/namespaces/{real_cluster.namespace}/pods", json=pod)
        ).status_code == 403
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{real_cluster.namespace}/leases/x"
        assert (await worker.get(leases)).status_code == 403
        # ... while what the mapping names passes the authorizer (404: allowed, and not there).
        assert (
            await worker.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/x")
        ).status_code == 404
    async with as_account(real_apiserver, chart_identity.webhook) as webhook:
        assert (await webhook.get("/api/v1/pods")).status_code == 403
        assert (await webhook.get("/api/v1/namespaces")).status_code == 200


def expanded(rules: Iterable[Json]) -> set[Grant]:
    found: set[Grant] = set()
    for rule in rules:
        assert not rule.get("resourceNames"), rule
        found |= {
            (group, resource, verb)
            for group in rule.get("apiGroups") or []
            for resource in rule.get("resources") or []
            for verb in rule.get("verbs") or []
        }
    return found


NonResourceRules = list[tuple[tuple[str, ...], tuple[str, ...]]]


async def rules_of(
    server: ApiServer, account: Account, namespace: str
) -> tuple[set[Grant], NonResourceRules]:
    """The RBAC rules the authorizer resolves for the token's account in `namespace`."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    async with as_account(server, account) as client:
        answer = await client.post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", json=review)
    status = answer.raise_for_status().json()["status"]
    assert not status.get("incomplete"), status.get("evaluationError")
    non_resource = {
        (tuple(r.get("nonResourceURLs") or []), tuple(r.get("verbs") or []))
        for r in status.get("nonResourceRules") or []
    }
    return expanded(status.get("resourceRules") or []), sorted(non_resource)


async def test_the_authorizer_resolves_exactly_the_mapping_for_each_account(
    real_apiserver: ApiServer, chart_identity: ChartIdentity, real_cluster: RealCluster
) -> None:
    # Minus what every account of the cluster has anyway (self reviews, discovery: the bystander's),
    # the rules the chart gives each account are the mapping: nothing granted that no code uses.
    for namespace in (chart_identity.namespace, real_cluster.namespace):
        anyone, anyone_else = await rules_of(real_apiserver, chart_identity.bystander, namespace)
        for account in (chart_identity.worker, chart_identity.webhook):
            rules, non_resource = await rules_of(real_apiserver, account, namespace)
            assert rules - anyone == expected_for(chart_identity, account, namespace), (
                account.name,
                namespace,
            )
            assert non_resource == anyone_else  # no extra non-resource URLs either


async def test_doctor_finds_every_permission_with_the_worker_token(
    real_apiserver: ApiServer, chart_identity: ChartIdentity, tmp_path: Path
) -> None:
    kubeconfig = real_apiserver.kubeconfig(tmp_path / "worker", token=chart_identity.worker.token)
    lease_namespace = env_of_worker(chart_identity)["LEASE_NAMESPACE"]
    settings = load(
        DoctorSettings, kubeconfig=str(kubeconfig), lease_namespace=lease_namespace, leader_election=True
    )
    checks = await Doctor(settings).kubernetes()
    assert [(c.name, c.status, c.detail) for c in checks if c.status != "ok"] == []
    assert len(checks) > 10  # the API server and each permission, not a short cut


def env_of_worker(identity: ChartIdentity) -> dict[str, str]:
    """The worker's settings as the chart renders them (its ConfigMap)."""
    data = one(identity.documents, "ConfigMap", "slurm-bridge")["data"]
    return {str(k): str(v) for k, v in data.items()}


# -- the worker's calls, with its token -------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker_client(
    server: ApiServer, identity: ChartIdentity, path: Path
) -> AsyncIterator[RecordingKubeClient]:
    """The worker's Kubernetes client as it runs in the chart's pod: the worker's token
    (a kubeconfig carrying it stands in for the mounted ServiceAccount token)."""
    kubeconfig = server.kubeconfig(path, token=identity.worker.token)
    client = RecordingKubeClient(await load_configuration(str(kubeconfig)))
    try:
        yield client
    finally:
        await client.close()


def assert_allowed(calls: list[Call]) -> None:
    assert calls, "no request was made"
    assert refused(calls) == []
    assert grants_used(calls) <= WORKER | WORKER_LEASES


def pod_condition_reason(pod: Json | None, reason: str) -> bool:
    return any(c.get("reason") == reason for c in ((pod or {}).get("status") or {}).get("conditions") or [])


@pytest.mark.slurm
async def test_a_placement_is_never_refused_with_the_worker_token(
    real_apiserver: ApiServer,
    chart_identity: ChartIdentity,
    slurm_bed: SlurmTestBed,
    temporal_client: Client,
    task_queue: str,
    tmp_path: Path,
) -> None:
    # tests/e2e/test_rbac_in_use.py's placement (bound; a second pod pending with Slurm's reason;
    # the first job cancelled under its pod, which is evicted; the second bound and finished),
    # with leader election on the chart's Lease namespace, against the real API server.
    partition = slurm_bed.make_partition(nodes=1)
    kube = RealCluster(real_apiserver, partition.name)  # the pods' namespace is the partition's
    slurm = bed_client(slurm_bed)
    ns = kube.namespace
    try:
        kube.create_node(partition.node_names[0], labels={keys.LABEL_EXTERNAL_NODE: "true"})
        settings = bed_settings(
            slurm_bed,
            real_apiserver.kubeconfig(tmp_path / "worker", token=chart_identity.worker.token),
            task_queue,
            partition=partition.name,
            leader_election=True,
            lease_namespace=env_of_worker(chart_identity)["LEASE_NAMESPACE"],
            # The chart's namespace, a Lease of this test's own: a Lease left by another test
            # would hold the election for its duration.
            lease_name=f"rbac-{uuid.uuid4().hex[:8]}",
        )
        async with worker_client(real_apiserver, chart_identity, tmp_path / "worker") as client:
            bridge = Bridge(temporal_client, client, slurm, settings, sandbox_every_workflow=True)
            running = asyncio.create_task(bridge.run())
            try:
                await asyncio.wait_for(bridge.pod_watcher.synced.wait(), 30)

                def pod(name: str) -> Json | None:
                    return kube.get_object("pods", name, ns)

                kube.create_object("pods", make_pod(ns, "first"))
                first = await kube.wait_for_async(lambda: p if bound(p := pod("first")) else None, 60)
                kube.create_object("pods", make_pod(ns, "second"))
                await kube.wait_for_async(lambda: pod_condition_reason(pod("second"), "Resources"), 60)
                job_id = job_id_of(first)
                assert job_id is not None
                await slurm.cancel_job(job_id)
                await kube.wait_for_async(
                    lambda: (p := pod("first")) is None or p["metadata"].get("deletionTimestamp"), 60
                )
                kube.set_pod_phase(ns, "first", "Failed")  # the kubelet (there is none) confirms the stop
                await kube.wait_for_async(lambda: bound(pod("second")), 60)
                kube.set_pod_phase(ns, "second", "Succeeded")
                await kube.wait_for_async(lambda: finished_cleanly(pod("second")), 60)
                await kube.wait_for_async(lambda: finished_cleanly(pod("first")), 60)
            finally:
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running  # the leader hands its Lease back: that write is recorded too
            calls = list(client.calls)
    finally:
        await slurm.close()
        kube.stop()
        partition.cleanup()

    assert_allowed(calls)
    used = grants_used(calls)
    # The run took every path it is meant to check, each allowed by the real authorizer.
    assert {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "get"),
        ("", "pods", "patch"),
        ("", "pods/binding", "create"),
        ("", "pods/status", "patch"),
        ("", "pods/eviction", "create"),
        ("", "events", "create"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    } <= used, used


async def test_node_sync_owner_lookups_and_deletion_are_never_refused_with_the_worker_token(
    real_apiserver: ApiServer, chart_identity: ChartIdentity, real_cluster: RealCluster, tmp_path: Path
) -> None:
    # The worker's calls a placement does not make, through its own code: node sync's taint edits
    # and node Events (a repeated one is counted by patches), owner lookups of Jobs, Deployments
    # (through their ReplicaSet) and StatefulSets, and deleting a pod a disruption budget kept
    # from eviction for too long (the release's `force_delete`).
    ns = real_cluster.namespace
    node_name = f"{ns}-node"
    node = real_cluster.create_node(node_name)
    uid = node["metadata"]["uid"]
    target = {"slurm_node": node_name, "kube_node": node_name, "kube_uid": uid}
    async with worker_client(real_apiserver, chart_identity, tmp_path / "worker") as client:
        # Slurm is never asked for these actions: a client of nothing stands in.
        nodes = NodeActivities(
            client,
            SlurmClient("http://127.0.0.1:9", user_name=None, token_file=None),
            scheduler_name="slurm-bridge-scheduler",
        )
        added = await nodes.apply_node_actions(NodeActions(actions=[AddTaint(**target)]))
        assert (len(added.applied), added.failed) == (1, []), added
        taints = (real_cluster.get_object("nodes", node_name) or {})["spec"].get("taints") or []
        assert keys.TAINT_MANAGED_NODE in [t["key"] for t in taints]
        event = ReportEvent(**target, reason="RbacCheck", message="the same event twice")
        removed = await nodes.apply_node_actions(NodeActions(actions=[event, event, RemoveTaint(**target)]))
        assert (len(removed.applied), removed.failed) == (3, []), removed
        taints = (real_cluster.get_object("nodes", node_name) or {})["spec"].get("taints") or []
        assert keys.TAINT_MANAGED_NODE not in [t["key"] for t in taints]
        events = [
            e
            for e in real_cluster.call("GET", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events")["items"]
            if e["involvedObject"].get("name") == node_name and e["reason"] == "RbacCheck"
        ]
        assert [e.get("count") for e in events] == [2]

        for pod, owner, annotations in owned_pods(real_cluster):
            group = await grouping.resolve(KubeReader(client), pod)
            assert dict(group.annotations) == annotations, owner

        doomed = real_cluster.create_object("pods", make_pod(ns, "doomed"))
        ref = PodRef(namespace=ns, name="doomed", uid=doomed["metadata"]["uid"])
        steps = PlacementActivities(
            KubeActivities(client, KubeSettings()),
            SlurmActivities(SlurmClient("http://127.0.0.1:9", user_name=None, token_file=None)),
        )
        assert await steps._evict(ref, "RbacCheck", "its job ended", force=True)
        assert real_cluster.get_object("pods", "doomed", ns) is None  # never bound: gone at once
        calls = list(client.calls)

    assert_allowed(calls)
    assert {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("batch", "jobs", "get"),
        ("apps", "replicasets", "get"),
        ("apps", "deployments", "get"),
        ("apps", "statefulsets", "get"),
        ("", "pods", "delete"),
    } <= grants_used(calls)


def controlled_by(owner: Json) -> list[Json]:
    meta = owner["metadata"]
    return [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }
    ]


def template(labels: dict[str, str], restart: str = "Always") -> Json:
    return {
        "metadata": {"labels": labels},
        "spec": {"restartPolicy": restart, "containers": [{"name": "main", "image": "busybox"}]},
    }


def owned_pods(cluster: RealCluster) -> list[tuple[Json, str, dict[str, str]]]:
    """Pods owned (no controller runs here: by hand) by a Job, a Deployment's ReplicaSet and a
    StatefulSet, each top owner annotated: (pod, its owner, the annotations its group takes)."""
    ns = cluster.namespace
    notes = {keys.SLURMJOB_PREFIX + "timelimit": "30"}
    labels = {"app": "owned"}
    selector = {"matchLabels": labels}
    job = cluster.call(
        "POST",
        f"/apis/batch/v1/namespaces/{ns}/jobs",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "job", "annotations": notes},
            "spec": {"template": template({}, "Never")},
        },
    )
    deployment = cluster.call(
        "POST",
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "deploy", "annotations": notes},
            "spec": {"selector": selector, "template": template(labels)},
        },
    )
    replica_set = cluster.call(
        "POST",
        f"/apis/apps/v1/namespaces/{ns}/replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "deploy-1", "ownerReferences": controlled_by(deployment)},
            "spec": {"selector": selector, "template": template(labels)},
        },
    )
    stateful_set = cluster.call(
        "POST",
        f"/apis/apps/v1/namespaces/{ns}/statefulsets",
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "sts", "annotations": notes},
            "spec": {"selector": selector, "serviceName": "sts", "template": template(labels)},
        },
    )
    owned = []
    for name, owner in (("job-pod", job), ("rs-pod", replica_set), ("sts-0", stateful_set)):
        pod = make_pod(ns, name)
        pod["metadata"]["ownerReferences"] = controlled_by(owner)
        owned.append(
            (cluster.create_object("pods", pod), f"{owner['kind']} {owner['metadata']['name']}", notes)
        )
    return owned


# -- API groups this server does not serve -------------------------------------------------------

UNSERVED_GROUPS = {JOBSET.group, LWS.group, COSCHEDULING_PODGROUP.group, SCHEDULING_GROUP, RESOURCE_GROUP}
CLAIMS = Kind(f"{RESOURCE_GROUP}/v1", "ResourceClaim", "resourceclaims")


def unserved_requests(namespace: str) -> list[tuple[str, str, dict[str, str]]]:
    """What the worker asks of JobSets, LeaderWorkerSets, both kinds of PodGroup, Workloads and
    DRA objects, at the versions its code reads (bridge/grouping.py, bridge/dra.py)."""

    def path(kind: Kind, name: str | None = None, sub: str | None = None) -> str:
        return api_path(
            kind.plural,
            namespace=namespace,
            name=name,
            subresource=sub,
            group=kind.group,
            version=kind.version,
        )

    asked: list[tuple[str, str, dict[str, str]]] = [
        ("GET", path(JOBSET, "x"), {}),
        ("GET", path(LWS, "x"), {}),
    ]
    for pod_group in (COSCHEDULING_PODGROUP, *(api.pod_group for api in BUILTIN_SCHEDULING_APIS)):
        asked += [
            ("GET", path(pod_group, "x"), {}),
            ("GET", path(pod_group), {}),
            # Bounded: where an e2e test of this session installed the stand-in CRD, the group is
            # served and the watch streams; the server ends it after timeoutSeconds.
            ("GET", path(pod_group), {"watch": "true", "timeoutSeconds": "1"}),
        ]
    for api in BUILTIN_SCHEDULING_APIS:
        asked += [("GET", path(api.workload, "x"), {}), ("PATCH", path(api.pod_group, "x", "status"), {})]
    asked += [
        ("GET", path(CLAIMS), {}),
        ("POST", path(CLAIMS), {}),
        ("DELETE", path(CLAIMS, "x"), {}),
        ("PATCH", path(CLAIMS, "x", "status"), {}),
        ("GET", api_path("deviceclasses", group=RESOURCE_GROUP), {}),
        ("GET", api_path("resourceslices", group=RESOURCE_GROUP), {}),
    ]
    return asked


async def test_the_worker_passes_the_authorizer_for_groups_this_server_does_not_serve(
    real_apiserver: ApiServer, chart_identity: ChartIdentity, real_cluster: RealCluster
) -> None:
    # Kubernetes 1.28 serves none of these groups (or versions), but authorizes before it routes:
    # the worker's requests are let through to a 404, an account without the grants is refused.
    # So the grants of the mapping no placement here can use are checked on real requests too.
    asked = unserved_requests(real_cluster.namespace)
    answers: dict[str, list[Call]] = {}
    for account in (chart_identity.worker, chart_identity.bystander):
        async with as_account(real_apiserver, account) as client:
            answers[account.name] = []
            for method, path, query in asked:
                headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
                body = b"{}" if method in ("POST", "PATCH") else None
                answer = await client.request(method, path, params=query, content=body, headers=headers)
                answers[account.name].append(Call(method, path, query, answer.status_code))
    worker = answers[chart_identity.worker.name]
    # Past the authorizer: 404 on this server, or the stand-in CRD's own answer when an e2e test
    # of this session installed one (testbed/kube_real/crds.py); never 401 or 403.
    assert [str(c) for c in worker if c.status in (401, 403)] == []
    assert any(c.status == 404 for c in worker)
    assert [str(c) for c in answers[chart_identity.bystander.name] if c.status != 403] == []
    # Every grant of the mapping in these groups was asked for.
    assert grants_used(worker) == {g for g in WORKER if g[0] in UNSERVED_GROUPS}


async def test_the_webhook_passes_the_authorizer_for_device_classes_this_server_does_not_serve(
    real_apiserver: ApiServer, chart_identity: ChartIdentity
) -> None:
    # The webhook's DeviceClass cache (webhook/device_classes.py): a list, a watch, a get of one
    # class. 1.28 serves no resource.k8s.io, but authorizes first: the webhook's token gets the
    # 404 it takes as "no DeviceClasses", an account without the grant a 403.
    classes = api_path("deviceclasses", group=RESOURCE_GROUP)
    asked = [("GET", classes, {}), ("GET", classes, {"watch": "true"}), ("GET", f"{classes}/x", {})]
    answers: dict[str, list[Call]] = {}
    for account in (chart_identity.webhook, chart_identity.bystander):
        async with as_account(real_apiserver, account) as client:
            answers[account.name] = [
                Call(method, path, query, (await client.request(method, path, params=query)).status_code)
                for method, path, query in asked
            ]
    webhook = answers[chart_identity.webhook.name]
    assert [str(c) for c in webhook if c.status != 404] == []
    assert [str(c) for c in answers[chart_identity.bystander.name] if c.status != 403] == []
    assert grants_used(webhook) == {g for g in WEBHOOK if g[0] == RESOURCE_GROUP}
