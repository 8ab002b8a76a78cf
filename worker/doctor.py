"""`slurm-bridge doctor`: can this worker, with these settings, do its job?

It checks what the worker needs from each side, with the worker's own
settings and credentials, and says for each failure what is wrong and which
setting (or grant) fixes it:

- Kubernetes: the API server answers, and the credentials may do what the
  worker does (SelfSubjectAccessReview for every verb of the chart's RBAC; a
  server without that API gets read probes instead).
- Slurm: the token file, slurmrestd, the token being accepted (`ping`, `diag`),
  slurmctld answering, the default partition, the MCS label, reading nodes and
  the operator rights node sync needs (probed on a node that does not exist,
  so nothing changes).
- Temporal: the connection (TLS, API key), the namespace, and the bridge's
  search attributes with their types.

Nothing is created or changed anywhere.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import field_validator
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from bridge import search_attributes as sa
from bridge.slurm_api import API_VERSION
from bridge.slurm_api.v0044 import V0044UpdateNodeMsg
from clients.kube_client import KubeClient, KubeError, api_path, load_configuration
from clients.slurm_client import SlurmAuthError, SlurmClient, SlurmError, SlurmNotFound
from worker.settings import WorkerSettings

Status = Literal["ok", "warn", "fail", "skip"]
MARKS: dict[Status, str] = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-"}
TIMEOUT = 15.0


@dataclass
class Check:
    """One line of the report: `fix` says what to change, naming the setting."""

    area: str
    name: str
    status: Status
    detail: str
    fix: str = ""


class DoctorSettings(WorkerSettings):
    """The worker's settings; an unreadable token is a failed check here, not a start-up error."""

    @field_validator("slurm_jwt_file")
    @classmethod
    def _readable(cls, value: Path) -> Path:
        return value


@dataclass(frozen=True)
class Permission:
    what: str
    group: str
    resources: tuple[str, ...]  # "pods" or "pods/binding"
    verbs: tuple[str, ...]
    in_lease_namespace: bool = False


# What the worker calls: the chart's worker ClusterRole and leases Role
# (helm/slurm-bridge/templates/worker-rbac.yaml; tests/deploy/test_rbac.py).
PERMISSIONS = (
    Permission("pods", "", ("pods",), ("get", "list", "watch", "patch", "delete")),
    Permission("binding pods to nodes", "", ("pods/binding",), ("create",)),
    Permission("evicting pods whose Slurm job ended", "", ("pods/eviction",), ("create",)),
    Permission("pod conditions", "", ("pods/status",), ("patch",)),
    Permission("events", "", ("events",), ("create", "patch")),
    Permission("nodes", "", ("nodes",), ("get", "list", "watch", "patch")),
    Permission("owner lookups (batch)", "batch", ("jobs",), ("get",)),
    Permission("owner lookups (apps)", "apps", ("replicasets", "deployments", "statefulsets"), ("get",)),
    Permission("owner lookups (JobSet)", "jobset.x-k8s.io", ("jobsets",), ("get",)),
    Permission(
        "owner lookups (LeaderWorkerSet)", "leaderworkerset.x-k8s.io", ("leaderworkersets",), ("get",)
    ),
    Permission(
        "PodGroups (scheduler-plugins)", "scheduling.x-k8s.io", ("podgroups",), ("get", "list", "watch")
    ),
    Permission(
        "PodGroups (scheduling.k8s.io)", "scheduling.k8s.io", ("podgroups",), ("get", "list", "watch")
    ),
    Permission("Workloads (scheduling.k8s.io)", "scheduling.k8s.io", ("workloads",), ("get",)),
    Permission("PodGroup conditions", "scheduling.k8s.io", ("podgroups/status",), ("patch",)),
    Permission(
        "DRA claims (docs/dra.md)", "resource.k8s.io", ("resourceclaims",), ("list", "create", "delete")
    ),
    Permission("DRA claim allocation", "resource.k8s.io", ("resourceclaims/status",), ("patch",)),
    Permission("DRA devices", "resource.k8s.io", ("deviceclasses", "resourceslices"), ("list",)),
    Permission(
        "leases", "coordination.k8s.io", ("leases",), ("get", "create", "update"), in_lease_namespace=True
    ),
)
RBAC_FIX = (
    "grant it to the worker's identity: the Helm chart does with rbac.create=true "
    "(templates/worker-rbac.yaml lists exactly these verbs)"
)


