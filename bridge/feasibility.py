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
   affinity's nodeSelectorTerms, matched by `bridge.matching` (as are the
   tolerations above; label requirements are `bridge.labels`', the same the
   webhook and the fake API server use).

Not honoured: preferred node affinity and PreferNoSchedule taints (preferences
only), inter-pod affinity and anti-affinity (silently ignored), resources, host
ports and volumes. Topology spread constraints never reach this: the admission
webhook and the translation refuse them (`bridge.resources.placement_problems`).
Slurm decides among the nodes left, by its own rules.

Hand-written because no maintained Python implementation of these rules was
found; Kubernetes' own is Go (k8s.io/component-helpers, kube-scheduler's plugins).

A group's pods each take one node of the same job, so a node is feasible for
the group only when it is feasible for every pod of it.
"""

import json
from collections import Counter, OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from bridge import keys
from bridge.matching import as_list, as_mapping, as_str, node_affinity_failure, tolerates

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


def node_name(node: Node) -> str:
    return as_str(as_mapping(node.get("metadata")).get("name"))


def slurm_node_name(node: Node) -> str:
    """The Slurm name of a Kubernetes node: its slurm-nodename label, else the same name."""
    labels = as_mapping(as_mapping(node.get("metadata")).get("labels"))
    return as_str(labels.get(keys.LABEL_SLURM_NODE_NAME)) or node_name(node)


def _pod_key(pod: Pod) -> str:
    meta = as_mapping(pod.get("metadata"))
    return f"{meta.get('namespace')}/{meta.get('name')}"


# -- taints and readiness ------------------------------------------------------


def _taint_text(taint: Mapping[str, Any]) -> str:
    """kubectl's `key=value:Effect` (`key:Effect` without a value)."""
    key, value, effect = as_str(taint.get("key")), as_str(taint.get("value")), as_str(taint.get("effect"))
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


def _taint_reason(taint: Mapping[str, Any]) -> str:
    return f"node(s) had untolerated taint {{{as_str(taint.get('key'))}: {as_str(taint.get('value'))}}}"


def _ready(node: Node) -> str:
    """The Ready condition's status ("True", "False", "Unknown"), or "" when absent."""
    for condition in as_list(as_mapping(node.get("status")).get("conditions")):
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return as_str(condition.get("status"))
    return ""


# -- the filters ---------------------------------------------------------------


def pod_exclusion(pod: Pod, node: Node, *, tolerated_by_bridge: Collection[str]) -> Exclusion | None:
    """The first rule that keeps this pod off this node, or None when it may run there."""
    spec = as_mapping(pod.get("spec"))
    tolerations = as_list(spec.get("tolerations"))
    name = node_name(node)

    def excluded(rule: Rule, detail: str, reason: str) -> Exclusion:
        return Exclusion(name, slurm_node_name(node), rule, detail, reason, _pod_key(pod))

    if as_mapping(node.get("spec")).get("unschedulable") is True:
        cordon = {"key": TAINT_UNSCHEDULABLE, "effect": NO_SCHEDULE}
        if not tolerates(tolerations, cordon):
            return excluded(
                Rule.UNSCHEDULABLE,
                f"cordoned (spec.unschedulable) and {TAINT_UNSCHEDULABLE}:{NO_SCHEDULE} not tolerated",
                REASON_UNSCHEDULABLE,
            )

    wanted_node = as_str(spec.get("nodeName"))
    if wanted_node and wanted_node != name:
        return excluded(Rule.NODE_NAME, f"pod's spec.nodeName is {wanted_node}", REASON_NODE_NAME)

    for taint in as_list(as_mapping(node.get("spec")).get("taints")):
        if not isinstance(taint, Mapping) or taint.get("effect") not in (NO_SCHEDULE, NO_EXECUTE):
            continue
        if as_str(taint.get("key")) in tolerated_by_bridge or tolerates(tolerations, taint):
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

    if failure := node_affinity_failure(spec, node):
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
    return FeasibilityByRules(nodes, tolerated_by_bridge=tolerated_by_bridge).of(pods)


