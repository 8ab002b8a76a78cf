"""`slurm-bridge doctor` against the real parts: the fake Kubernetes API server,
the real Slurm test bed and the real Temporal dev server.

Only SelfSubjectAccessReview has no real counterpart here (the fake API server
does no authorization), so its answers come from a small stub that says
allowed or denied per verb: it tests how the doctor asks and reports.
"""

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from testbed.kube_fake import FakeKubeServer
from testbed.slurm_bed import SlurmTestBed, TestPartition
from testbed.waiting import until
from tests.temporal.conftest import NAMESPACE
from worker.doctor import PERMISSIONS, Check, DoctorSettings, diagnose
from worker.settings import load
from worker.temporal_connection import ensure_search_attributes

pytestmark = pytest.mark.slurm


@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        yield server


@pytest.fixture
def partition(slurm_bed: SlurmTestBed) -> Iterator[TestPartition]:
    made = slurm_bed.make_partition(nodes=1)
    yield made
    made.cleanup()


@pytest.fixture
async def prepared_namespace(temporal_env: WorkflowEnvironment, other_namespace: str) -> str:
    scoped = Client(temporal_env.client.service_client, namespace=other_namespace)
    await ensure_search_attributes(scoped)
    return other_namespace


def settings_for(
    temporal_env: WorkflowEnvironment,
    bed: SlurmTestBed,
    kubeconfig: Path,
    namespace: str,
    partition: str,
    **overrides: Any,
) -> DoctorSettings:
    values: dict[str, Any] = {
        "temporal_address": temporal_env.client.service_client.config.target_host,
        "temporal_namespace": namespace,
        "slurm_rest_url": bed.rest_url,
        "slurm_user_name": bed.user_name,
        "slurm_jwt_file": bed.jwt_file,
        "partition": partition,
        "kubeconfig": str(kubeconfig),
        **overrides,
    }
    return load(DoctorSettings, **values)


def by_name(checks: list[Check]) -> dict[tuple[str, str], Check]:
    return {(check.area, check.name): check for check in checks}


async def test_a_healthy_setup_passes(
    temporal_env: WorkflowEnvironment,
    slurm_bed: SlurmTestBed,
    kube: FakeKubeServer,
    partition: TestPartition,
    prepared_namespace: str,
    tmp_path: Path,
) -> None:
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    checks = await diagnose(
        settings_for(temporal_env, slurm_bed, kubeconfig, prepared_namespace, partition.name)
    )
    assert [c for c in checks if c.status == "fail"] == []
    found = by_name(checks)
    assert found["Slurm", "token"].status == "ok"
    assert found["Slurm", "partition"].detail.startswith(partition.name)
    assert found["Slurm", "operator rights"].status == "ok"
    assert found["Temporal", "namespace"].detail.startswith(prepared_namespace)
    assert found["Temporal", "search attributes"].status == "ok"
    # The fake API server has no SelfSubjectAccessReview: reads are probed, writes are not claimed.
    assert found["Kubernetes", "nodes"].detail == "may list nodes (read probe)"
    assert found["Kubernetes", "write permissions"].status == "warn"