class Doctor:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.lease_namespace = settings.lease_namespace  # LEASE_NAMESPACE, else the pod's own

    async def run(self) -> list[Check]:
        return [*await self.kubernetes(), *await self.slurm(), *await self.temporal()]

    # Kubernetes

    async def kubernetes(self) -> list[Check]:
        area = "Kubernetes"
        where = f"KUBECONFIG={self.settings.kubeconfig}" if self.settings.kubeconfig else "in-cluster"
        if self.settings.kubeconfig and not _any_file(self.settings.kubeconfig):
            return [
                Check(
                    area,
                    "configuration",
                    "fail",
                    f"{self.settings.kubeconfig} does not exist",
                    "set KUBECONFIG (--kubeconfig) to a kubeconfig file, or leave it unset inside a pod",
                )
            ]
        try:
            kube = KubeClient(await load_configuration(self.settings.kubeconfig))
        except Exception as error:  # the loaders raise ConfigException, OSError, ValueError, ...
            return [
                Check(
                    area,
                    "configuration",
                    "fail",
                    f"no Kubernetes configuration ({where}): {error}",
                    "set KUBECONFIG (--kubeconfig) to a kubeconfig file, or run inside a pod",
                )
            ]
        try:
            try:
                version = await kube.request("GET", "/version", timeout=TIMEOUT)
            except KubeError as error:
                fix = (
                    "the credentials of KUBECONFIG (--kubeconfig) or the ServiceAccount were refused"
                    if error.status in (401, 403)
                    else "check KUBECONFIG (--kubeconfig): the server address, or the network to it"
                )
                return [Check(area, "API server", "fail", f"{where}: {error}", fix)]
            checks = [
                Check(
                    area,
                    "API server",
                    "ok",
                    f"answers ({version.get('gitVersion', 'unknown version')}, {where})",
                )
            ]
            checks += await self._permissions(kube)
            return checks
        finally:
            await kube.close()

    async def _permissions(self, kube: KubeClient) -> list[Check]:
        try:
            first = await self._review(kube, PERMISSIONS[0])  # does the server answer reviews at all?
        except _NoAccessReview:
            return await self._read_probes(kube)
        return [first, *await asyncio.gather(*(self._review(kube, p) for p in PERMISSIONS[1:]))]

    async def _review(self, kube: KubeClient, permission: Permission) -> Check:
        namespace = self.lease_namespace if permission.in_lease_namespace else None
        denied: list[str] = []
        for resource in permission.resources:
            plural, _, subresource = resource.partition("/")
            for verb in permission.verbs:
                attributes = {"verb": verb, "group": permission.group, "resource": plural}
                if subresource:
                    attributes["subresource"] = subresource
                if namespace:
                    attributes["namespace"] = namespace
                body = {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attributes},
                }
                path = api_path("selfsubjectaccessreviews", group="authorization.k8s.io")
                try:
                    review = await kube.request("POST", path, body=body, timeout=TIMEOUT)
                except KubeError as error:
                    if error.status == 404:
                        raise _NoAccessReview from None
                    denied.append(f"{verb} {resource} (cannot ask: {error})")
                    continue
                if not (review.get("status") or {}).get("allowed"):
                    denied.append(f"{verb} {_qualified(permission.group, resource)}")
        scope = f" in namespace {namespace}" if namespace else ""
        resources = ", ".join(_qualified(permission.group, r) for r in permission.resources)
        allowed = f"{', '.join(permission.verbs)} {resources}"
        if denied and permission.in_lease_namespace and not self.settings.leader_election:
            return Check(
                "Kubernetes",
                permission.what,
                "warn",
                f"denied{scope}: {'; '.join(denied)}; needed once LEADER_ELECTION is on",
                f"{RBAC_FIX}; LEASE_NAMESPACE names the namespace",
            )
        if denied:
            fix = f"{RBAC_FIX}; LEASE_NAMESPACE names the namespace" if namespace else RBAC_FIX
            return Check("Kubernetes", permission.what, "fail", f"denied{scope}: {'; '.join(denied)}", fix)
        return Check("Kubernetes", permission.what, "ok", f"may {allowed}{scope}")

    async def _read_probes(self, kube: KubeClient) -> list[Check]:
        """No SelfSubjectAccessReview API: try the reads; writes cannot be checked without writing."""
        probes = [
            ("pods", api_path("pods")),
            ("nodes", api_path("nodes")),
            ("events", api_path("events")),
            ("leases", api_path("leases", namespace=self.lease_namespace, group="coordination.k8s.io")),
        ]
        checks = []
        for what, path in probes:
            try:
                await kube.request("GET", path, query={"limit": "1"}, timeout=TIMEOUT)
                checks.append(Check("Kubernetes", what, "ok", f"may list {what} (read probe)"))
            except KubeError as error:
                checks.append(Check("Kubernetes", what, "fail", f"cannot list {what}: {error}", RBAC_FIX))
        checks.append(
            Check(
                "Kubernetes",
                "write permissions",
                "warn",
                "not verified: no SelfSubjectAccessReview on this API server, and the doctor writes nothing",
                "check that the worker may create pods/binding and events, patch pods, pods/status and "
                f"nodes, delete pods, and get/create/update leases in {self.lease_namespace}",
            )
        )
        return checks

    # Slurm

    async def slurm(self) -> list[Check]:
        area = "Slurm"
        s = self.settings
        token_check, token = _token_check(s.slurm_jwt_file)
        checks = [token_check]
        if token is None:
            return checks
        async with SlurmClient(
            s.slurm_rest_url,
            user_name=s.slurm_user_name,
            token_file=s.slurm_jwt_file,
            timeout=TIMEOUT,
            api_version=s.slurm_api_version,
        ) as slurm:
            try:
                pings = await slurm.ping()
            except SlurmError as error:
                checks.append(
                    Check(
                        area,
                        "slurmrestd",
                        "fail",
                        f"no answer at {s.slurm_rest_url}: {error.message}",
                        "check SLURM_REST_URL (--slurm-rest-url) and that slurmrestd runs",
                    )
                )
                return checks
            checks.append(Check(area, "slurmrestd", "ok", f"answers at {s.slurm_rest_url}"))
            diag = await self._diag(token)
            checks.append(diag)
            if diag.status == "fail":
                return checks
            responding = [p.hostname or "?" for p in pings if p.responding]
            if responding:
                checks.append(Check(area, "slurmctld", "ok", f"responding: {', '.join(responding)}"))
            else:
                checks.append(
                    Check(
                        area,
                        "slurmctld",
                        "fail",
                        "no controller answers ping",
                        "start slurmctld (scontrol ping)",
                    )
                )
            checks.append(await _partition_check(slurm, s.partition))
            checks.append(_mcs_check(s.mcs_label))
            checks += await _node_checks(slurm, s.slurm_user_name)
        return checks

    async def _diag(self, token: str) -> Check:
        """`GET /diag/` needs an accepted token (ping answers 200 either way)."""
        s = self.settings
        headers = {"X-SLURM-USER-TOKEN": token, "Accept": "application/json"}
        if s.slurm_user_name:
            headers["X-SLURM-USER-NAME"] = s.slurm_user_name
        url = f"{s.slurm_rest_url}/slurm/{API_VERSION}/diag/"
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT) as http:
                response = await http.get(url, headers=headers)
        except httpx.TransportError as error:
            return Check("Slurm", "token", "fail", f"GET /diag/: no answer ({type(error).__name__})")
        try:
            data = response.json()
        except ValueError:
            data = {}
        errors = [e for e in (data.get("errors") or []) if isinstance(e, dict)]
        numbers = {e.get("error_number") for e in errors}
        message = (
            "; ".join(str(e.get("error") or e.get("description")) for e in errors) or response.reason_phrase
        )
        if response.status_code in (401, 403, 511) or 1007 in numbers:
            user = f" for user {s.slurm_user_name}" if s.slurm_user_name else ""
            return Check(
                "Slurm",
                "token",
                "fail",
                f"slurmrestd refused the token{user}: HTTP {response.status_code} {message}",
                "renew the token in SLURM_JWT_FILE (--slurm-jwt-file), e.g. `scontrol token username=slurm "
                "lifespan=...` into the Secret (Helm: slurm.jwtSecret); SLURM_USER_NAME must be the token's "
                "user unless it is SlurmUser's; slurm.conf needs AuthAltTypes=auth/jwt",
            )
        if response.status_code != 200 or errors:
            return Check(
                "Slurm",
                "token",
                "fail",
                f"GET /diag/: HTTP {response.status_code} {message}",
                "slurmctld did not answer slurmrestd: check slurmctld (scontrol ping) and its log",
            )
        release = ((data.get("meta") or {}).get("slurm") or {}).get("release", "?")
        return Check("Slurm", "token", "ok", f"accepted (diag answered, Slurm {release})")

    # Temporal

    async def temporal(self) -> list[Check]:
        from worker.main import connect_temporal

        area = "Temporal"
        s = self.settings
        tls = []
        if s.temporal_tls_cert_file:
            tls.append("client certificate")
        if s.temporal_api_key_file:
            tls.append("API key")
        how = f"{'TLS' if s.temporal_tls_enabled else 'plaintext'}{', ' + ', '.join(tls) if tls else ''}"
        try:
            client = await asyncio.wait_for(connect_temporal(s), TIMEOUT)
        except (RuntimeError, OSError, TimeoutError) as error:
            return [
                Check(
                    area,
                    "connection",
                    "fail",
                    f"cannot connect to {s.temporal_address} ({how}): {error or 'timed out'}",
                    "check TEMPORAL_ADDRESS (--temporal-address); for TLS: TEMPORAL_TLS, "
                    "TEMPORAL_TLS_CA_FILE, TEMPORAL_TLS_SERVER_NAME; for mTLS: TEMPORAL_TLS_CERT_FILE, "
                    "TEMPORAL_TLS_KEY_FILE",
                )
            ]
        checks = [Check(area, "connection", "ok", f"{s.temporal_address} ({how})")]
        namespace = await self._namespace(client)
        checks.append(namespace)
        if namespace.status == "ok":
            checks.append(await search_attributes_check(client))
        return checks

    async def _namespace(self, client: Client) -> Check:
        namespace = client.namespace
        try:
            described = await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=namespace), timeout=timedelta(seconds=TIMEOUT)
            )
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return Check(
                    "Temporal",
                    "namespace",
                    "fail",
                    f"namespace {namespace} does not exist",
                    "set TEMPORAL_NAMESPACE (--temporal-namespace) to an existing namespace (Temporal Cloud: "
                    f"the id <name>.<account>), or create it: temporal operator namespace create {namespace}",
                )
            return Check(
                "Temporal",
                "namespace",
                "fail",
                f"namespace {namespace}: {error.message}",
                "the credentials were refused: check TEMPORAL_API_KEY_FILE or the client certificate "
                "(TEMPORAL_TLS_CERT_FILE, TEMPORAL_TLS_KEY_FILE) and their access to this namespace",
            )
        retention = described.config.workflow_execution_retention_ttl.ToTimedelta()
        return Check("Temporal", "namespace", "ok", f"{namespace} (retention {retention.days} days)")