class FeasibilityByRules:
    """`group_feasibility` over one set of nodes, each distinct set of node rules (`rules_key`)
    checked against the nodes once, for the groups asked about until the nodes change.

    The pods of a Job, a JobSet or a LeaderWorkerSet share their template's rules, and a site's
    groups share a few templates: a group of 64 such pods is checked against 1,000 nodes 1,000
    times instead of up to 64,000, and the next group of the same template not at all. The
    latest `max_rule_sets` rule sets are kept (a pod pinned to one node has rules of its own,
    and its verdict holds an exclusion for every other node); None keeps every one, for a single
    pass over many groups (`ExclusionsByRules`).
    """

    MAX_RULE_SETS = 32

    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        tolerated_by_bridge: Collection[str] = BRIDGE_TOLERATED_TAINTS,
        max_rule_sets: int | None = MAX_RULE_SETS,
    ) -> None:
        self.nodes = nodes
        self._tolerated = tolerated_by_bridge
        self._max_rule_sets = max_rule_sets
        self._names = [node_name(node) for node in nodes]
        # rule set → per node (in order), what keeps a pod with these rules off it, or None
        self._by_rules: OrderedDict[str, tuple[Exclusion | None, ...]] = OrderedDict()
        self.checked = 0  # rule sets checked against the nodes so far

    def per_node(self, pod: Pod) -> tuple[Exclusion | None, ...]:
        """What keeps a pod with this pod's rules off each node (in order), or None where it may run."""
        key = rules_key(pod)
        found = self._by_rules.get(key)
        if found is None:
            found = tuple(
                pod_exclusion(pod, node, tolerated_by_bridge=self._tolerated) for node in self.nodes
            )
            self.checked += 1
            self._by_rules[key] = found
            if self._max_rule_sets is not None and len(self._by_rules) > self._max_rule_sets:
                self._by_rules.popitem(last=False)
        else:
            self._by_rules.move_to_end(key)
        return found

    def of(self, pods: Sequence[Pod]) -> Feasibility:
        """The group's verdict, as `group_feasibility` gives it (each exclusion names its pod)."""
        verdicts = [(self.per_node(pod), _pod_key(pod)) for pod in pods]
        feasible: list[str] = []
        infeasible: list[Exclusion] = []
        for index, name in enumerate(self._names):
            for per_node, pod_key in verdicts:
                exclusion = per_node[index]
                if exclusion is not None:
                    infeasible.append(
                        exclusion if exclusion.pod == pod_key else replace(exclusion, pod=pod_key)
                    )
                    break
            else:
                feasible.append(name)
        return Feasibility(tuple(feasible), tuple(infeasible))


def rules_key(pod: Pod) -> str:
    """The part of a pod that `pod_exclusion` reads: pods with equal keys are kept off the same nodes."""
    spec = as_mapping(pod.get("spec"))
    rules = {
        "nodeName": spec.get("nodeName"),
        "nodeSelector": spec.get("nodeSelector"),
        "nodeAffinity": as_mapping(spec.get("affinity")).get("nodeAffinity"),
        "tolerations": spec.get("tolerations"),
    }
    return json.dumps(rules, sort_keys=True, separators=(",", ":"), default=str)


class ExclusionsByRules:
    """The nodes each pod or group may not run on, over one set of nodes, each distinct set of
    node rules checked against the nodes once.

    A site's pending pods mostly share a few rule sets (one per workload template), so
    re-checking 5,000 pending groups against 1,000 nodes after a node change costs a few
    rule sets times 1,000 checks, not 5,000,000.
    """

    def __init__(
        self, nodes: Sequence[Node], *, tolerated_by_bridge: Collection[str] = BRIDGE_TOLERATED_TAINTS
    ) -> None:
        # Every rule set of the pass is kept: it checks every pending group's at once.
        self._checks = FeasibilityByRules(nodes, tolerated_by_bridge=tolerated_by_bridge, max_rule_sets=None)
        # rule set → the nodes it keeps a pod off: (Kubernetes node, kube-scheduler's reason) of
        # each, and their Slurm names
        self._by_rules: dict[str, tuple[frozenset[tuple[str, str]], frozenset[str]]] = {}

    def _of(self, pod: Pod) -> tuple[frozenset[tuple[str, str]], frozenset[str]]:
        key = rules_key(pod)
        found = self._by_rules.get(key)
        if found is None:
            excluded = [e for e in self._checks.per_node(pod) if e is not None]
            found = (
                frozenset((e.node, e.scheduler_reason) for e in excluded),
                frozenset(e.slurm_node for e in excluded),
            )
            self._by_rules[key] = found
        return found

    def reasons_of_pod(self, pod: Pod) -> frozenset[tuple[str, str]]:
        """(node, why) for every node the pod may not run on: all that `group_feasibility`'s
        verdict and summary for the pod's group depend on, besides the nodes themselves."""
        return self._of(pod)[0]

    def of_pod(self, pod: Pod) -> frozenset[str]:
        """The Slurm names of the nodes the pod may not run on."""
        return self._of(pod)[1]

    def of_group(self, pods: Sequence[Pod]) -> frozenset[str]:
        """A node is the group's only if it is every pod's: the union of the pods' exclusions."""
        return frozenset().union(*(self.of_pod(pod) for pod in pods))

    @property
    def rule_sets(self) -> int:
        """Distinct rule sets checked so far (each once against every node)."""
        return len(self._by_rules)


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
    metadata = as_mapping(node.get("metadata"))
    labels = as_mapping(metadata.get("labels"))
    if any(label in labels for label in BRIDGE_NODE_LABELS):
        return True
    taints = as_mapping(node.get("spec")).get("taints") or []
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