def test_the_command_prints_json_and_exits_0_or_1(
    temporal_env: WorkflowEnvironment,
    slurm_bed: SlurmTestBed,
    kube: FakeKubeServer,
    partition: TestPartition,
    prepared_namespace: str,
    tmp_path: Path,
) -> None:
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": prepared_namespace,
        "SLURM_REST_URL": slurm_bed.rest_url,
        "SLURM_USER_NAME": slurm_bed.user_name,
        "SLURM_JWT_FILE": str(slurm_bed.jwt_file),
        "SLURM_PARTITION": partition.name,
        "KUBECONFIG": str(kubeconfig),
    }
    command = [str(Path(sys.executable).with_name("slurm-bridge")), "doctor"]
    good = subprocess.run([*command, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads(good.stdout)
    assert report["ok"] is True
    assert {c["area"] for c in report["checks"]} == {"Kubernetes", "Slurm", "Temporal"}

    bad = subprocess.run(
        [*command, "--partition", "no-such-partition"], env=env, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 1
    assert "✗ partition: no partition no-such-partition" in bad.stdout
    assert "fix: set SLURM_PARTITION (--partition)" in bad.stdout
    assert "1 problem found." in bad.stdout

    broken = subprocess.run(
        [*command, "--json"],
        env={**env, "TEMPORAL_TLS_CERT_FILE": str(tmp_path / "missing.crt")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert broken.returncode == 1
    assert "invalid setting TEMPORAL_TLS_CERT_FILE" in json.loads(broken.stdout)["checks"][0]["detail"]


async def test_slurm_problems_name_the_setting(
    temporal_env: WorkflowEnvironment,
    slurm_bed: SlurmTestBed,
    kube: FakeKubeServer,
    partition: TestPartition,
    prepared_namespace: str,
    tmp_path: Path,
) -> None:
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")

    async def slurm_checks(**overrides: Any) -> dict[str, Check]:
        doctor_settings = settings_for(
            temporal_env, slurm_bed, kubeconfig, prepared_namespace, partition.name, **overrides
        )
        from worker.doctor import Doctor

        return {c.name: c for c in await Doctor(doctor_settings).slurm()}

    missing = await slurm_checks(slurm_jwt_file=tmp_path / "nope")
    assert missing["token file"].status == "fail"
    assert "SLURM_JWT_FILE" in missing["token file"].fix

    forged = tmp_path / "forged"
    forged.write_text("eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJzbHVybSIsImV4cCI6NDEwMjQ0NDgwMH0.bm90LXNpZ25lZA\n")
    rejected = await slurm_checks(slurm_jwt_file=forged)
    assert rejected["token file"].status == "ok"  # well-formed, not expired: only slurmctld can tell
    assert rejected["token"].status == "fail"
    assert "refused the token" in rejected["token"].detail
    assert "partition" not in rejected  # nothing further is asked with a refused token

    unreachable = await slurm_checks(slurm_rest_url="http://127.0.0.1:9")
    assert unreachable["slurmrestd"].status == "fail"
    assert "SLURM_REST_URL" in unreachable["slurmrestd"].fix

    # A plain user's token: accepted, but no operator rights for node sync.
    plain = tmp_path / "nobody"
    plain.write_text(slurm_bed.scontrol("token", "username=nobody", "lifespan=600").strip())
    user = await slurm_checks(slurm_jwt_file=plain, slurm_user_name="nobody")
    assert user["token"].status == "ok"
    assert user["nodes"].status == "ok"
    assert user["operator rights"].status == "fail"
    assert "user nobody may not update nodes" in user["operator rights"].detail

    unlabelled = await slurm_checks(mcs_label="")
    assert unlabelled["MCS label"].status == "warn"
    assert "MCS_LABEL" in unlabelled["MCS label"].fix


async def test_temporal_problems_name_the_setting(
    temporal_env: WorkflowEnvironment, tmp_path: Path, other_namespace: str
) -> None:
    from worker.doctor import Doctor

    def doctor(**values: Any) -> Doctor:
        token = tmp_path / "jwt"
        token.write_text("t")
        return Doctor(load(DoctorSettings, slurm_jwt_file=token, **values))

    address = temporal_env.client.service_client.config.target_host
    unknown = {
        c.name: c for c in await doctor(temporal_address=address, temporal_namespace="nope").temporal()
    }
    assert unknown["namespace"].status == "fail"
    assert "TEMPORAL_NAMESPACE" in unknown["namespace"].fix

    closed = {c.name: c for c in await doctor(temporal_address="127.0.0.1:9").temporal()}
    assert closed["connection"].status == "fail"
    assert "TEMPORAL_ADDRESS" in closed["connection"].fix

    # A namespace nobody registered the search attributes in (as on Temporal Cloud).
    bare = f"bare-{uuid.uuid4().hex[:8]}"
    await register_namespace(temporal_env.client, bare)
    checks = {c.name: c for c in await doctor(temporal_address=address, temporal_namespace=bare).temporal()}
    attributes = checks["search attributes"]
    assert attributes.status == "fail"
    assert attributes.detail.startswith("missing PodNamespace, PodName")
    assert (
        f"temporal operator search-attribute create --namespace {bare} --name SlurmNodes --type KeywordList"
        in (attributes.fix)
    )
    cloud = (
        f"tcld namespace search-attributes add --namespace {bare} --search-attribute PodNamespace=Keyword "
    )
    assert cloud in attributes.fix
    assert "--search-attribute SlurmJobId=Int" in attributes.fix
    assert other_namespace == NAMESPACE


async def register_namespace(client: Client, name: str) -> None:
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=name, workflow_execution_retention_period=Duration(seconds=86400))
    )
    scoped = Client(client.service_client, namespace=name)

    async def usable() -> bool:  # refused (RPCError) until the frontend's namespace cache has it
        await scoped.count_workflows()
        return True

    await until(usable, f"namespace {name} usable", 30, 0.25, ignoring=RPCError)


async def test_kubernetes_problems_name_the_setting(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    from worker.doctor import Doctor

    token = tmp_path / "jwt"
    token.write_text("t")

    def doctor(kubeconfig: Path | str) -> Doctor:
        return Doctor(load(DoctorSettings, slurm_jwt_file=token, kubeconfig=str(kubeconfig)))

    with FakeKubeServer(token="right") as kube:
        wrong = {
            c.name: c for c in await doctor(kube.kubeconfig(tmp_path / "wrong", token="wrong")).kubernetes()
        }
        assert wrong["API server"].status == "fail"
        assert "401" in wrong["API server"].detail

        kube.fail_next("GET", r"^/api/v1/nodes$", 403, reason="Forbidden", message="nodes is forbidden")
        denied = {c.name: c for c in await doctor(kube.kubeconfig(tmp_path / "right")).kubernetes()}
        assert denied["API server"].status == "ok"
        assert denied["pods"].status == "ok"
        assert denied["nodes"].status == "fail"
        assert "rbac.create" in denied["nodes"].fix

    missing = {c.name: c for c in await doctor(tmp_path / "no-such-kubeconfig").kubernetes()}
    assert missing["configuration"].status == "fail"
    assert "KUBECONFIG" in missing["configuration"].fix


class AccessReviewStub(BaseHTTPRequestHandler):
    """/version, and SelfSubjectAccessReview answered from `denied` (verb, resource) pairs."""

    denied: set[tuple[str, str]] = set()
    asked: list[dict[str, Any]] = []

    def do_GET(self) -> None:
        self._answer({"gitVersion": "v1.31.0-stub"} if self.path == "/version" else {}, 200)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            self._answer({"kind": "Status", "code": 404}, 404)
            return
        attributes = body["spec"]["resourceAttributes"]
        self.asked.append(attributes)
        resource = "/".join(filter(None, (attributes["resource"], attributes.get("subresource"))))
        allowed = (attributes["verb"], resource) not in self.denied
        self._answer({**body, "status": {"allowed": allowed}}, 201)

    def _answer(self, document: dict[str, Any], status: int) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_permissions_are_asked_with_self_subject_access_reviews(tmp_path: Path) -> None:
    from worker.doctor import Doctor

    AccessReviewStub.denied = {("patch", "nodes"), ("create", "pods/binding")}
    AccessReviewStub.asked = []
    server = HTTPServer(("127.0.0.1", 0), AccessReviewStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        with FakeKubeServer() as kube:  # only for the kubeconfig format
            kube.kubeconfig(kubeconfig)
        document = json.loads(kubeconfig.read_text())
        document["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{server.server_port}"
        kubeconfig.write_text(json.dumps(document))
        token = tmp_path / "jwt"
        token.write_text("t")
        doctor = Doctor(
            load(DoctorSettings, slurm_jwt_file=token, kubeconfig=str(kubeconfig), lease_namespace="bridge")
        )
        checks = {c.name: c for c in await doctor.kubernetes()}
    finally:
        server.shutdown()
    assert checks["nodes"].status == "fail"
    assert checks["nodes"].detail == "denied: patch nodes"
    assert checks["binding pods to nodes"].detail == "denied: create pods/binding"
    assert checks["pods"].status == "ok"
    assert checks["leases"].detail == "may get, create, update leases.coordination.k8s.io in namespace bridge"
    # Every verb of every permission was asked, the leases in their namespace only.
    expected = sum(len(p.resources) * len(p.verbs) for p in PERMISSIONS)
    assert len(AccessReviewStub.asked) == expected
    assert {a.get("namespace") for a in AccessReviewStub.asked if a["resource"] == "leases"} == {"bridge"}
    assert all("namespace" not in a for a in AccessReviewStub.asked if a["resource"] != "leases")


def test_the_doctor_asks_for_exactly_the_charts_grants() -> None:
    from tests.deploy.test_rbac import WORKER, WORKER_LEASES, grants

    asked = grants(*((p.group, list(p.resources), list(p.verbs)) for p in PERMISSIONS))
    assert asked == WORKER | WORKER_LEASES
