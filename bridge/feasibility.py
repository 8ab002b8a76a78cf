"""Which of the bridge's nodes may a pod group run on, by Kubernetes' own rules.

Pure: the caller reads the pods and the bridge's nodes (full Node objects as the
API serves them, not `node_facts.kube_node_view`, which drops the labels and
taints this needs); this decides. The result becomes the Slurm job's
`excluded_nodes` (never `required_nodes`: Slurm still picks among the rest) and,
when no node fits, the message of a pod Event and of the PodScheduled=False
condition, worded like kube-scheduler's.

The filters mirror kube-scheduler's, in its order, and the first one that fails
is the reason given for a node:

1. NodeUnschedulable: `spec.unschedulable` (a cordoned node) excludes the node
   unless the pod tolerates `node.kubernetes.io/unschedulable:NoSchedule`.
2. NodeName: `spec.nodeName`, when set, allows only that node.
3. TaintToleration: every NoSchedule or NoExecute taint must be tolerated
   (PreferNoSchedule only scores, so it is ignored). Taints whose key is in
   `tolerated_by_bridge` count as tolerated: the bridge adds the toleration of
   its own managed-node taint to the pod before binding it.
   Readiness: kube-scheduler itself never reads node conditions; it relies on
   the node lifecycle controller's `node.kubernetes.io/not-ready:NoSchedule`
   taint. That taint can lag behind (or be missing on nodes whose controller
   does not run), so a node whose `Ready` condition is not `True` (False,
   Unknown or absent) is treated as carrying it: excluded unless the pod
   tolerates `node.kubernetes.io/not-ready:NoSchedule`. NoSchedule on purpose:
   the `not-ready:NoExecute` toleration every pod gets from the
   DefaultTolerationSeconds admission plugin must not let pods onto such nodes.
4. NodeAffinity: `spec.nodeSelector` (every label equal) and the required node
   affinity (`requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`:
   terms ORed, requirements within a term ANDed; an empty term list, or a term
   with neither matchExpressions nor matchFields, matches no node; a term with
   an invalid requirement matches no node; NotIn and DoesNotExist match a node
   without the label; Gt and Lt compare the label and the value as 64-bit
   integers and fail when either is not one; matchFields supports In and NotIn
   with exactly one value, on `metadata.name`).

Not honoured: preferred node affinity and PreferNoSchedule taints (preferences
only), inter-pod affinity and anti-affinity (silently ignored), resources, host
ports and volumes. Topology spread constraints never reach this: the admission
webhook and the translation refuse them (`bridge.resources.placement_problems`).
Slurm decides among the nodes left, by its own rules.
Label keys and values are not re-validated: the API server did that when the
pod was created.

Hand-written because no maintained Python implementation of these rules was
found; Kubernetes' own is Go (k8s.io/component-helpers, kube-scheduler's plugins).

A group's pods each take one node of the same job, so a node is feasible for
the group only when it is feasible for every pod of it.
"""

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bridge import keys

Pod = Mapping[str, Any]
Node = Mapping[str, Any]

TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
# The taints the bridge itself makes its pods tolerate before binding them.
BRIDGE_TOLERATED_TAINTS: frozenset[str] = frozenset({keys.TAINT_MANAGED_NODE})

# kube-scheduler's own reason strings, for the summary.
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
NO_NODES_AVAILABLE = "no nodes available to schedule pods"

_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Rule(StrEnum):
    """The filter that excluded a node."""

    UNSCHEDULABLE = "unschedulable"
    NODE_NAME = "nodeName"
    TAINT = "taint"
    NOT_READY = "notReady"
    NODE_AFFINITY = "nodeAffinity"  # nodeSelector or required node affinity


@dataclass(frozen=True)
class Exclusion:
    """One node the group cannot use, and the first rule that said so."""

    node: str  # Kubernetes node name
    slurm_node: str  # the name Slurm knows it by
    rule: Rule
    detail: str  # e.g. "taint gpu=true:NoSchedule not tolerated"
    scheduler_reason: str  # kube-scheduler's wording, e.g. "node(s) had untolerated taint {gpu: true}"
    pod: str  # "namespace/name" of the pod that excluded it

    def __str__(self) -> str:
        return f"{self.node}: {self.detail}"


