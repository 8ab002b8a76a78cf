"""Would the API server call the chart's admission webhooks? Evaluated offline, from the rendered chart.

This is not an API server. It takes the MutatingWebhookConfiguration and
ValidatingWebhookConfiguration that `helm template` renders (tests/deploy/chart.py)
and decides, for one AdmissionRequest-like `Request`, which webhooks the API
server would call, following the Kubernetes rules for admission webhooks:

1. `rules`: operation, API group, version, resource (`pods`, `pods/resize`,
   `*`, `pods/*`, `*/resize`) and scope must all match;
2. `namespaceSelector` against the labels of the request's namespace (which
   always include `kubernetes.io/metadata.name`);
3. `objectSelector` against the labels of the object and of the old object: it
   matches if either matches; a null object (CREATE's old, DELETE's new) never does;
4. `matchConditions`, evaluated with a real CEL engine (cel-python) over the
   variables `object`, `oldObject` (null when absent) and `request` (the
   AdmissionRequest, camelCase as in the API): any false → the webhook is skipped;
   otherwise any error → `failurePolicy` decides (Fail rejects the request, Ignore
   skips the webhook); all true → called.

`Chain.with_webhook_down` then says what happens while no webhook replica
answers: a call (or a matchCondition error) under `failurePolicy: Fail` rejects
the request, anything else lets it through.

Not modelled (the chart uses none of it, and the tests would fail loudly if it
did): `authorizer` in CEL (a condition naming it raises), matchPolicy
equivalence between API versions (the request names the version the rules
list), cluster-scoped resources, and mutation between webhooks (with the webhook
down nothing is mutated; `Chain.called` evaluates every webhook on the object
as given, so pass the mutated object to ask about validation after mutation).

Two differences between cel-python and the API server's cel-go are closed here
so that an expression passing these tests also works in a cluster:
`has(a.b.c)` errors when `a.b` is absent (cel-python would say false), and
nothing compares with null (cel-python errors, which shows up as a reject).
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, cast

import celpy
import lark
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError, Context, Evaluator

Json = dict[str, Any]
Tree = lark.Tree[lark.Token]
Call = Literal["called", "skipped", "error"]
KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# The matchCondition name rules of the API server (a qualified name, at most 64 of them).
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
MAX_MATCH_CONDITIONS = 64


class UnsupportedConfiguration(Exception):
    """The configuration uses something this evaluator does not model."""


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionRequest that decide whether a webhook is called."""

    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    namespace: str
    object: Json | None
    old_object: Json | None = None
    group: str = ""
    version: str = "v1"
    resource: str = "pods"
    sub_resource: str = ""
    kind: str = "Pod"
    username: str = "alice"
    groups: tuple[str, ...] = ("system:authenticated",)
    # The namespace's labels besides kubernetes.io/metadata.name (which it always has).
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def namespace_label_set(self) -> dict[str, str]:
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}

    def admission_request(self) -> Json:
        """The `request` variable of matchConditions: AdmissionRequest as the API server serializes it."""
        some = self.object or self.old_object or {}
        gvk = {"group": self.group, "version": self.version, "kind": self.kind}
        gvr = {"group": self.group, "version": self.version, "resource": self.resource}
        return {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": gvk,
            "resource": gvr,
            "subResource": self.sub_resource,
            "requestKind": gvk,
            "requestResource": gvr,
            "requestSubResource": self.sub_resource,
            "name": str((some.get("metadata") or {}).get("name", "")),
            "namespace": self.namespace,
            "operation": self.operation,
            "userInfo": {"username": self.username, "uid": "", "groups": list(self.groups)},
            "dryRun": False,
        }


# --- rules ---------------------------------------------------------------------------------------


def _resource_matches(pattern: str, resource: str, sub_resource: str) -> bool:
    want_resource, _, want_sub = pattern.partition("/")
    if not sub_resource:
        return not want_sub and want_resource in ("*", resource)
    return bool(want_sub) and want_resource in ("*", resource) and want_sub in ("*", sub_resource)


def rule_matches(rule: Mapping[str, Any], request: Request) -> bool:
    scope = rule.get("scope", "*")
    if scope == "Cluster" or not request.namespace:
        raise UnsupportedConfiguration("only namespaced resources are modelled")
    return (
        any(op in ("*", request.operation) for op in rule.get("operations", []))
        and any(g in ("*", request.group) for g in rule.get("apiGroups", []))
        and any(v in ("*", request.version) for v in rule.get("apiVersions", []))
        and any(_resource_matches(r, request.resource, request.sub_resource) for r in rule["resources"])
    )


# --- label selectors (metav1.LabelSelector, the API server's semantics) --------------------------


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """An absent or empty selector matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator in ("In", "NotIn") and not values:
            raise UnsupportedConfiguration(f"{operator} on {key} without values is invalid in Kubernetes")
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise UnsupportedConfiguration(f"unknown selector operator {operator}")
    return True


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def object_selector_matches(selector: Mapping[str, Any] | None, request: Request) -> bool:
    if not selector:
        return True
    objects = [o for o in (request.object, request.old_object) if o is not None]
    return any(selector_matches(selector, _labels(o)) for o in objects)


# --- CEL -----------------------------------------------------------------------------------------


def _single_member_dot(tree: Tree) -> Tree | None:
    """The `member_dot` node of `has(<member>.<field>)`'s argument (under a chain of one-child nodes)."""
    node = tree
    while isinstance(node, lark.Tree) and node.data != "member_dot":
        if len(node.children) != 1:
            return None
        node = cast(Tree, node.children[0])
    return node if isinstance(node, lark.Tree) else None


