"""The Helm chart renders, and every manifest it renders is valid Kubernetes.

Each variant turns on other template branches; together they render every
resource the chart can create, including the webhook configurations of
admission-webhooks.yaml.
"""

import re
from typing import Any

import helm_python as helm
import pytest
from pydantic import AliasChoices

from bridge.device_classes import DEFAULT_DEVICE_CLASSES, parse_device_classes
from bridge.labels import parse_selector, selector_from_object
from tests.deploy.chart import (
    CHART,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    ROOT,
    InvalidManifest,
    Manifest,
    container,
    env_of,
    find,
    manifests,
    one,
    render,
    validate,
)
from webhook.settings import WebhookSettings
from worker.settings import WorkerSettings

CA_BUNDLE = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ4ekNDQVcyZ0F3SUJBZ0lVTm90UmVhbAo="

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything on": {
        "image": {
            "repository": "registry.example.com/hpc/slurm-bridge",
            "tag": "1.2.3",
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "registry"}],
        "schedulerName": "slurm",
        "temporal": {
            "address": "my-namespace.abc12.tmprl.cloud:7233",
            "namespace": "my-namespace.abc12",
            "tls": True,
            "apiKeySecret": {"name": "temporal-cloud", "key": "key"},
            "uiUrl": "https://cloud.temporal.io",
        },
        "slurm": {"userName": "slurm", "jwtSecret": {"name": "jwt", "key": "token"}, "partition": "k8s"},
        "worker": {
            "replicas": 3,
            "logLevel": "debug",
            "jobWatchInterval": 0.5,
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "podAnnotations": {"example.com/team": "hpc"},
            "podLabels": {"team": "hpc"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
            ],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "worker"}},
                            },
                        }
                    ]
                }
            },
            "priorityClassName": "system-cluster-critical",
            "serviceAccount": {"annotations": {"example.com/role": "bridge"}},
            "pdb": {"maxUnavailable": "50%"},
        },
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "webhook": {
            "replicas": 3,
            "managedNamespaceSelector": {
                "matchLabels": {"slinky.slurm.net/managed": "true"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["hpc", "ai"]},
                    {"key": "legacy", "operator": "DoesNotExist"},
                ],
            },
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "extraBridgeServiceAccounts": ["system:serviceaccount:ops:break-glass"],
            "podLabels": {"team": "hpc"},
            "priorityClassName": "system-cluster-critical",
        },
    },
    "without cert-manager": {
        "webhook": {
            "certManager": {"enabled": False},
            "tls": {"secretName": "my-webhook-tls", "caBundle": CA_BUNDLE},
        }
    },
    "existing cluster issuer": {
        "webhook": {"certManager": {"issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"}}}
    },
    "minimal": {
        "rbac": {"create": False},
        "metrics": {"enabled": False},
        "worker": {"pdb": {"enabled": False}, "serviceAccount": {"create": False, "name": "bridge"}},
        "webhook": {"enabled": False},
    },
    "no namespaces managed": {"webhook": {"managedNamespaces": [], "serviceAccount": {"create": False}}},
}


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, list[Manifest]]:
    return request.param, manifests(VARIANTS[request.param])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_manifest_is_valid(variant: tuple[str, list[Manifest]], version: str) -> None:
    _, documents = variant
    assert documents
    for document in documents:
        validate(document, version)


def test_the_variants_render_every_template() -> None:
    templates = {p.name for p in (CHART / "templates").glob("*.yaml")}
    rendered = {
        path.rsplit("/", 1)[-1]
        for values in VARIANTS.values()
        for path, text in render(values).items()
        if text.strip()
    }
    assert templates <= rendered, f"never rendered by any variant: {sorted(templates - rendered)}"