@dataclass(frozen=True)
class Feasibility:
    """The verdict on every candidate node, in the order they were given."""

    feasible: tuple[str, ...]
    infeasible: tuple[Exclusion, ...]

    @property
    def total(self) -> int:
        return len(self.feasible) + len(self.infeasible)

    @property
    def reasons(self) -> list[str]:
        """One line per excluded node: `node-c: taint gpu=true:NoSchedule not tolerated`."""
        return [str(e) for e in self.infeasible]

    @property
    def summary(self) -> str | None:
        """kube-scheduler's one-liner when no node fits, else None.

        "0/4 nodes are available: 1 node(s) had untolerated taint {gpu: true},
        1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector."
        Counts per reason, sorted as strings, as kube-scheduler does.
        """
        if self.feasible:
            return None
        if not self.infeasible:
            return f"0/0 nodes are available: {NO_NODES_AVAILABLE}."
        histogram = Counter(e.scheduler_reason for e in self.infeasible)
        parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
        return f"0/{self.total} nodes are available: {', '.join(parts)}."


# -- small JSON helpers --------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int64(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64): optional sign, ASCII digits, in range."""
    if not _INT64.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def node_name(node: Node) -> str:
    return _str(_mapping(node.get("metadata")).get("name"))


def slurm_node_name(node: Node) -> str:
    """The Slurm name of a Kubernetes node: its slurm-nodename label, else the same name."""
    labels = _mapping(_mapping(node.get("metadata")).get("labels"))
    return _str(labels.get(keys.LABEL_SLURM_NODE_NAME)) or node_name(node)


def _pod_key(pod: Pod) -> str:
    meta = _mapping(pod.get("metadata"))
    return f"{meta.get('namespace')}/{meta.get('name')}"


# -- tolerations ---------------------------------------------------------------


def toleration_tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' Toleration.ToleratesTaint.

    Empty effect matches every effect; empty key matches every key; operator
    Exists matches every value, Equal (the default) needs the same value; Lt
    and Gt (alpha, TaintTolerationComparisonOperators) compare integers.
    """
    effect, key = _str(toleration.get("effect")), _str(toleration.get("key"))
    if effect and effect != _str(taint.get("effect")):
        return False
    if key and key != _str(taint.get("key")):
        return False
    operator = _str(toleration.get("operator"))
    wanted, actual = _str(toleration.get("value")), _str(taint.get("value"))
    if operator in ("", "Equal"):
        return wanted == actual
    if operator == "Exists":
        return True
    if operator in ("Lt", "Gt"):
        limit, value = _int64(wanted), _int64(actual)
        if limit is None or value is None:
            return False
        return value < limit if operator == "Lt" else value > limit
    return False


def tolerates(tolerations: Iterable[Any], taint: Mapping[str, Any]) -> bool:
    """Does any of the tolerations tolerate the taint (TolerationsTolerateTaint)?"""
    return any(isinstance(t, Mapping) and toleration_tolerates(t, taint) for t in tolerations)


def _taint_text(taint: Mapping[str, Any]) -> str:
    """kubectl's `key=value:Effect` (`key:Effect` without a value)."""
    key, value, effect = _str(taint.get("key")), _str(taint.get("value")), _str(taint.get("effect"))
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


def _taint_reason(taint: Mapping[str, Any]) -> str:
    return f"node(s) had untolerated taint {{{_str(taint.get('key'))}: {_str(taint.get('value'))}}}"


def _ready(node: Node) -> str:
    """The Ready condition's status ("True", "False", "Unknown"), or "" when absent."""
    for condition in _list(_mapping(node.get("status")).get("conditions")):
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return _str(condition.get("status"))
    return ""


# -- node selector terms -------------------------------------------------------


def _requirement_text(requirement: Mapping[str, Any]) -> str:
    key, operator = _str(requirement.get("key")), _str(requirement.get("operator"))
    values = [str(v) for v in _list(requirement.get("values"))]
    if operator in ("Exists", "DoesNotExist") and not values:
        return f"{key} {operator}"
    if operator in ("Gt", "Lt") and len(values) == 1:
        return f"{key} {operator} {values[0]}"
    return f"{key} {operator} [{', '.join(values)}]"


