"""The admission chain for real: the chart's webhook configurations in kube-apiserver v1.28
(testbed/kube_real), calling `slurm-bridge webhook` over HTTPS.

tests/deploy/test_webhook_scope.py evaluates the rendered configurations (rules, selectors, CEL
matchConditions) with a model of the API server; here the API server itself decides. The chart
is rendered with a managed-namespace selector and the test CA as `caBundle`; both configurations
are registered as rendered (rules, namespaceSelector, objectSelector, matchConditions,
failurePolicy) except `clientConfig`, which names a URL on 127.0.0.1 instead of the Service: the
API server here cannot reach a Service (no Endpoints, no cluster network, nothing runs pods). The
webhook is the real CLI, a process of its own, with the chart's environment and a token of the
chart's webhook ServiceAccount (it watches namespace labels with it).
"""

import base64
import contextlib
import copy
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.kube import KubeActivities, KubeSettings
from activities.placement import PlacementActivities
from activities.slurm import SlurmActivities
from bridge import keys
from bridge.models import PodRef
from bridge.tolerations import managed_node_toleration
from clients.kube_client import load_configuration
from clients.slurm_client import SlurmClient
from testbed.kube_real.apiserver import ApiServer
from testbed.kube_real.cluster import ApiFailure, RealCluster
from testbed.waiting import wait_until
from tests.deploy.chart import Manifest, container, env_of, manifests, one
from tests.deploy.real_chart import ChartIdentity, RecordingKubeClient, apply, object_path, refused
from tests.e2e.harness import make_pod
from webhook.policy import AdmissionPolicy
from webhook.review import AdmissionReview
from webhook.validate import validate

Json = dict[str, Any]
SCHEDULER = keys.DEFAULT_SCHEDULER_NAME
MANAGED_LABEL = "slurm-bridge.test/managed"
MUTATE_SCHEDULER_PODS = "mutate-scheduler-pods.slinky.slurm.net"
MUTATE_PODS = "mutate-pods.slinky.slurm.net"
VALIDATE_PODS = "validate-pods.slinky.slurm.net"
CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# A webhook's start (Python and its imports) on a machine of 2 shared cores, and the API server's
# pick-up of a new configuration (its informer): generous bounds, left at once when done.
START_SECONDS = 60.0
PICK_UP_SECONDS = 30.0
# Polled (testbed/waiting.py): another process's readiness, and when the API server's admission
# starts calling a new configuration, tell nobody when they change.
POLL_SECONDS = 0.1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class WebhookProcess:
    """`slurm-bridge webhook` as the chart's Deployment runs it, on 127.0.0.1."""

    command: list[str]
    env: dict[str, str]
    port: int
    ca_file: Path
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stderr=log, stdout=log)
        wait_until(self._ready, "the webhook's /readyz", START_SECONDS, POLL_SECONDS)

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the webhook exited ({self.process.returncode}): {self.log.read_text()}")
        try:
            answer = httpx.get(
                f"https://127.0.0.1:{self.port}/readyz",
                verify=ssl.create_default_context(cafile=str(self.ca_file)),
                timeout=2,
            )
        except httpx.HTTPError:
            return False
        # Ready only once its namespace label cache has listed, with the webhook's own token.
        return answer.status_code == 200

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Admission:
    """The chain as a test sees it."""

    cluster: RealCluster  # admin, in the managed namespace
    unmanaged: str  # a namespace of users the selector does not pick
    identity: ChartIdentity
    documents: list[Manifest]
    webhook: WebhookProcess

    @property
    def managed(self) -> str:
        return self.cluster.namespace

    def configuration(self, kind: str) -> Manifest:
        return one(self.documents, kind)


def registered(configuration: Manifest, port: int) -> Manifest:
    """The rendered configuration, calling the webhook on 127.0.0.1 (at the chart's paths, with the
    chart's caBundle); every other field as rendered."""
    changed = copy.deepcopy(configuration)
    changed["metadata"].pop("annotations", None)  # cert-manager's; it is off anyway
    for webhook in changed["webhooks"]:
        client = webhook["clientConfig"]
        client["url"] = f"https://127.0.0.1:{port}{client.pop('service')['path']}"
    return changed


def default_scheduler_pod(namespace: str, name: str, **kwargs: Any) -> Json:
    """A pod as users write it: no schedulerName (the default scheduler's)."""
    pod = make_pod(namespace, name, **kwargs)
    del pod["spec"]["schedulerName"]
    return pod


