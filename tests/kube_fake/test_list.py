"""Behaviour 8: list shape, label and field selectors, selector errors.

Run against the fake and the real kube-apiserver alike (``kube_api``), except the
unit tests of the fake's selector parsers.
"""

from __future__ import annotations

import json

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake.backend import CustomResource, KubeApi
from testbed.kube_fake.builders import Client, error_body, pod_body
from testbed.kube_fake.selectors import SelectorError, parse_field_selector, parse_label_selector


@pytest.fixture
def populated(kube_api: KubeApi) -> KubeApi:
    """Pods a, b, c in the test's namespace (and d in a second one) to select from."""
    core, ns = kube_api.core, kube_api.namespace
    other = kube_api.other_namespace()
    core.create_namespaced_pod(ns, pod_body("a", labels={"app": "web", "tier": "1"}, nodeName="n1"))
    core.create_namespaced_pod(ns, pod_body("b", labels={"app": "db", "tier": "2"}, schedulerName="slurm"))
    core.create_namespaced_pod(ns, pod_body("c", labels={"app": "batch"}))
    core.create_namespaced_pod(other, pod_body("d", labels={"app": "web"}))
    core.patch_namespaced_pod_status("c", ns, {"status": {"phase": "Running"}})
    return kube_api


def _names(api: KubeApi, **kwargs: str) -> list[str]:
    return [p.metadata.name for p in api.core.list_namespaced_pod(api.namespace, **kwargs).items]


def test_list_shape(populated: KubeApi) -> None:
    core, ns = populated.core, populated.namespace
    raw = json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)
    assert raw["kind"] == "PodList"
    assert raw["apiVersion"] == "v1"
    assert list(raw["metadata"]) == ["resourceVersion"]
    if populated.fake is not None:
        assert raw["metadata"]["resourceVersion"] == str(populated.fake.store.rv)
    assert [i["metadata"]["name"] for i in raw["items"]] == ["a", "b", "c"]
    assert "kind" not in raw["items"][0]  # typed lists carry no per-item TypeMeta
    every = core.list_pod_for_all_namespaces(label_selector="app=web")
    ours = [
        (p.metadata.namespace, p.metadata.name) for p in every.items if p.metadata.namespace.startswith(ns)
    ]
    # etcd key order, "namespace/name" as one string: "<ns>-b/d" sorts before "<ns>/a".
    assert ours == [(f"{ns}-b", "d"), (ns, "a")]


def test_a_custom_resource_list_keeps_item_kinds(kube_api: KubeApi, widgets: CustomResource) -> None:
    custom: Client = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    args = (widgets.group, widgets.version, kube_api.namespace, widgets.plural)
    custom.create_namespaced_custom_object(
        *args, {"apiVersion": widgets.api_version, "kind": widgets.kind, "metadata": {"name": "w"}}
    )
    listed = custom.list_namespaced_custom_object(*args)
    assert (listed["kind"], listed["apiVersion"]) == (f"{widgets.kind}List", widgets.api_version)
    assert [(i["kind"], i["apiVersion"]) for i in listed["items"]] == [(widgets.kind, widgets.api_version)]
    assert listed["metadata"]["continue"] == ""  # an unstructured list says so


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
        ("tier<2", ["a"]),
        ("app in (web,db), !tier", []),
        ("app,tier notin (2)", ["a", "c"]),
        ("", ["a", "b", "c"]),
    ],
)
def test_label_selectors(populated: KubeApi, selector: str, expected: list[str]) -> None:
    assert _names(populated, label_selector=selector) == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=b", ["b"]),
        ("metadata.name!=b", ["a", "c"]),
        ("metadata.name=c,metadata.namespace!=elsewhere", ["c"]),
        (r"metadata.name=a\,b", []),
        ("spec.nodeName=n1", ["a"]),
        ("spec.nodeName=", ["b", "c"]),
        ("spec.schedulerName=default-scheduler", ["a", "c"]),
        ("status.phase=Running", ["c"]),
        ("status.phase!=Running", ["a", "b"]),
    ],
)
def test_field_selectors(populated: KubeApi, selector: str, expected: list[str]) -> None:
    assert _names(populated, field_selector=selector) == expected


