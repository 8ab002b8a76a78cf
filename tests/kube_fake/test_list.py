"""Behaviour 8: list shape, label and field selectors, selector errors."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from tests.kube_fake import FakeKubeServer
from tests.kube_fake.builders import Client, error_body, pod_body
from tests.kube_fake.selectors import SelectorError, parse_field_selector, parse_label_selector


@pytest.fixture
def populated(core: Client) -> Client:
    core.create_namespaced_pod("default", pod_body("a", labels={"app": "web", "tier": "1"}, nodeName="n1"))
    core.create_namespaced_pod(
        "default", pod_body("b", labels={"app": "db", "tier": "2"}, schedulerName="slurm")
    )
    core.create_namespaced_pod("default", pod_body("c", labels={"app": "batch"}))
    core.create_namespaced_pod("kube-system", pod_body("d", labels={"app": "web"}))
    core.patch_namespaced_pod_status("c", "default", {"status": {"phase": "Running"}})
    return core


def _names(core: Client, **kwargs: str) -> list[str]:
    return [p.metadata.name for p in core.list_namespaced_pod("default", **kwargs).items]


def test_list_shape(kube_fake: FakeKubeServer, populated: Client) -> None:
    raw = json.loads(populated.list_namespaced_pod("default", _preload_content=False).data)
    assert raw["kind"] == "PodList"
    assert raw["apiVersion"] == "v1"
    assert raw["metadata"] == {"resourceVersion": str(kube_fake.store.rv)}
    assert [i["metadata"]["name"] for i in raw["items"]] == ["a", "b", "c"]
    assert "kind" not in raw["items"][0]  # typed lists carry no per-item TypeMeta
    every = populated.list_pod_for_all_namespaces(label_selector="app=web")
    assert [(p.metadata.namespace, p.metadata.name) for p in every.items] == [
        ("default", "a"),
        ("kube-system", "d"),
    ]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a"]),
        ("app==web", ["a"]),
        ("app!=web", ["b", "c"]),
        ("app in (web, db)", ["a", "b"]),
        ("app notin (web,db)", ["c"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c"]),
        ("tier!=1", ["b", "c"]),
        ("app in (web,db),tier=2", ["b"]),
        ("tier>1", ["b"]),
        ("", ["a", "b", "c"]),
    ],
)
def test_label_selectors(populated: Client, selector: str, expected: list[str]) -> None:
    assert _names(populated, label_selector=selector) == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=b", ["b"]),
        ("metadata.name!=b", ["a", "c"]),
        ("metadata.namespace==default,metadata.name=c", ["c"]),
        ("spec.nodeName=n1", ["a"]),
        ("spec.nodeName=", ["b", "c"]),
        ("spec.schedulerName=default-scheduler", ["a", "c"]),
        ("status.phase=Running", ["c"]),
        ("status.phase!=Running", ["a", "b"]),
    ],
)
def test_field_selectors(populated: Client, selector: str, expected: list[str]) -> None:
    assert _names(populated, field_selector=selector) == expected


def test_selector_errors_are_400(populated: Client) -> None:
    with pytest.raises(ApiException) as exc:
        populated.list_namespaced_pod("default", field_selector="spec.priority=1")
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"], body["message"]) == (
        400,
        "BadRequest",
        "field label not supported: spec.priority",
    )
    with pytest.raises(ApiException) as exc:
        populated.list_node(field_selector="spec.nodeName=x")  # pod-only field
    assert exc.value.status == 400
    with pytest.raises(ApiException) as exc:
        populated.list_namespaced_pod("default", label_selector="app in ()")
    assert exc.value.status == 400


def test_selector_parsers() -> None:
    assert [(r.key, r.op, r.values) for r in parse_label_selector("a.io/x in (1, 2),!b")] == [
        ("a.io/x", "in", ("1", "2")),
        ("b", "!", ()),
    ]
    for bad in ("a=b,,c", "=x", "a b", "Bad/x=1", "x=inv@lid"):
        with pytest.raises(SelectorError):
            parse_label_selector(bad)
    req = parse_field_selector(r"metadata.name=a\,b")[0]
    assert (req.field, req.negate, req.value) == ("metadata.name", False, "a,b")
    with pytest.raises(SelectorError):
        parse_field_selector("nooperator")