class _NoAccessReview(Exception):
    pass


def _any_file(kubeconfig: str) -> bool:
    """KUBECONFIG may list several files, as kubectl's does."""
    return any(Path(file).is_file() for file in kubeconfig.split(os.pathsep) if file)


def _qualified(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def _token_check(path: Path) -> tuple[Check, str | None]:
    fix = (
        "SLURM_JWT_FILE (--slurm-jwt-file) must name a readable file holding the Slurm JWT "
        "(Helm: slurm.jwtSecret, mounted at /var/run/secrets/slurm/auth-token)"
    )
    try:
        token = path.read_text(encoding="utf-8").strip().removeprefix("SLURM_JWT=").strip()
    except OSError as error:
        return Check("Slurm", "token file", "fail", f"cannot read {path}: {error.strerror}", fix), None
    if not token:
        return Check("Slurm", "token file", "fail", f"{path} is empty", fix), None
    claims = _jwt_claims(token)
    if claims is None:
        return Check("Slurm", "token file", "warn", f"{path} does not hold a JWT; slurmrestd decides"), token
    user = claims.get("sun") or "?"
    expires = claims.get("exp")
    if not isinstance(expires, int | float):
        return Check("Slurm", "token file", "ok", f"{path}: token for {user}, no expiry"), token
    left = expires - time.time()
    renew = (
        f"renew it: scontrol token username={user} lifespan=SECONDS, into the file of SLURM_JWT_FILE "
        "(the next request reads it, no restart needed)"
    )
    if left <= 0:
        return Check("Slurm", "token file", "fail", f"{path}: the token of {user} has expired", renew), token
    days = left / 86400
    if days < 1:
        return Check(
            "Slurm", "token file", "warn", f"{path}: token for {user} expires in {left / 3600:.1f} h", renew
        ), token
    return Check("Slurm", "token file", "ok", f"{path}: token for {user}, expires in {days:.0f} days"), token


def _jwt_claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWT, unverified (only slurmctld can verify it): for `sun` and `exp`."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


async def _partition_check(slurm: SlurmClient, name: str) -> Check:
    try:
        partition = await slurm.get_partition(name)
    except SlurmError as error:
        return Check("Slurm", "partition", "fail", f"cannot read partition {name}: {error}")
    if partition is None:
        return Check(
            "Slurm",
            "partition",
            "fail",
            f"no partition {name}",
            "set SLURM_PARTITION (--partition) to an existing partition, or create it in slurm.conf "
            "(e.g. a NodeSet of Feature=slurm-bridge)",
        )
    states = list((partition.partition.state if partition.partition else None) or [])
    nodes = (partition.nodes.configured if partition.nodes else None) or ""
    if not nodes:
        return Check(
            "Slurm",
            "partition",
            "warn",
            f"{name} has no nodes yet: jobs stay pending until nodes join it",
            "label Kubernetes nodes scheduler.slinky.slurm.net/external-node (node sync registers them), "
            "or add Slurm nodes to the partition",
        )
    if states and "UP" not in states:
        return Check(
            "Slurm",
            "partition",
            "warn",
            f"{name} is {','.join(states)} ({nodes}): jobs stay pending",
            f"scontrol update PartitionName={name} State=UP",
        )
    return Check("Slurm", "partition", "ok", f"{name} ({nodes})")


def _mcs_check(label: str) -> Check:
    if not label:
        return Check(
            "Slurm",
            "MCS label",
            "warn",
            "jobs carry no MCS label, so MCSPlugin=mcs/label cannot keep batch jobs off the nodes of pods",
            "set MCS_LABEL (--mcs-label), for example kubernetes (Helm: slurm.mcsLabel)",
        )
    if any(c.isspace() or c in ",'\"" for c in label):
        return Check(
            "Slurm",
            "MCS label",
            "fail",
            f"{label!r} has spaces, commas or quotes",
            "set MCS_LABEL (--mcs-label) to one word",
        )
    return Check(
        "Slurm",
        "MCS label",
        "ok",
        f"jobs are labelled {label} (isolation needs MCSPlugin=mcs/label in slurm.conf, "
        "which slurmrestd does not show)",
    )


async def _node_checks(slurm: SlurmClient, user_name: str | None) -> list[Check]:
    try:
        nodes = await slurm.list_nodes()
    except SlurmError as error:
        return [Check("Slurm", "nodes", "fail", f"cannot read nodes: {error}")]
    checks = [Check("Slurm", "nodes", "ok", f"may read nodes ({len(nodes)})")]
    # An update of a node that does not exist: slurmctld checks the caller's
    # rights first (2010 "Invalid user id" for a plain user), then the name
    # (2018 "Invalid node name specified"). Nothing is changed either way.
    probe = f"slurm-bridge-doctor-{secrets.token_hex(4)}"
    who = f"user {user_name}" if user_name else "the token's user"
    try:
        await slurm.update_node(probe, V0044UpdateNodeMsg())
    except SlurmNotFound:
        checks.append(Check("Slurm", "operator rights", "ok", f"{who} may update nodes (node sync)"))
        return checks
    except SlurmAuthError as error:
        checks.append(Check("Slurm", "operator rights", "fail", f"refused: {error.message}"))
        return checks
    except SlurmError as error:
        if 2010 in error.error_numbers:
            checks.append(
                Check(
                    "Slurm",
                    "operator rights",
                    "fail",
                    f"{who} may not update nodes: node sync cannot drain, register or remove nodes",
                    "use a token of SlurmUser (scontrol token username=slurm) in SLURM_JWT_FILE, with "
                    "SLURM_USER_NAME the user jobs run as, or make the user an operator (sacctmgr ... "
                    "AdminLevel=Operator)",
                )
            )
        else:
            checks.append(Check("Slurm", "operator rights", "warn", f"could not tell: {error}"))
        return checks
    checks.append(Check("Slurm", "operator rights", "warn", f"updating the absent node {probe} succeeded?"))
    return checks


async def search_attributes_check(client: Client, keys: Sequence[SearchAttributeKey[Any]] = sa.ALL) -> Check:
    """Every search attribute the bridge sets, registered with its type."""
    namespace = client.namespace
    expected = {key.name: IndexedValueType.ValueType(key.indexed_value_type) for key in keys}
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace), timeout=timedelta(seconds=TIMEOUT)
        )
        registered: dict[str, int | None] = dict(listed.custom_attributes)
    except RPCError:
        # Not allowed to list (Temporal Cloud with a namespace-scoped key): ask with queries instead.
        registered = await _probe_search_attributes(client, keys)
    missing = [name for name in expected if name not in registered]
    wrong = [
        f"{name} is {_type_name(registered[name])}, must be {_type_name(kind)}"
        for name, kind in expected.items()
        if name in registered and registered[name] is not None and registered[name] != kind
    ]
    if not missing and not wrong:
        return Check("Temporal", "search attributes", "ok", f"registered: {', '.join(expected)}")
    problems = ([f"missing {', '.join(missing)}"] if missing else []) + wrong
    todo = [k for k in keys if k.name in missing]
    self_hosted = "; ".join(
        f"temporal operator search-attribute create --namespace {namespace} --name {k.name} "
        f"--type {_type_name(k.indexed_value_type)}"
        for k in todo
    )
    cloud = f"tcld namespace search-attributes add --namespace {namespace} " + " ".join(
        f"--search-attribute {k.name}={_type_name(k.indexed_value_type)}" for k in todo
    )
    fix = (
        f"register them once: {self_hosted} (Temporal Cloud: {cloud}); the worker does it at start "
        "where the server lets it"
        if todo
        else "the bridge needs these types: remove and register them again, or use another namespace"
    )
    return Check("Temporal", "search attributes", "fail", "; ".join(problems), fix)


