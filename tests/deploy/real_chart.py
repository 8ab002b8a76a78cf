"""The chart's own identity on the real API server (testbed/kube_real): its ServiceAccounts and RBAC
applied as `helm install` would, tokens of those accounts, and what a client sent with them.

The chart is rendered with Helm's engine (tests/deploy/chart.py); its ServiceAccounts, Roles,
ClusterRoles and bindings are applied by server-side apply, so applying twice (every test module
of a session asks) changes nothing. The release namespace is created first, as
`helm install --create-namespace` does (the chart renders no Namespace). Tokens come from
TokenRequest, as the kubelet mounts them into the chart's pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clients.kube_client import KubeClient
from testbed.kube_fake.faults import RecordedRequest
from testbed.kube_real.cluster import RealCluster
from tests.deploy.chart import NAMESPACE, Manifest, one
from tests.deploy.test_rbac import Grant
from tests.e2e.test_rbac_in_use import PATH, authorized_as

Json = dict[str, Any]
IDENTITY_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# apiVersion/kind -> (API prefix, plural, namespaced): the kinds this module applies.
KINDS: dict[tuple[str, str], tuple[str, str, bool]] = {
    ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): (
        "/apis/rbac.authorization.k8s.io/v1",
        "clusterroles",
        False,
    ),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1",
        "clusterrolebindings",
        False,
    ),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1",
        "rolebindings",
        True,
    ),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
}
FIELD_MANAGER = "slurm-bridge-tests"
# A token per account for the whole session (the fixture is session-wide): a day outlasts any run.
TOKEN_SECONDS = 86400
# The groups the API server gives every ServiceAccount token (what a SubjectAccessReview must name).
SERVICE_ACCOUNT_GROUPS = ("system:serviceaccounts", "system:authenticated")


def object_path(document: Manifest, *, with_name: bool = True) -> str:
    prefix, plural, namespaced = KINDS[document["apiVersion"], document["kind"]]
    meta = document["metadata"]
    path = prefix
    if namespaced:
        path += f"/namespaces/{meta.get('namespace') or NAMESPACE}"
    path += f"/{plural}"
    return f"{path}/{meta['name']}" if with_name else path


def apply(cluster: RealCluster, document: Manifest) -> Json:
    """`kubectl apply --server-side --force-conflicts`: created, or updated to exactly this."""
    return cluster.call(
        "PATCH",
        object_path(document),
        document,
        content_type="application/apply-patch+yaml",  # JSON is YAML
        fieldManager=FIELD_MANAGER,
        force="true",
    )


@dataclass(frozen=True)
class Account:
    """A ServiceAccount and a token the API server issued for it."""

    namespace: str
    name: str
    token: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def groups(self) -> list[str]:
        return [*SERVICE_ACCOUNT_GROUPS, f"system:serviceaccounts:{self.namespace}"]


def service_account_token(cluster: RealCluster, namespace: str, name: str) -> str:
    """A token of the account from TokenRequest, as the kubelet mounts one into a pod."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    issued = cluster.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
    return str(issued["status"]["token"])


@dataclass(frozen=True)
class ChartIdentity:
    """The release as installed: what was applied, and a token of each of its accounts."""

    documents: list[Manifest]
    namespace: str
    worker: Account
    webhook: Account
    # An account of the release namespace that the chart binds nothing to: what every account
    # of the cluster may do anyway (discovery, self reviews), to tell the chart's grants from.
    bystander: Account


def service_account_of(documents: list[Manifest], deployment: str) -> str:
    return str(one(documents, "Deployment", deployment)["spec"]["template"]["spec"]["serviceAccountName"])


def install_identity(cluster: RealCluster, documents: list[Manifest]) -> ChartIdentity:
    """Apply the chart's ServiceAccounts and RBAC; `cluster` is the release namespace's (it exists)."""
    assert cluster.namespace == NAMESPACE
    for document in documents:
        if document["kind"] in IDENTITY_KINDS:
            apply(cluster, document)
    bystander = "bystander"
    apply(cluster, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": bystander}})

    def account(name: str) -> Account:
        return Account(NAMESPACE, name, service_account_token(cluster, NAMESPACE, name))

    return ChartIdentity(
        documents=documents,
        namespace=NAMESPACE,
        worker=account(service_account_of(documents, "slurm-bridge")),
        webhook=account(service_account_of(documents, "slurm-bridge-webhook")),
        bystander=account(bystander),
    )


# -- what a client sent --------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One request of a KubeClient and the status the API server answered it with."""

    method: str
    path: str
    query: Mapping[str, str]
    status: int

    def __str__(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.query.items())
        return f"{self.method} {self.path}{'?' + query if query else ''} -> {self.status}"


class RecordingKubeClient(KubeClient):
    """The worker's own client, noting each request with the status the API server gave it
    (watches included): a refusal the code swallows (a watcher retrying a 403) still shows."""

    def __init__(self, configuration: Any) -> None:
        super().__init__(configuration)
        self.calls: list[Call] = []

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
    ) -> Any:
        response = await super()._send(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        self.calls.append(Call(method, path, dict(query or {}), int(response.status)))
        return response


def is_discovery(path: str) -> bool:
    """/version, /api, /apis, /apis/<group>[/<version>]: granted to every account by the cluster."""
    parts = [p for p in path.split("/") if p]
    return path == "/version" or (bool(parts) and parts[0] in ("api", "apis") and len(parts) <= 3)


def grant_of(call: Call) -> Grant | None:
    """What the authorizer checked for a resource request (the existing mapping,
    tests/e2e/test_rbac_in_use.py); None for discovery."""
    if not PATH.match(call.path) and is_discovery(call.path):
        return None
    return authorized_as(RecordedRequest(call.method, call.path, dict(call.query), "application/json", None))


def grants_used(calls: Iterable[Call]) -> set[Grant]:
    return {grant for call in calls if (grant := grant_of(call)) is not None}


def refused(calls: Iterable[Call]) -> list[str]:
    """Requests the API server did not authenticate (401) or authorize (403)."""
    return [str(call) for call in calls if call.status in (401, 403)]