def test_an_empty_value_set_means_the_empty_value(kube_api: KubeApi) -> None:
    """As labels.Parse reads it: "()" and empty members stand for "" (not a parse error)."""
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("empty", labels={"app": ""}))
    core.create_namespaced_pod(ns, pod_body("web", labels={"app": "web"}))
    core.create_namespaced_pod(ns, pod_body("none"))
    api = kube_api
    assert _names(api, label_selector="app in ()") == ["empty"]
    assert _names(api, label_selector="app notin ()") == ["none", "web"]
    assert _names(api, label_selector="app in (web,)") == ["empty", "web"]
    assert _names(api, label_selector="app=") == ["empty"]
    assert _names(api, field_selector="spec.nodeName=,metadata.name!=web") == ["empty", "none"]


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("app in (a", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        ("=x", "found '=', expected: !, identifier, or 'end of string'"),
        ("a=b,,c", "found ',', expected: identifier after ','"),
        ("!x=1", "found '=', expected: ',' or 'end of string'"),
        (
            "tier>a",
            'unable to parse requirement: values[0]: Invalid value: "a": '
            "for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        (
            "tier<99999999999999999999",  # beyond int64, as strconv.ParseInt reads it
            'unable to parse requirement: values[0]: Invalid value: "99999999999999999999": '
            "for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        (
            "Bad/x=1",
            'unable to parse requirement: <nil>: Invalid value: "Bad/x": '
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
            "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ),
        (
            "x in (a,inv@lid)",
            'unable to parse requirement: values[1][x]: Invalid value: "inv@lid": '
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
            "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
        ),
    ],
)
def test_label_selector_errors_are_400(kube_api: KubeApi, selector: str, message: str) -> None:
    with pytest.raises(ApiException) as exc:
        kube_api.core.list_namespaced_pod(kube_api.namespace, label_selector=selector)
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "BadRequest",
        "code": 400,
    }


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("spec.priority=1", "field label not supported: spec.priority"),
        ("nooperator", "invalid selector: 'nooperator'; can't understand 'nooperator'"),
        ("metadata.name=a=b", "invalid field selector: unescaped character in value: 61"),
        (r"metadata.name=a\x", "invalid field selector: invalid escape sequence: \\x"),
    ],
)
def test_field_selector_errors_are_400(kube_api: KubeApi, selector: str, message: str) -> None:
    with pytest.raises(ApiException) as exc:
        kube_api.core.list_namespaced_pod(kube_api.namespace, field_selector=selector)
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"], body["message"]) == (400, "BadRequest", message)


def test_a_field_of_another_kind_is_400(kube_api: KubeApi) -> None:
    with pytest.raises(ApiException) as exc:
        kube_api.core.list_node(field_selector="spec.nodeName=x")  # a pod's field
    body = error_body(exc.value)
    assert (exc.value.status, body["message"]) == (400, "field label not supported: spec.nodeName")


def test_selector_parsers() -> None:
    """The label parser is bridge.labels' (tests/webhook/test_labels.py); the fake's errors are 400s."""
    selector = parse_label_selector("a.io/x in (1, 2),!b")
    assert [(r.key, r.operator, r.values) for r in selector.requirements] == [
        ("a.io/x", "In", frozenset({"1", "2"})),
        ("b", "DoesNotExist", frozenset()),
    ]
    assert parse_label_selector(None).empty
    for bad in ("a=b,,c", "=x", "a b", "Bad/x=1", "x=inv@lid"):
        with pytest.raises(SelectorError):
            parse_label_selector(bad)
    req = parse_field_selector(r"metadata.name=a\,b")[0]
    assert (req.field, req.negate, req.value) == ("metadata.name", False, "a,b")
    with pytest.raises(SelectorError):
        parse_field_selector("nooperator")