@pytest.fixture
def admission(
    real_apiserver: ApiServer, chart_identity: ChartIdentity, real_cluster: RealCluster, tmp_path: Path
) -> Iterator[Admission]:
    ca = base64.b64encode(real_apiserver.ca_file.read_bytes()).decode()
    documents = manifests(
        {
            "webhook": {
                "managedNamespaceSelector": {"matchLabels": {MANAGED_LABEL: "true"}},
                "certManager": {"enabled": False},
                "tls": {"caBundle": ca},
            }
        }
    )
    # The test's namespace is managed; labelled before the webhook lists namespaces.
    real_cluster.call(
        "PATCH",
        f"/api/v1/namespaces/{real_cluster.namespace}",
        {"metadata": {"labels": {MANAGED_LABEL: "true"}}},
        content_type="application/merge-patch+json",
    )
    unmanaged = f"{real_cluster.namespace}-users"
    real_cluster.ensure_namespace(unmanaged)

    deployment = one(documents, "Deployment", "slurm-bridge-webhook")
    port = free_port()
    env = {
        **os.environ,
        **env_of(deployment, "webhook"),
        # Where the pod would mount its Secret and listen on all addresses.
        "WEBHOOK_TLS_CERT_FILE": str(real_apiserver.webhook_cert),
        "WEBHOOK_TLS_KEY_FILE": str(real_apiserver.webhook_key),
        "WEBHOOK_HOST": "127.0.0.1",
        "WEBHOOK_PORT": str(port),
        # The pod's mounted ServiceAccount token, as a kubeconfig carrying it.
        "KUBECONFIG": str(
            real_apiserver.kubeconfig(tmp_path / "webhook-kubeconfig", token=chart_identity.webhook.token)
        ),
    }
    command = [str(Path(sys.executable).with_name("slurm-bridge")), *container(deployment, "webhook")["args"]]
    webhook = WebhookProcess(command, env, port, real_apiserver.ca_file, tmp_path / "webhook.log")
    chain = Admission(real_cluster, unmanaged, chart_identity, documents, webhook)
    webhook.start()
    try:
        for kind in CONFIGURATIONS:
            apply(real_cluster, registered(chain.configuration(kind), port))
        try:
            wait_until_called(chain)
            yield chain
        finally:
            # Before the namespace is emptied: with failurePolicy Fail and the webhook gone, the
            # clean-up's finalizer removals would wait for it.
            for kind in CONFIGURATIONS:
                with contextlib.suppress(ApiFailure):
                    real_cluster.call("DELETE", object_path(chain.configuration(kind)))
            with contextlib.suppress(ApiFailure):
                pods = real_cluster.call("GET", f"/api/v1/namespaces/{unmanaged}/pods")["items"]
                for pod in pods:
                    real_cluster.delete_object(
                        "pods", pod["metadata"]["name"], unmanaged, grace_period_seconds=0
                    )
    finally:
        webhook.stop()
    # It ran with the webhook ServiceAccount's token and was never refused.
    log = webhook.log.read_text()
    assert "list/watch failed" not in log, log  # how its namespace informer reports a refusal


def wait_until_called(chain: Admission) -> None:
    """Until the API server calls both configurations: server-side dry runs (the webhooks have no
    side effects, so dry runs reach them), one the mutating webhook routes, one the validating
    webhook refuses."""

    def routed() -> bool:
        pod = default_scheduler_pod(chain.managed, f"probe-{os.urandom(3).hex()}")
        created = chain.cluster.call("POST", f"/api/v1/namespaces/{chain.managed}/pods", pod, dryRun="All")
        return bool(created["spec"].get("schedulerName") == SCHEDULER)

    def refused_() -> bool:
        pod = make_pod(
            chain.unmanaged,
            f"probe-{os.urandom(3).hex()}",
            annotations={keys.SLURMJOB_PREFIX + "timelimit": "soon"},
        )
        try:
            chain.cluster.call("POST", f"/api/v1/namespaces/{chain.unmanaged}/pods", pod, dryRun="All")
        except ApiFailure as failure:
            return VALIDATE_PODS in str(failure)
        return False

    wait_until(routed, "the API server calling the mutating webhook", PICK_UP_SECONDS, POLL_SECONDS)
    wait_until(refused_, "the API server calling the validating webhook", PICK_UP_SECONDS, POLL_SECONDS)


