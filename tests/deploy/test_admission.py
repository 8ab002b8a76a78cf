"""The admission chain evaluator (tests/deploy/admission.py) follows the API server's rules.

Hand-written webhook configurations, so each rule is tested on its own; the
chart's own configurations are tested in test_webhook_scope.py.
"""

from typing import Any

import pytest

from tests.deploy.admission import (
    Chain,
    Request,
    UnsupportedConfiguration,
    calls,
    compile_condition,
    evaluate_condition,
    object_selector_matches,
    rule_matches,
    selector_matches,
)

POD: dict[str, Any] = {"metadata": {"name": "p", "labels": {"app": "web"}}, "spec": {"schedulerName": "s"}}


def hook(name: str = "h", *, policy: str = "Fail", **spec: Any) -> dict[str, Any]:
    return {
        "name": name,
        "failurePolicy": policy,
        "clientConfig": {"service": {"name": "svc", "namespace": "ns", "path": "/validate"}},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        **spec,
    }


def chain(*hooks: dict[str, Any], kind: str = "ValidatingWebhookConfiguration") -> Chain:
    return Chain.from_manifests([{"kind": kind, "webhooks": list(hooks)}])


def conditions(*expressions: str) -> list[dict[str, str]]:
    return [{"name": f"c{i}", "expression": e} for i, e in enumerate(expressions)]


@pytest.mark.parametrize(
    ("resources", "operations", "request_", "matches"),
    [
        (["pods"], ["CREATE"], Request("CREATE", "ns", POD), True),
        (["pods"], ["CREATE"], Request("UPDATE", "ns", POD, POD), False),
        (["pods"], ["*"], Request("DELETE", "ns", None, POD), True),
        (["pods"], ["UPDATE"], Request("UPDATE", "ns", POD, POD, sub_resource="resize"), False),
        (["pods/resize"], ["UPDATE"], Request("UPDATE", "ns", POD, POD, sub_resource="resize"), True),
        (["pods/resize"], ["UPDATE"], Request("UPDATE", "ns", POD, POD), False),
        (["*"], ["UPDATE"], Request("UPDATE", "ns", POD, POD, sub_resource="status"), False),
        (["pods/*"], ["UPDATE"], Request("UPDATE", "ns", POD, POD, sub_resource="status"), True),
        (["*/resize"], ["UPDATE"], Request("UPDATE", "ns", POD, POD, sub_resource="resize"), True),
        (["*"], ["CREATE"], Request("CREATE", "ns", POD, resource="configmaps", kind="ConfigMap"), True),
        (["pods"], ["CREATE"], Request("CREATE", "ns", POD, group="apps", resource="pods"), False),
        (["pods"], ["CREATE"], Request("CREATE", "ns", POD, version="v2"), False),
    ],
)
def test_rules(resources: list[str], operations: list[str], request_: Request, matches: bool) -> None:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": operations, "resources": resources}
    assert rule_matches(rule, request_) is matches


def test_cluster_scoped_requests_are_not_modelled() -> None:
    with pytest.raises(UnsupportedConfiguration):
        rule_matches({"resources": ["*"], "scope": "Cluster"}, Request("CREATE", "", POD))


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (None, {}, True),
        ({}, {"a": "b"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "b", "c": "d"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "c"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["b", "c"]}]}, {"a": "c"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}, {}, False),
        # NotIn matches objects without the key, as in Kubernetes.
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["b"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["b"]}]}, {"a": "b"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        (
            {"matchLabels": {"x": "1"}, "matchExpressions": [{"key": "a", "operator": "Exists"}]},
            {"a": "1"},
            False,
        ),
    ],
)
def test_label_selectors(selector: dict[str, Any] | None, labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


def test_an_invalid_selector_is_refused_not_guessed() -> None:
    with pytest.raises(UnsupportedConfiguration, match="without values"):
        selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, {})


def test_the_namespace_name_label_is_always_there() -> None:
    by_name = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["hpc"]}]
    }
    webhook = hook(namespaceSelector=by_name)
    assert calls(webhook, Request("CREATE", "hpc", POD)) == "called"
    assert calls(webhook, Request("CREATE", "web", POD)) == "skipped"
    labelled = hook(namespaceSelector={"matchLabels": {"team": "hpc"}})
    assert calls(labelled, Request("CREATE", "web", POD, namespace_labels={"team": "hpc"})) == "called"


def test_the_object_selector_matches_either_object_never_a_null_one() -> None:
    not_web = {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}
    other = {"metadata": {"name": "p", "labels": {"app": "db"}}}
    assert object_selector_matches(not_web, Request("UPDATE", "ns", POD, old_object=other))
    assert object_selector_matches(not_web, Request("UPDATE", "ns", other, old_object=POD))
    assert not object_selector_matches(not_web, Request("UPDATE", "ns", POD, old_object=POD))
    assert not object_selector_matches(not_web, Request("CREATE", "ns", POD))
    # A null object does not match even a selector its absent labels would satisfy...
    assert not object_selector_matches(not_web, Request("DELETE", "ns", None, old_object=POD))
    # ... but an empty selector matches everything.
    assert object_selector_matches({}, Request("DELETE", "ns", None, old_object=POD))