class StrictEvaluator(Evaluator):
    """cel-python with cel-go's `has()`: `has(e.f)` is an error unless `e` evaluates to a map."""

    def macro_has_eval(self, exprlist: Tree) -> celtypes.BoolType:
        member_dot = _single_member_dot(cast(Tree, exprlist.children[0]))
        if member_dot is None:
            raise UnsupportedConfiguration("has() takes a field selection, e.g. has(object.spec)")
        operand = self.visit(cast(Tree, member_dot.children[0]))
        name = str(member_dot.children[1])
        if isinstance(operand, celtypes.MapType):
            return celtypes.BoolType(celtypes.StringType(name) in operand)
        if isinstance(operand, CELEvalError):
            return cast(celtypes.BoolType, operand)  # errors propagate, as in cel-go
        return cast(
            celtypes.BoolType,
            CELEvalError(f"has(): no such key {name!r} on {type(operand).__name__}", KeyError, (name,)),
        )


class StrictRunner(celpy.InterpretedRunner):
    def evaluate(self, context: Context) -> celtypes.Value:
        return StrictEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


_ENVIRONMENT = celpy.Environment(runner_class=StrictRunner)


@cache
def compile_condition(expression: str) -> celpy.Runner:
    """Compile one matchCondition; a syntax error is a broken chart, raised at once."""
    if re.search(r"\bauthorizer\b", expression):
        raise UnsupportedConfiguration("matchConditions using `authorizer` are not modelled")
    if re.search(r"\bnull\b", expression):
        # cel-go compares anything with null (heterogeneous equality); cel-python errors.
        raise UnsupportedConfiguration("compare request.operation instead of comparing with null")
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression))


def evaluate_condition(expression: str, request: Request) -> bool | CELEvalError:
    """True/False, or the error the API server would hit (a non-bool result is one too)."""
    program = compile_condition(expression)
    activation = {
        "object": json_to_cel(request.object),
        "oldObject": json_to_cel(request.old_object),
        "request": json_to_cel(request.admission_request()),
    }
    try:
        result = program.evaluate(activation)
    except CELEvalError as error:
        return error
    if isinstance(result, CELEvalError):
        return result
    if not isinstance(result, celtypes.BoolType):
        return CELEvalError(f"expression returned {type(result).__name__}, not bool", TypeError, ())
    return bool(result)


def match_conditions(webhook: Mapping[str, Any], request: Request) -> Call:
    """The API server's order: any false skips, else any error is an error, else the webhook is called."""
    results = [evaluate_condition(c["expression"], request) for c in webhook.get("matchConditions") or []]
    if any(r is False for r in results):
        return "skipped"
    if any(isinstance(r, CELEvalError) for r in results):
        return "error"
    return "called"


# --- the chain -----------------------------------------------------------------------------------


def calls(webhook: Mapping[str, Any], request: Request) -> Call:
    """Would the API server call this webhook for this request?"""
    if not any(rule_matches(rule, request) for rule in webhook.get("rules") or []):
        return "skipped"
    if not selector_matches(webhook.get("namespaceSelector"), request.namespace_label_set()):
        return "skipped"
    if not object_selector_matches(webhook.get("objectSelector"), request):
        return "skipped"
    return match_conditions(webhook, request)


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    # The webhook whose failure (call or matchCondition error, under failurePolicy Fail) rejects it.
    rejected_by: str | None = None


@dataclass(frozen=True)
class Webhook:
    kind: str
    name: str
    spec: Mapping[str, Any]

    @property
    def failure_policy(self) -> str:
        return str(self.spec.get("failurePolicy", "Fail"))

    @property
    def path(self) -> str:
        return str(self.spec["clientConfig"]["service"]["path"])


@dataclass(frozen=True)
class Chain:
    """Every admission webhook of the rendered chart, mutating ones first (the API server's order)."""

    webhooks: tuple[Webhook, ...]

    @classmethod
    def from_manifests(cls, documents: Iterable[Mapping[str, Any]]) -> "Chain":
        found = [d for d in documents if d.get("kind") in KINDS]
        found.sort(key=lambda d: KINDS.index(d["kind"]))
        webhooks = tuple(Webhook(d["kind"], w["name"], w) for d in found for w in d.get("webhooks") or [])
        for webhook in webhooks:
            check_match_conditions(webhook)
        return cls(webhooks)

    def get(self, name: str) -> Webhook:
        return next(w for w in self.webhooks if w.name == name)

    def decisions(self, request: Request) -> dict[str, Call]:
        return {w.name: calls(w.spec, request) for w in self.webhooks}

    def called(self, request: Request) -> set[str]:
        """Webhooks the API server would call (or fail to decide about) for this exact object."""
        return {name for name, call in self.decisions(request).items() if call != "skipped"}

    def with_webhook_down(self, request: Request) -> Outcome:
        """What the API server answers while the webhook does not answer at all."""
        for webhook in self.webhooks:
            if calls(webhook.spec, request) != "skipped" and webhook.failure_policy == "Fail":
                return Outcome(allowed=False, rejected_by=webhook.name)
        return Outcome(allowed=True)


def check_match_conditions(webhook: Webhook) -> None:
    """What the API server checks when the configuration is created, and compilation."""
    conditions = webhook.spec.get("matchConditions") or []
    names = [c["name"] for c in conditions]
    if len(conditions) > MAX_MATCH_CONDITIONS:
        raise UnsupportedConfiguration(f"{webhook.name}: more than {MAX_MATCH_CONDITIONS} matchConditions")
    if len(set(names)) != len(names):
        raise UnsupportedConfiguration(f"{webhook.name}: matchCondition names must be unique: {names}")
    for condition in conditions:
        if not QUALIFIED_NAME.fullmatch(condition["name"]):
            raise UnsupportedConfiguration(f"{webhook.name}: {condition['name']!r} is not a qualified name")
        compile_condition(condition["expression"])