def _label_requirement_problem(requirement: Mapping[str, Any]) -> str | None:
    """Why Kubernetes would refuse to parse this matchExpressions entry, or None."""
    operator = _str(requirement.get("operator"))
    values = _list(requirement.get("values"))
    if operator in ("In", "NotIn"):
        return None if values else "In and NotIn need at least one value"
    if operator in ("Exists", "DoesNotExist"):
        return None if not values else "Exists and DoesNotExist take no values"
    if operator in ("Gt", "Lt"):
        if len(values) != 1 or not isinstance(values[0], str) or _int64(values[0]) is None:
            return "Gt and Lt need exactly one integer value"
        return None
    return f'unsupported operator "{operator}"'


def _label_requirement_matches(requirement: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """labels.Requirement.Matches, for a requirement that parsed."""
    key, operator = _str(requirement.get("key")), _str(requirement.get("operator"))
    values = _list(requirement.get("values"))
    present = key in labels
    value = labels.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    # Gt / Lt: the node's label must exist and be an integer too.
    actual = _int64(value) if isinstance(value, str) else None
    if actual is None:
        return False
    limit = _int64(values[0])
    assert limit is not None  # checked by _label_requirement_problem
    return actual > limit if operator == "Gt" else actual < limit


def _field_requirement_problem(requirement: Mapping[str, Any]) -> str | None:
    operator = _str(requirement.get("operator"))
    if operator not in ("In", "NotIn"):
        return f'unsupported operator "{operator}" for matchFields (only In and NotIn)'
    if len(_list(requirement.get("values"))) != 1:
        return "matchFields In and NotIn need exactly one value"
    return None


def _field_requirement_matches(requirement: Mapping[str, Any], node: Node) -> bool:
    # Only metadata.name is a node field; any other key reads as "" (fields.Set.Get).
    fields = {"metadata.name": node_name(node)}
    actual = fields.get(_str(requirement.get("key")), "")
    wanted = _list(requirement.get("values"))[0]
    equal = actual == wanted
    return equal if _str(requirement.get("operator")) == "In" else not equal


def _term_failure(term: Mapping[str, Any], node: Node) -> str | None:
    """Why a non-empty nodeSelectorTerm does not match the node; None when it does."""
    expressions = [r for r in _list(term.get("matchExpressions")) if isinstance(r, Mapping)]
    fields = [r for r in _list(term.get("matchFields")) if isinstance(r, Mapping)]
    # A parse error anywhere in the term makes the whole term match nothing.
    for requirement in expressions:
        if problem := _label_requirement_problem(requirement):
            return f"{_requirement_text(requirement)} is invalid ({problem})"
    for requirement in fields:
        if problem := _field_requirement_problem(requirement):
            return f"matchFields {_requirement_text(requirement)} is invalid ({problem})"
    labels = _mapping(_mapping(node.get("metadata")).get("labels"))
    for requirement in expressions:
        if not _label_requirement_matches(requirement, labels):
            key = _str(requirement.get("key"))
            has = f"{key}={labels[key]}" if key in labels else f"no label {key}"
            return f"{_requirement_text(requirement)} is false (node has {has})"
    for requirement in fields:
        if not _field_requirement_matches(requirement, node):
            return f"matchFields {_requirement_text(requirement)} is false"
    return None


def _is_empty_term(term: Any) -> bool:
    term = _mapping(term)
    return not _list(term.get("matchExpressions")) and not _list(term.get("matchFields"))


def node_selector_terms_failure(terms: Sequence[Any], node: Node) -> str | None:
    """Why required node affinity terms (ORed) exclude the node; None when one matches."""
    candidates = [_mapping(t) for t in terms if not _is_empty_term(t)]
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


def _affinity_failure(spec: Mapping[str, Any], node: Node) -> str | None:
    labels = _mapping(_mapping(node.get("metadata")).get("labels"))
    for key, wanted in _mapping(spec.get("nodeSelector")).items():
        if key not in labels:
            return f"nodeSelector {key}={wanted} does not match (node has no label {key})"
        if labels[key] != wanted:
            return f"nodeSelector {key}={wanted} does not match (node has {key}={labels[key]})"
    affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, Mapping):
        return node_selector_terms_failure(_list(required.get("nodeSelectorTerms")), node)
    return None


# -- the filters ---------------------------------------------------------------