def test_match_conditions_see_object_old_object_and_request() -> None:
    update = Request("UPDATE", "hpc", POD, old_object={"metadata": {"name": "p"}}, username="bob")
    assert evaluate_condition("object.spec.schedulerName == 's'", update) is True
    assert evaluate_condition("has(oldObject.metadata.labels)", update) is False
    assert evaluate_condition("request.userInfo.username == 'bob'", update) is True
    assert evaluate_condition("request.operation == 'UPDATE' && request.namespace == 'hpc'", update) is True
    resize = Request("UPDATE", "hpc", POD, POD, sub_resource="resize")
    assert evaluate_condition("request.subResource == 'resize'", resize) is True


def test_false_beats_error_and_error_beats_true() -> None:
    request = Request("CREATE", "ns", POD)
    missing = "object.spec.nodeName == 'n'"  # no such key: an error
    assert calls(hook(matchConditions=conditions("true", missing, "false")), request) == "skipped"
    assert calls(hook(matchConditions=conditions("true", missing)), request) == "error"
    assert calls(hook(matchConditions=conditions("true", "1 == 1")), request) == "called"
    # Errors are absorbed by || and && where CEL says so.
    assert calls(hook(matchConditions=conditions(f"{missing} || true")), request) == "called"


def test_a_non_boolean_result_is_an_error() -> None:
    assert calls(hook(matchConditions=conditions("object.spec")), Request("CREATE", "ns", POD)) == "error"


def test_has_errors_on_an_absent_parent_as_in_the_api_server() -> None:
    create = Request("CREATE", "ns", POD)
    assert evaluate_condition("has(object.spec.schedulerName)", create) is True
    assert evaluate_condition("has(object.spec.nodeName)", create) is False
    # cel-go: has() tests only the last step; an absent `status` is an error, not false.
    assert not isinstance(evaluate_condition("has(object.status.phase)", create), bool)
    assert evaluate_condition("has(object.status) && has(object.status.phase)", create) is False
    # oldObject is null on CREATE: selecting from it is an error unless guarded.
    assert not isinstance(evaluate_condition("has(oldObject.spec)", create), bool)
    assert evaluate_condition("request.operation == 'UPDATE' && has(oldObject.spec)", create) is False


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("authorizer.group('').resource('pods').check('create').allowed()", "authorizer"),
        ("oldObject == null", "null"),
    ],
)
def test_what_is_not_modelled_is_refused(expression: str, problem: str) -> None:
    with pytest.raises(UnsupportedConfiguration, match=problem):
        compile_condition(expression)


def test_a_syntax_error_is_raised_when_the_chain_is_built() -> None:
    with pytest.raises(Exception, match="object"):
        chain(hook(matchConditions=conditions("object.spec.(")))


@pytest.mark.parametrize(
    "bad",
    [
        conditions("true") + conditions("false"),  # duplicate name c0
        [{"name": "-bad", "expression": "true"}],
        [{"name": f"c{i}", "expression": "true"} for i in range(65)],
    ],
)
def test_configurations_the_api_server_refuses_are_refused(bad: list[dict[str, str]]) -> None:
    with pytest.raises(UnsupportedConfiguration):
        chain(hook(matchConditions=bad))


def test_with_the_webhook_down_fail_rejects_and_ignore_passes() -> None:
    request = Request("CREATE", "ns", POD)
    assert chain(hook(policy="Fail")).with_webhook_down(request).rejected_by == "h"
    assert chain(hook(policy="Ignore")).with_webhook_down(request).allowed
    skipped = hook(policy="Fail", matchConditions=conditions("false"))
    assert chain(skipped).with_webhook_down(request).allowed
    # A matchCondition error is decided by failurePolicy too, webhook up or down.
    broken = conditions("object.spec.nodeName == 'x'")
    assert not chain(hook(policy="Fail", matchConditions=broken)).with_webhook_down(request).allowed
    assert chain(hook(policy="Ignore", matchConditions=broken)).with_webhook_down(request).allowed


def test_mutating_webhooks_come_first() -> None:
    documents: list[dict[str, Any]] = [
        {"kind": "ValidatingWebhookConfiguration", "webhooks": [hook("v")]},
        {"kind": "MutatingWebhookConfiguration", "webhooks": [hook("m")]},
        {"kind": "ConfigMap"},
    ]
    found = Chain.from_manifests(documents)
    assert [w.name for w in found.webhooks] == ["m", "v"]
    assert found.with_webhook_down(Request("CREATE", "ns", POD)).rejected_by == "m"
    assert found.called(Request("CREATE", "ns", POD)) == {"m", "v"}
