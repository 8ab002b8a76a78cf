"""The chart's webhook configurations send the webhook exactly what it handles.

Rendered with Helm (tests/deploy/chart.py); skipped where the Helm SDK wheel
is not installed.
"""

from typing import Any

import pytest

from tests.webhook.conftest import policy
from webhook.mutate import mutate
from webhook.review import AdmissionReview
from webhook.validate import validate

chart = pytest.importorskip("tests.deploy.chart", reason="needs the helm-python-sdk wheel (./dev test)")


def configurations() -> dict[str, dict[str, Any]]:
    documents = chart.manifests({})
    return {
        d["kind"]: d
        for d in documents
        if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    }


def request(group: str, resource: str, operation: str) -> Any:
    sub = ""
    if "/" in resource:
        resource, sub = resource.split("/")
    gvr = {"group": group, "version": "v1", "resource": resource}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "1",
            "kind": {"group": group, "version": "v1", "kind": "Thing"},
            "resource": gvr,
            "subResource": sub,
            "namespace": "hpc",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": {"metadata": {"name": "x"}, "spec": {}},
            "oldObject": {"metadata": {"name": "x"}, "spec": {}},
        },
    }
    return AdmissionReview.model_validate(review).request


def test_every_rule_is_one_the_webhook_handles() -> None:
    found = configurations()
    assert set(found) == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    decide = {"/mutate": mutate, "/validate": validate}
    for configuration in found.values():
        for hook in configuration["webhooks"]:
            assert hook["sideEffects"] == "None"
            assert hook["admissionReviewVersions"] == ["v1"]
            path = hook["clientConfig"]["service"]["path"]
            for rule in hook["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for operation in rule["operations"]:
                            response = decide[path](
                                request(group, resource, operation), managed=True, policy=policy()
                            )
                            assert response.status is None or response.status.code != 400, (
                                f"{path} does not handle {group}/{resource} {operation}: {response.status}"
                            )


def test_pods_and_resize_are_validated_and_only_pod_creation_is_mutated() -> None:
    found = configurations()
    mutating = found["MutatingWebhookConfiguration"]["webhooks"]
    # Two pod webhooks: pods naming our scheduler, and pods of managed namespaces.
    assert [r["resources"] for h in mutating for r in h["rules"]] == [["pods"], ["pods"]]
    assert [r["operations"] for h in mutating for r in h["rules"]] == [["CREATE"], ["CREATE"]]
    validating = [
        r["resources"] for h in found["ValidatingWebhookConfiguration"]["webhooks"] for r in h["rules"]
    ]
    assert ["pods"] in validating
    assert ["pods/resize"] in validating
