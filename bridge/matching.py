"""Kubernetes' scheduling matchers: tolerations against taints, node selectors against nodes.

The one implementation the node rules (bridge/feasibility.py) and the fake API
server's controllers (testbed/kube_fake, e.g. its taint-eviction controller) use;
label requirements are `bridge.labels`'. Pure: objects in, verdicts out.

- Tolerations: Toleration.ToleratesTaint, with the alpha Lt and Gt operators
  (feature gate TaintTolerationComparisonOperators) as a switch.
- Node selectors: `spec.nodeSelector` (every label equal) and the required node
  affinity (`requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`):
  terms ORed, requirements within a term ANDed; an empty term list, or a term
  with neither matchExpressions nor matchFields, matches no node; a term with an
  invalid requirement matches no node; NotIn and DoesNotExist match a node
  without the label; Gt and Lt compare the label and the value as 64-bit
  integers and fail when either is not one; matchFields supports In and NotIn
  with exactly one value, on `metadata.name` (k8s.io/component-helpers'
  nodeaffinity). A failure is told in words, for the node rules' reasons.
  Label keys and values are not re-validated: the API server did that when the
  pod was created.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bridge.labels import OPERATORS, Requirement, operator_problem, parse_int64

Node = Mapping[str, Any]


# -- reading untyped JSON (a pod or node as the API server sent it) -------------------


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# -- tolerations ---------------------------------------------------------------


def toleration_tolerates(
    toleration: Mapping[str, Any], taint: Mapping[str, Any], *, comparison_operators: bool = True
) -> bool:
    """Kubernetes' Toleration.ToleratesTaint.

    Empty effect matches every effect; empty key matches every key; operator
    Exists matches every value, Equal (the default) needs the same value; Lt
    and Gt (alpha, TaintTolerationComparisonOperators) compare integers, or
    never match with `comparison_operators` off (the feature gate's default).
    """
    effect, key = as_str(toleration.get("effect")), as_str(toleration.get("key"))
    if effect and effect != as_str(taint.get("effect")):
        return False
    if key and key != as_str(taint.get("key")):
        return False
    operator = as_str(toleration.get("operator"))
    wanted, actual = as_str(toleration.get("value")), as_str(taint.get("value"))
    if operator in ("", "Equal"):
        return wanted == actual
    if operator == "Exists":
        return True
    if operator in ("Lt", "Gt") and comparison_operators:
        limit, value = parse_int64(wanted), parse_int64(actual)
        if limit is None or value is None:
            return False
        return value < limit if operator == "Lt" else value > limit
    return False


def tolerates(
    tolerations: Iterable[Any], taint: Mapping[str, Any], *, comparison_operators: bool = True
) -> bool:
    """Does any of the tolerations tolerate the taint (TolerationsTolerateTaint)?"""
    return any(
        isinstance(t, Mapping) and toleration_tolerates(t, taint, comparison_operators=comparison_operators)
        for t in tolerations
    )


# -- node selectors ------------------------------------------------------------


def _requirement_text(requirement: Mapping[str, Any]) -> str:
    key, operator = as_str(requirement.get("key")), as_str(requirement.get("operator"))
    values = [str(v) for v in as_list(requirement.get("values"))]
    if operator in ("Exists", "DoesNotExist") and not values:
        return f"{key} {operator}"
    if operator in ("Gt", "Lt") and len(values) == 1:
        return f"{key} {operator} {values[0]}"
    return f"{key} {operator} [{', '.join(values)}]"


def _label_requirement(requirement: Mapping[str, Any]) -> Requirement | str:
    """A matchExpressions entry as a label requirement, or why Kubernetes would refuse to parse it."""
    operator = as_str(requirement.get("operator"))
    values = as_list(requirement.get("values"))
    if problem := operator_problem(operator, values):
        return problem
    strings = frozenset(v for v in values if isinstance(v, str))  # the API server allows no other
    return Requirement(as_str(requirement.get("key")), OPERATORS[operator], strings)


def _field_requirement_problem(requirement: Mapping[str, Any]) -> str | None:
    operator = as_str(requirement.get("operator"))
    if operator not in ("In", "NotIn"):
        return f'unsupported operator "{operator}" for matchFields (only In and NotIn)'
    if len(as_list(requirement.get("values"))) != 1:
        return "matchFields In and NotIn need exactly one value"
    return None


def _field_requirement_matches(requirement: Mapping[str, Any], node: Node) -> bool:
    # Only metadata.name is a node field; any other key reads as "" (fields.Set.Get).
    fields = {"metadata.name": as_str(as_mapping(node.get("metadata")).get("name"))}
    actual = fields.get(as_str(requirement.get("key")), "")
    wanted = as_list(requirement.get("values"))[0]
    equal = actual == wanted
    return equal if as_str(requirement.get("operator")) == "In" else not equal


def _term_failure(term: Mapping[str, Any], node: Node) -> str | None:
    """Why a non-empty nodeSelectorTerm does not match the node; None when it does."""
    expressions = [r for r in as_list(term.get("matchExpressions")) if isinstance(r, Mapping)]
    fields = [r for r in as_list(term.get("matchFields")) if isinstance(r, Mapping)]
    # A parse error anywhere in the term makes the whole term match nothing.
    parsed: list[tuple[Mapping[str, Any], Requirement]] = []
    for requirement in expressions:
        found = _label_requirement(requirement)
        if isinstance(found, str):
            return f"{_requirement_text(requirement)} is invalid ({found})"
        parsed.append((requirement, found))
    for requirement in fields:
        if problem := _field_requirement_problem(requirement):
            return f"matchFields {_requirement_text(requirement)} is invalid ({problem})"
    labels = as_mapping(as_mapping(node.get("metadata")).get("labels"))
    for requirement, label_requirement in parsed:
        if not label_requirement.matches(labels):
            key = label_requirement.key
            has = f"{key}={labels[key]}" if key in labels else f"no label {key}"
            return f"{_requirement_text(requirement)} is false (node has {has})"
    for requirement in fields:
        if not _field_requirement_matches(requirement, node):
            return f"matchFields {_requirement_text(requirement)} is false"
    return None


def _is_empty_term(term: Any) -> bool:
    term = as_mapping(term)
    return not as_list(term.get("matchExpressions")) and not as_list(term.get("matchFields"))


def node_selector_terms_failure(terms: Sequence[Any], node: Node) -> str | None:
    """Why required node affinity terms (ORed) exclude the node; None when one matches."""
    candidates = [as_mapping(t) for t in terms if not _is_empty_term(t)]
    if not candidates:
        return "required node affinity has no non-empty nodeSelectorTerms, which matches no node"
    failures: list[str] = []
    for index, term in enumerate(candidates, 1):
        failure = _term_failure(term, node)
        if failure is None:
            return None
        failures.append(failure if len(candidates) == 1 else f"term {index}: {failure}")
    if len(candidates) == 1:
        return f"required node affinity does not match: {failures[0]}"
    return f"none of the {len(candidates)} required node affinity terms match: {'; '.join(failures)}"


def node_affinity_failure(spec: Mapping[str, Any], node: Node) -> str | None:
    """Why the pod's `spec.nodeSelector` or required node affinity keeps it off the node, or None."""
    labels = as_mapping(as_mapping(node.get("metadata")).get("labels"))
    for key, wanted in as_mapping(spec.get("nodeSelector")).items():
        # labels.SelectorFromSet: key=value for every entry.
        equal = Requirement(key, "In", frozenset({wanted} if isinstance(wanted, str) else ()))
        if not equal.matches(labels):
            has = f"{key}={labels[key]}" if key in labels else f"no label {key}"
            return f"nodeSelector {key}={wanted} does not match (node has {has})"
    affinity = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, Mapping):
        return node_selector_terms_failure(as_list(required.get("nodeSelectorTerms")), node)
    return None