def pod_exclusion(pod: Pod, node: Node, *, tolerated_by_bridge: Collection[str]) -> Exclusion | None:
    """The first rule that keeps this pod off this node, or None when it may run there."""
    spec = _mapping(pod.get("spec"))
    tolerations = _list(spec.get("tolerations"))
    name = node_name(node)

    def excluded(rule: Rule, detail: str, reason: str) -> Exclusion:
        return Exclusion(name, slurm_node_name(node), rule, detail, reason, _pod_key(pod))

    if _mapping(node.get("spec")).get("unschedulable") is True:
        cordon = {"key": TAINT_UNSCHEDULABLE, "effect": NO_SCHEDULE}
        if not tolerates(tolerations, cordon):
            return excluded(
                Rule.UNSCHEDULABLE,
                f"cordoned (spec.unschedulable) and {TAINT_UNSCHEDULABLE}:{NO_SCHEDULE} not tolerated",
                REASON_UNSCHEDULABLE,
            )

    wanted_node = _str(spec.get("nodeName"))
    if wanted_node and wanted_node != name:
        return excluded(Rule.NODE_NAME, f"pod's spec.nodeName is {wanted_node}", REASON_NODE_NAME)

    for taint in _list(_mapping(node.get("spec")).get("taints")):
        if not isinstance(taint, Mapping) or taint.get("effect") not in (NO_SCHEDULE, NO_EXECUTE):
            continue
        if _str(taint.get("key")) in tolerated_by_bridge or tolerates(tolerations, taint):
            continue
        return excluded(Rule.TAINT, f"taint {_taint_text(taint)} not tolerated", _taint_reason(taint))

    ready = _ready(node)
    if ready != "True":
        not_ready = {"key": TAINT_NOT_READY, "effect": NO_SCHEDULE}
        if TAINT_NOT_READY not in tolerated_by_bridge and not tolerates(tolerations, not_ready):
            return excluded(
                Rule.NOT_READY,
                f"not Ready (Ready={ready or 'absent'}) and {TAINT_NOT_READY}:{NO_SCHEDULE} not tolerated",
                _taint_reason(not_ready),
            )

    if failure := _affinity_failure(spec, node):
        return excluded(Rule.NODE_AFFINITY, failure, REASON_NODE_AFFINITY)
    return None


def group_feasibility(
    pods: Sequence[Pod],
    nodes: Sequence[Node],
    *,
    tolerated_by_bridge: Collection[str] = BRIDGE_TOLERATED_TAINTS,
) -> Feasibility:
    """Split `nodes` into those every pod of the group may run on and the rest.

    An excluded node carries the first rule, of the first pod, that excluded
    it. With no pods, every node is feasible.
    """
    feasible: list[str] = []
    infeasible: list[Exclusion] = []
    for node in nodes:
        exclusion = next(
            (
                found
                for pod in pods
                if (found := pod_exclusion(pod, node, tolerated_by_bridge=tolerated_by_bridge))
            ),
            None,
        )
        if exclusion is None:
            feasible.append(node_name(node))
        else:
            infeasible.append(exclusion)
    return Feasibility(tuple(feasible), tuple(infeasible))


# The labels that make a Kubernetes node one of the bridge's (registered by node sync, or running slurmd).
BRIDGE_NODE_LABELS: tuple[str, ...] = (*keys.LABELS_EXTERNAL_NODE, keys.LABEL_SLURM_NODE_NAME)


def is_bridge_node(node: Node, scheduler_name: str) -> bool:
    """Whether the bridge places on this node: the nodes `group_feasibility` is given.

    One definition for the node rules, the node cache, `explain` and binding, taken from
    node sync (bridge/node_sync.py), which alone sees both sides: a node labelled for
    registration as an external Slurm node, a node slurm-operator maps by the slurm-nodename
    label, or a node whose name Slurm knows (slurm-operator's default layout: same names,
    no label). Node sync marks the last kind with the managed-node taint naming this
    scheduler; that mark is what tells it here, with no Slurm request per placement.
    """
    metadata = _mapping(node.get("metadata"))
    labels = _mapping(metadata.get("labels"))
    if any(label in labels for label in BRIDGE_NODE_LABELS):
        return True
    taints = _mapping(node.get("spec")).get("taints") or []
    return any(
        isinstance(taint, Mapping)
        and taint.get("key") == keys.TAINT_MANAGED_NODE
        and taint.get("value") == scheduler_name
        and taint.get("effect") == "NoExecute"
        for taint in taints
    )


def excluded_slurm_nodes(result: Feasibility) -> list[str] | None:
    """The Slurm job's `excluded_nodes`: Slurm names of the infeasible nodes, sorted; None if none."""
    return sorted({e.slurm_node for e in result.infeasible}) or None