def expected_denial(chain: Admission, pod: Json, namespace: str) -> str:
    """The message the webhook's own decision gives this pod (webhook/validate.py), as a
    user's CREATE in that namespace."""
    request = {
        "uid": "1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"],
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "admin"},
        "object": pod,
    }
    review = AdmissionReview.model_validate(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    )
    policy = AdmissionPolicy(SCHEDULER, frozenset({chain.identity.worker.username}))
    verdict = validate(review.request, managed=namespace == chain.managed, policy=policy)
    assert not verdict.allowed
    assert verdict.status is not None
    return verdict.status.message


# -- the webhook answers --------------------------------------------------------------------------


def test_the_chart_registers_as_rendered(admission: Admission) -> None:
    # What the API server holds is the chart's configuration, only the address changed.
    for kind in CONFIGURATIONS:
        rendered = admission.configuration(kind)
        stored = admission.cluster.call("GET", object_path(rendered))
        assert [w["name"] for w in stored["webhooks"]] == [w["name"] for w in rendered["webhooks"]]
        for held, chart in zip(stored["webhooks"], rendered["webhooks"], strict=True):
            for key, value in chart.items():
                if key != "clientConfig":
                    assert held[key] == value, (held["name"], key)
            assert held["clientConfig"]["caBundle"] == chart["clientConfig"]["caBundle"]
            assert held["failurePolicy"] == "Fail"  # the chart's default: an outage is felt


@pytest.mark.parametrize("scheduler", [None, "default-scheduler"])
def test_a_pod_of_a_managed_namespace_is_routed_to_the_bridge(
    admission: Admission, scheduler: str | None
) -> None:
    pod = make_pod(admission.managed, "routed")
    if scheduler is None:
        del pod["spec"]["schedulerName"]
    else:
        pod["spec"]["schedulerName"] = scheduler
    created = admission.cluster.create_object("pods", pod)
    assert created["spec"]["schedulerName"] == SCHEDULER
    assert managed_node_toleration(SCHEDULER) in created["spec"]["tolerations"]


def test_outside_the_managed_namespaces_only_pods_naming_the_bridge_are_routed(admission: Admission) -> None:
    cluster, ns = admission.cluster, admission.unmanaged
    stays = cluster.create_object("pods", default_scheduler_pod(ns, "stays"))
    assert stays["spec"]["schedulerName"] == "default-scheduler"  # the API server's default, unrouted
    assert managed_node_toleration(SCHEDULER) not in (stays["spec"].get("tolerations") or [])
    ours = cluster.create_object("pods", make_pod(ns, "ours"))  # names the bridge's scheduler itself
    assert managed_node_toleration(SCHEDULER) in ours["spec"]["tolerations"]


@pytest.mark.parametrize(
    ("case", "managed"),
    [("topology spread", False), ("bad time limit", True), ("forged job id", False)],
)
def test_a_bad_pod_is_denied_with_the_webhook_message(admission: Admission, case: str, managed: bool) -> None:
    ns = admission.managed if managed else admission.unmanaged
    if case == "topology spread":
        pod = make_pod(ns, "bad")
        pod["spec"]["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}
        ]
    elif case == "bad time limit":
        # Asks for the default scheduler: routed by the mutating webhook, then refused.
        pod = default_scheduler_pod(ns, "bad", annotations={keys.SLURMJOB_PREFIX + "timelimit": "soon"})
    else:
        pod = make_pod(ns, "bad")
        pod["metadata"]["labels"] = {keys.LABEL_SLURM_JOB_ID: "42"}
    # What the webhook itself says of the pod it is sent (routed where the namespace is managed).
    sent = copy.deepcopy(pod)
    sent["spec"]["schedulerName"] = SCHEDULER
    message = expected_denial(admission, sent, ns)
    answer = admission.cluster.http.post(f"/api/v1/namespaces/{ns}/pods", json=pod)
    assert answer.status_code == 403, answer.text
    assert answer.json()["message"] == f'admission webhook "{VALIDATE_PODS}" denied the request: {message}'
    assert admission.cluster.get_object("pods", "bad", ns) is None


def test_a_dra_pod_is_refused_where_the_api_server_serves_no_device_classes(admission: Admission) -> None:
    # kube-apiserver 1.28 serves no resource.k8s.io: the webhook, reading DeviceClasses with the
    # chart's RBAC and its own token, takes the plain-text 404 as "no DeviceClasses". (The API
    # server's own validation refuses such a pod before calling validating webhooks in 1.28, so
    # the review goes to the webhook directly, as the API server of a 1.34 cluster without DRA
    # would send it.)
    pod = make_pod(admission.managed, "dra")
    pod["spec"]["containers"][0]["resources"] = {"limits": {keys.DRA_RESOURCE_PREFIX + "gpu.nvidia.com": "1"}}
    sent = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "dra-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "dra",
            "namespace": admission.managed,
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": pod,
        },
    }
    webhook = admission.webhook
    answer = httpx.post(
        f"https://127.0.0.1:{webhook.port}/validate",
        json=sent,
        verify=ssl.create_default_context(cafile=str(webhook.ca_file)),
        timeout=10,
    )
    response = answer.raise_for_status().json()["response"]
    assert not response["allowed"]
    message = response["status"]["message"]
    assert (
        "asks for DeviceClass gpu.nvidia.com, but this cluster does not serve resource.k8s.io/v1" in message
    )
    assert "cannot tell" not in message  # the webhook's token may read DeviceClasses: no 403