def test_the_validator_rejects_invalid_manifests() -> None:
    # The validation above would be worthless if it accepted anything.
    documents = manifests()
    deployment = one(documents, "Deployment", "slurm-bridge")
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(InvalidManifest, match="replica"):
        validate(typo, KUBERNETES_VERSIONS[0])
    wrong_type = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}
    with pytest.raises(InvalidManifest, match="replicas"):
        validate(wrong_type, KUBERNETES_VERSIONS[0])
    certificate = one(documents, "Certificate")
    bad_usage = {**certificate, "spec": {**certificate["spec"], "usages": ["server auth", "serverauth"]}}
    with pytest.raises(InvalidManifest, match="usages"):
        validate(bad_usage, KUBERNETES_VERSIONS[0])
    with pytest.raises(InvalidManifest, match="Couldn't find schema"):
        validate({"apiVersion": "example.com/v1", "kind": "Gizmo", "metadata": {"name": "x"}}, "1.37")


def test_helm_lint_is_clean() -> None:
    report = helm.lint(str(CHART), strict=True, namespace=NAMESPACE, kube_version="v1.31.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [], report
    assert problems == [], report


def test_names_fit_kubernetes_limits_with_the_longest_release_name() -> None:
    # Helm allows release names up to 53 characters.
    documents = manifests(VARIANTS["everything on"], name="r" * 53)
    for document in documents:
        name = document["metadata"]["name"]
        assert len(name) <= 63, name
        if document["kind"] == "Service":
            assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name


def test_pods_run_as_non_root_with_a_read_only_root_and_no_capabilities(
    variant: tuple[str, list[Manifest]],
) -> None:
    _, documents = variant
    for deployment in find(documents, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            context = c["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"]
            assert c["resources"]["limits"]
            # The only writable place is an emptyDir on /tmp.
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])


def _env_names(settings: type[Any]) -> set[str]:
    names = set()
    for field in settings.model_fields.values():
        alias = field.validation_alias
        assert isinstance(alias, AliasChoices)
        names.add(str(alias.choices[0]))
    return names


def test_worker_configuration_is_what_the_worker_reads(variant: tuple[str, list[Manifest]]) -> None:
    name, documents = variant
    config = one(documents, "ConfigMap")["data"]
    assert set(config) <= _env_names(WorkerSettings), "a variable the worker does not read"
    # The JWT file the worker reads is the key the Secret volume projects.
    worker = one(documents, "Deployment", "slurm-bridge")
    mount = next(m for m in container(worker, "worker")["volumeMounts"] if m["name"] == "slurm-token")
    volume = next(v for v in worker["spec"]["template"]["spec"]["volumes"] if v["name"] == "slurm-token")
    assert config["SLURM_JWT_FILE"] == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    assert config["SLURM_JWT_FILE"] == str(WorkerSettings.model_fields["slurm_jwt_file"].default)
    assert container(worker, "worker")["envFrom"] == [
        {"configMapRef": {"name": one(documents, "ConfigMap")["metadata"]["name"]}}
    ]
    if name == "everything on":
        assert config["TEMPORAL_API_KEY_FILE"] == "/var/run/secrets/temporal/api-key"
        assert config["TEMPORAL_TLS"] == "true"
        assert config["SLURM_USER_NAME"] == "slurm"
    if name == "minimal":
        assert config["METRICS_PORT"] == "0"
        # The probes do not need metrics: they ask the health port.
        assert container(worker, "worker")["livenessProbe"]["httpGet"]["port"] == "health"
        assert [p["name"] for p in container(worker, "worker")["ports"]] == ["health"]


def test_the_chart_sets_every_worker_setting() -> None:
    # A setting added to the worker must get a Helm value (or be listed here with the reason).
    not_set_by_the_chart = {"KUBECONFIG"}  # in a pod: the ServiceAccount
    config = one(manifests(VARIANTS["everything on"]), "ConfigMap")["data"]
    assert set(config) | not_set_by_the_chart == _env_names(WorkerSettings)


def test_every_worker_setting_is_documented() -> None:
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    rows = set(re.findall(r"^\| `([A-Z_]+)` \|", configuration, flags=re.MULTILINE))
    assert _env_names(WorkerSettings) - rows == set()
    assert _env_names(WebhookSettings) - rows == set()


