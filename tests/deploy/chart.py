"""Render the Helm chart offline and validate what it renders.

Rendering uses Helm itself (the Go Helm SDK inside the `helm-python-sdk` wheel),
so templates, `required`, `toYaml` and values.schema.json behave exactly as
under `helm install`; nothing contacts a cluster. Validation uses the
Kubernetes OpenAPI schemas shipped in the `kubernetes-validate` wheel (strict:
unknown fields are errors), and for the few custom resources the chart can
create (cert-manager, Prometheus Operator), small schemas of the fields the
chart writes (`CRD_SCHEMAS`), since no Kubernetes schema covers them.
"""

from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema  # type: ignore[import-untyped,unused-ignore]
import kubernetes_validate  # type: ignore[import-untyped,unused-ignore]
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "slurm-bridge"
RELEASE = "slurm-bridge"
NAMESPACE = "slurm-bridge"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the
# newest that kubernetes-validate ships schemas for.
KUBERNETES_VERSIONS = ("1.31", "1.37")

Manifest = dict[str, Any]


def render(values: Mapping[str, Any] | None = None, *, name: str = RELEASE) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included), as `helm template` would."""
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(dict(values or {}), name=name, namespace=NAMESPACE, is_install=True)


def manifests(values: Mapping[str, Any] | None = None, *, name: str = RELEASE) -> list[Manifest]:
    documents: list[Manifest] = []
    for path, text in sorted(render(values, name=name).items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        for document in yaml.safe_load_all(text):
            if document is None:
                continue
            assert isinstance(document, dict), f"{path}: a manifest must be a mapping, got {document!r}"
            documents.append(document)
    return documents


def find(documents: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(documents: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(documents, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


class InvalidManifest(AssertionError):
    pass


def _string_map() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": {"type": "string"}}


_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": _string_map(), "matchExpressions": {"type": "array"}},
}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": _string_map(),
        "annotations": _string_map(),
    },
}
_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
_KEY_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
    "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
]  # fmt: skip


def _crd(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


# The fields of cert-manager.io/v1 and monitoring.coreos.com/v1 that the chart
# writes, with their types and enums from those projects' CRDs; any other field
# is an error, as in kubernetes-validate's strict mode.
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Issuer"): _crd(
        {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {
                "selfSigned": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"crlDistributionPoints": {"type": "array"}},
                },
                "ca": {"type": "object", "required": ["secretName"]},
                "acme": {"type": "object"},
                "vault": {"type": "object"},
                "venafi": {"type": "object"},
            },
        }
    ),
    ("cert-manager.io/v1", "Certificate"): _crd(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["secretName", "issuerRef"],
            "properties": {
                "secretName": {"type": "string", "minLength": 1},
                "duration": _DURATION,
                "renewBefore": _DURATION,
                "commonName": {"type": "string"},
                "dnsNames": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                "isCA": {"type": "boolean"},
                "usages": {"type": "array", "items": {"enum": _KEY_USAGES}},
                "privateKey": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "encoding": {"enum": ["PKCS1", "PKCS8"]},
                        "size": {"type": "integer"},
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                    },
                },
                "issuerRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "kind": {"type": "string"},
                        "group": {"type": "string"},
                    },
                },
            },
        }
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _crd(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {"type": "object"},
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                        },
                    },
                },
            },
        }
    ),
}


@cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(CRD_SCHEMAS[api_version, kind])


def validate(document: Manifest, version: str) -> None:
    """Raise InvalidManifest unless `document` is valid for Kubernetes `version`."""
    what = f"{document.get('kind')} {document.get('metadata', {}).get('name')}"
    key = (document.get("apiVersion", ""), document.get("kind", ""))
    if key in CRD_SCHEMAS:
        errors = sorted(_crd_validator(*key).iter_errors(document), key=lambda e: list(e.path))
        if errors:
            raise InvalidManifest(f"{what}: {errors[0].json_path}: {errors[0].message}")
        return
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError as error:
        raise InvalidManifest(f"{what}: {error.message}") from None
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        raise InvalidManifest(f"{what} (Kubernetes {version}): {path}: {error.message}") from None


def walk(value: Any) -> Iterator[Any]:
    """Every value nested in a manifest (for "no X anywhere" checks)."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


def container(deployment: Manifest, name: str) -> dict[str, Any]:
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return dict(c)
    raise AssertionError(f"no container {name} in {deployment['metadata']['name']}")


def env_of(deployment: Manifest, name: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(deployment, name).get("env", [])}