# -- the webhook is down --------------------------------------------------------------------------


async def test_with_the_webhook_stopped_only_what_concerns_slurm_waits(
    admission: Admission, tmp_path: Path
) -> None:
    cluster, managed, users = admission.cluster, admission.managed, admission.unmanaged
    kubeconfig = cluster.kubeconfig(tmp_path / "worker", token=admission.identity.worker.token)
    worker = RecordingKubeClient(await load_configuration(str(kubeconfig)))
    activities = KubeActivities(worker, KubeSettings())
    try:
        # Two pods the bridge placed: claimed by the worker's own code with the worker's token.
        refs = []
        for name in ("claimed", "held"):
            pod = cluster.create_object("pods", make_pod(managed, name))
            refs.append(PodRef(namespace=managed, name=name, uid=pod["metadata"]["uid"]))
        steps = PlacementActivities(
            activities, SlurmActivities(SlurmClient("http://127.0.0.1:9", user_name=None, token_file=None))
        )
        for ref in refs:
            placement = f"placement/slurm-bridge/{managed}/{ref.name}/{ref.uid}@{ref.uid}"
            assert await steps._claim(ref, placement) is not None
        claimed = refs[0]

        admission.webhook.stop()
        # Down indeed, and called for what concerns Slurm: failurePolicy Fail as rendered.
        down = cluster.http.post(
            f"/api/v1/namespaces/{managed}/pods", json=default_scheduler_pod(managed, "waits")
        )
        assert down.status_code >= 400
        assert f'failed calling webhook "{MUTATE_PODS}"' in down.json()["message"]
        ours = cluster.http.post(f"/api/v1/namespaces/{users}/pods", json=make_pod(users, "waits"))
        assert f'failed calling webhook "{MUTATE_SCHEDULER_PODS}"' in ours.json()["message"]

        # Pods of a namespace that is not managed: created, updated, deleted without it.
        cluster.create_object("pods", default_scheduler_pod(users, "web"))

        def add(pod: Json) -> None:
            pod["metadata"]["labels"] = {"app": "web"}
            pod["metadata"]["finalizers"] = ["example.com/cleanup"]

        updated = cluster.update_object("pods", "web", add, users)
        assert updated["metadata"]["finalizers"] == ["example.com/cleanup"]
        cluster.call(
            "PATCH",
            f"/api/v1/namespaces/{users}/pods/web",
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/cleanup"]}},
            content_type="application/strategic-merge-patch+json",
        )
        cluster.delete_object("pods", "web", users)
        assert cluster.get_object("pods", "web", users) is None  # never bound: deleted at once

        # The kubelet's status updates of a bridge pod never wait either (no bridge-owned key changes).
        # (A strategic-merge patch of pods/status, as the kubelet writes it.)
        running = cluster.call(
            "PATCH",
            f"/api/v1/namespaces/{managed}/pods/held/status",
            {"status": {"phase": "Running"}},
            content_type="application/strategic-merge-patch+json",
        )
        assert running["status"]["phase"] == "Running"

        # The worker still drops its finalizer (the same patch as in every placement's end)...
        await activities.remove_finalizer([claimed])
        assert keys.FINALIZER not in (cluster.get_object("pods", "claimed", managed) or {})["metadata"].get(
            "finalizers", []
        )
        # ... which nobody else may do without the webhook: only the worker's requests skip it.
        other = cluster.http.patch(
            f"/api/v1/namespaces/{managed}/pods/held",
            json={"metadata": {"$deleteFromPrimitiveList/finalizers": [keys.FINALIZER]}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        assert other.status_code >= 400
        assert f'failed calling webhook "{VALIDATE_PODS}"' in other.json()["message"]
        # A pod's deletion never waits for it.
        cluster.delete_object("pods", "claimed", managed)
        assert cluster.get_object("pods", "claimed", managed) is None
    finally:
        await worker.close()
    assert refused(worker.calls) == []