def test_worker_probes_ask_the_health_endpoints() -> None:
    documents = manifests()
    worker = container(one(documents, "Deployment", "slurm-bridge"), "worker")
    assert worker["ports"] == [
        {"name": "health", "containerPort": 9465, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9464, "protocol": "TCP"},
    ]
    assert one(documents, "ConfigMap")["data"]["HEALTH_PORT"] == "9465"
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert worker["args"][0] == "worker"


def test_a_configuration_change_rolls_the_worker() -> None:
    def checksum(values: dict[str, Any]) -> str:
        worker = one(manifests(values), "Deployment", "slurm-bridge")
        return str(worker["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"slurm": {"partition": "other"}})


def test_webhook_configuration_is_what_the_webhook_reads(variant: tuple[str, list[Manifest]]) -> None:
    name, documents = variant
    deployments = find(documents, "Deployment", "slurm-bridge-webhook")
    if name == "minimal":
        assert deployments == []
        return
    env = env_of(deployments[0], "webhook")
    assert set(env) <= _env_names(WebhookSettings), "a variable the webhook does not read"
    # Only the worker's service account may write the bridge-owned label and annotation.
    worker_sa = one(documents, "Deployment", "slurm-bridge")["spec"]["template"]["spec"]["serviceAccountName"]
    assert env["BRIDGE_SERVICE_ACCOUNTS"].split(",")[0] == f"system:serviceaccount:{NAMESPACE}:{worker_sa}"
    assert env["SCHEDULER_NAME"] == VARIANTS[name].get("schedulerName", "slurm-bridge-scheduler")
    # The selector string means what the LabelSelector object in values.yaml means.
    selector = VARIANTS[name].get("webhook", {}).get("managedNamespaceSelector")
    if selector:
        assert str(parse_selector(env["MANAGED_NAMESPACE_SELECTOR"])) == str(selector_from_object(selector))
        assert "MANAGED_NAMESPACES" not in env
    else:
        assert "MANAGED_NAMESPACE_SELECTOR" not in env
        namespaces = VARIANTS[name].get("webhook", {}).get("managedNamespaces", ["slurm-bridge"])
        assert env["MANAGED_NAMESPACES"] == ",".join(namespaces)


def _dra_settings(values: dict[str, Any]) -> tuple[str, str]:
    """DRA_DEVICE_CLASSES as the worker's ConfigMap and the webhook's container carry it."""
    documents = manifests(values)
    worker = one(documents, "ConfigMap")["data"]["DRA_DEVICE_CLASSES"]
    webhook = env_of(one(documents, "Deployment", "slurm-bridge-webhook"), "webhook")["DRA_DEVICE_CLASSES"]
    return str(worker), webhook


def test_dra_device_classes_reach_the_worker_and_the_webhook_alike() -> None:
    # The default list is the bridge's own default: the chart changes nothing by itself.
    worker, webhook = _dra_settings({})
    assert worker == webhook
    assert parse_device_classes(worker) == DEFAULT_DEVICE_CLASSES

    classes = [
        {"name": "gpu.h100.example.com", "gres": {"name": "gpu", "type": "h100"}},
        {"name": "gpu.nvidia.com", "gres": {"name": "gpu", "type": ""}},
        {"name": "nic.example.com", "gres": {"name": "nic"}},
        {"name": "dra.cpu", "slurm": "cpu"},
    ]
    worker, webhook = _dra_settings({"dra": {"deviceClasses": classes}})
    assert worker == webhook
    assert str(parse_device_classes(worker)) == (
        "dra.cpu=cpu,gpu.h100.example.com=gpu:h100,gpu.nvidia.com=gpu,nic.example.com=nic"
    )
    # None listed: no class is honoured (the processes read "" so).
    assert _dra_settings({"dra": {"deviceClasses": []}}) == ("", "")


def test_a_device_class_listed_twice_fails_the_render() -> None:
    twice = [{"name": "dra.cpu", "slurm": "cpu"}, {"name": "dra.cpu", "gres": {"name": "gpu"}}]
    with pytest.raises(helm.HelmError, match=r"dra\.deviceClasses: dra\.cpu is listed twice"):
        render({"dra": {"deviceClasses": twice}})


def _webhook_routes() -> set[str]:
    from webhook.app import Webhook, create_app
    from webhook.namespaces import StaticNamespaces
    from webhook.policy import AdmissionPolicy

    app = create_app(Webhook(policy=AdmissionPolicy(), namespaces=StaticNamespaces([])))
    return {str(getattr(route, "path", "")) for route in app.routes}


def test_webhook_probes_and_service_reach_the_webhook() -> None:
    documents = manifests()
    deployment = one(documents, "Deployment", "slurm-bridge-webhook")
    webhook = container(deployment, "webhook")
    routes = _webhook_routes()
    for probe in ("livenessProbe", "readinessProbe"):
        http = webhook[probe]["httpGet"]
        assert (http["scheme"], http["port"]) == ("HTTPS", "https")
        assert http["path"] in routes
    assert {"/healthz", "/readyz"} <= routes
    service = one(documents, "Service", "slurm-bridge-webhook")
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # cert-manager writes the Secret the webhook mounts, for the name the API server calls.
    certificate = one(documents, "Certificate")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert certificate["spec"]["secretName"] == volume["secret"]["secretName"]
    assert f"slurm-bridge-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] == one(documents, "Issuer")["metadata"]["name"]


def test_without_cert_manager_the_given_secret_is_mounted() -> None:
    documents = manifests(VARIANTS["without cert-manager"])
    assert find(documents, "Certificate") == []
    assert find(documents, "Issuer") == []
    deployment = one(documents, "Deployment", "slurm-bridge-webhook")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == "my-webhook-tls"


def test_an_existing_issuer_is_used_instead_of_a_new_one() -> None:
    documents = manifests(VARIANTS["existing cluster issuer"])
    assert find(documents, "Issuer") == []
    ref = one(documents, "Certificate")["spec"]["issuerRef"]
    assert ref == {"name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


def _admission_configurations(documents: list[Manifest]) -> list[Manifest]:
    return [
        d
        for d in documents
        if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]


@pytest.mark.parametrize("name", ["defaults", "everything on", "without cert-manager"])
def test_admission_webhooks_call_the_webhook_service(name: str) -> None:
    assert (CHART / "templates" / "admission-webhooks.yaml").exists(), "the webhook template is gone"
    values = VARIANTS[name]
    documents = manifests(values)
    configurations = _admission_configurations(documents)
    assert {c["kind"] for c in configurations} == {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    service = one(documents, "Service", "slurm-bridge-webhook")
    routes = _webhook_routes()
    webhook_values = values.get("webhook", {})
    for configuration in configurations:
        for hook in configuration["webhooks"]:
            ref = hook["clientConfig"]["service"]
            assert (ref["name"], ref["namespace"]) == (service["metadata"]["name"], NAMESPACE)
            assert ref.get("port", 443) == service["spec"]["ports"][0]["port"]
            assert ref["path"] in routes
            assert hook["failurePolicy"] == webhook_values.get("failurePolicy", "Fail")
            assert hook["timeoutSeconds"] == webhook_values.get("timeoutSeconds", 10)
            if name == "without cert-manager":
                assert hook["clientConfig"]["caBundle"] == CA_BUNDLE
        if name != "without cert-manager":
            annotations = configuration["metadata"].get("annotations", {})
            assert annotations.get("cert-manager.io/inject-ca-from") == f"{NAMESPACE}/slurm-bridge-webhook"


def test_webhook_disabled_renders_no_admission_configuration() -> None:
    assert _admission_configurations(manifests(VARIANTS["minimal"])) == []