async def _probe_search_attributes(
    client: Client, keys: Sequence[SearchAttributeKey[Any]]
) -> dict[str, int | None]:
    """A query naming an unknown attribute is refused (InvalidArgument); the type is not learned."""
    found: dict[str, int | None] = {}
    for key in keys:
        value = "0" if key.indexed_value_type == SearchAttributeIndexedValueType.INT else '"doctor"'
        try:
            await client.count_workflows(f"{key.name} = {value}")
            found[key.name] = None
        except RPCError as error:
            if error.status != RPCStatusCode.INVALID_ARGUMENT:
                raise
    return found


def _type_name(kind: int | None) -> str:
    # INDEXED_VALUE_TYPE_KEYWORD_LIST -> KeywordList, as both CLIs spell it.
    name = IndexedValueType.Name(IndexedValueType.ValueType(kind or 0))
    return "".join(part.title() for part in name.removeprefix("INDEXED_VALUE_TYPE_").split("_"))


# Report


def failed(checks: Sequence[Check]) -> bool:
    return any(check.status == "fail" for check in checks)


def as_json_report(checks: Sequence[Check]) -> str:
    return json.dumps({"ok": not failed(checks), "checks": [asdict(check) for check in checks]}, indent=2)


def as_text(checks: Sequence[Check]) -> str:
    lines: list[str] = []
    area = None
    for check in checks:
        if check.area != area:
            area = check.area
            lines.append(area)
        lines.append(f"  {MARKS[check.status]} {check.name}: {check.detail}")
        if check.fix and check.status in ("fail", "warn"):
            lines.append(f"      fix: {check.fix}")
    failures = sum(check.status == "fail" for check in checks)
    lines.append(
        f"{failures} problem{'s' if failures != 1 else ''} found." if failures else "All checks passed."
    )
    return "\n".join(lines)


async def diagnose(settings: WorkerSettings) -> list[Check]:
    return await Doctor(settings).run()
