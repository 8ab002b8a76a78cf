"""bridge.feasibility: Kubernetes' filter rules over the bridge's nodes, table by table."""

from typing import Any

import pytest

from bridge import keys
from bridge.feasibility import (
    BRIDGE_TOLERATED_TAINTS,
    ExclusionsByRules,
    Feasibility,
    FeasibilityByRules,
    Rule,
    excluded_slurm_nodes,
    group_feasibility,
    is_bridge_node,
    pod_exclusion,
)
from bridge.matching import toleration_tolerates


def node(
    name: str,
    labels: dict[str, str] | None = None,
    *,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    ready: str | None = "True",
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"conditions": [] if ready is None else [{"type": "Ready", "status": ready}]},
    }


def pod(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"containers": [{"name": "c"}], **spec}}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement


def term(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields is not None:
        result["matchFields"] = fields
    return result


def check(pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> Feasibility:
    return group_feasibility(pods, nodes, tolerated_by_bridge=BRIDGE_TOLERATED_TAINTS)


# -- node affinity operators: (labels of the node, requirement, matches?) ------

AFFINITY_CASES = [
    pytest.param({"gpu": "a100"}, expr("gpu", "In", "a100", "h100"), True, id="in-match"),
    pytest.param({"gpu": "v100"}, expr("gpu", "In", "a100", "h100"), False, id="in-other-value"),
    pytest.param({}, expr("gpu", "In", "a100"), False, id="in-missing-label"),
    pytest.param({"gpu": "v100"}, expr("gpu", "NotIn", "a100"), True, id="notin-other-value"),
    pytest.param({"gpu": "a100"}, expr("gpu", "NotIn", "a100"), False, id="notin-listed-value"),
    pytest.param({}, expr("gpu", "NotIn", "a100"), True, id="notin-missing-label-matches"),
    pytest.param({"gpu": ""}, expr("gpu", "Exists"), True, id="exists-empty-value"),
    pytest.param({}, expr("gpu", "Exists"), False, id="exists-missing"),
    pytest.param({}, expr("gpu", "DoesNotExist"), True, id="doesnotexist-missing-matches"),
    pytest.param({"gpu": "x"}, expr("gpu", "DoesNotExist"), False, id="doesnotexist-present"),
    pytest.param({"cores": "16"}, expr("cores", "Gt", "8"), True, id="gt-larger"),
    pytest.param({"cores": "8"}, expr("cores", "Gt", "8"), False, id="gt-equal"),
    pytest.param({"cores": "-3"}, expr("cores", "Lt", "0"), True, id="lt-negative"),
    pytest.param({"cores": "+7"}, expr("cores", "Lt", "8"), True, id="lt-plus-sign"),
    pytest.param({"cores": "many"}, expr("cores", "Gt", "8"), False, id="gt-label-not-integer"),
    pytest.param({"cores": " 16"}, expr("cores", "Gt", "8"), False, id="gt-label-with-space"),
    pytest.param({"cores": "1_000"}, expr("cores", "Gt", "8"), False, id="gt-label-with-underscore"),
    pytest.param({"cores": "99999999999999999999"}, expr("cores", "Gt", "8"), False, id="gt-label-overflow"),
    pytest.param({"cores": "16"}, expr("cores", "Gt", "eight"), False, id="gt-value-not-integer"),
    pytest.param({"cores": "16"}, expr("cores", "Gt", "1", "2"), False, id="gt-two-values-invalid"),
    pytest.param({}, expr("cores", "Lt", "8"), False, id="lt-missing-label"),
    pytest.param({"gpu": "a"}, expr("gpu", "In"), False, id="in-without-values-invalid"),
    pytest.param({}, expr("gpu", "DoesNotExist", "x"), False, id="doesnotexist-with-values-invalid"),
    pytest.param({"gpu": "a"}, expr("gpu", "Equals", "a"), False, id="unknown-operator-invalid"),
]


@pytest.mark.parametrize(("labels", "requirement", "matches"), AFFINITY_CASES)
def test_match_expressions_operators(
    labels: dict[str, str], requirement: dict[str, Any], matches: bool
) -> None:
    result = check([pod(affinity=affinity(term(requirement)))], [node("n", labels)])
    assert result.feasible == (("n",) if matches else ())
    if not matches:
        [exclusion] = result.infeasible
        assert exclusion.rule is Rule.NODE_AFFINITY
        assert exclusion.detail.startswith("required node affinity does not match")


FIELD_CASES = [
    pytest.param([expr("metadata.name", "In", "n")], True, id="name-in"),
    pytest.param([expr("metadata.name", "In", "other")], False, id="name-in-other"),
    pytest.param([expr("metadata.name", "NotIn", "other")], True, id="name-notin"),
    pytest.param([expr("metadata.name", "NotIn", "n")], False, id="name-notin-self"),
    pytest.param([expr("metadata.name", "In", "n", "m")], False, id="two-values-invalid"),
    pytest.param([expr("metadata.name", "Exists")], False, id="exists-unsupported"),
    pytest.param([expr("metadata.uid", "NotIn", "x")], True, id="unknown-field-reads-empty"),
]


@pytest.mark.parametrize(("fields", "matches"), FIELD_CASES)
def test_match_fields(fields: list[dict[str, Any]], matches: bool) -> None:
    result = check([pod(affinity=affinity(term(fields=fields)))], [node("n")])
    assert result.feasible == (("n",) if matches else ())


def test_expressions_and_fields_of_one_term_are_anded() -> None:
    both = term(expr("zone", "In", "a"), fields=[expr("metadata.name", "In", "n1")])
    result = check([pod(affinity=affinity(both))], [node("n1", {"zone": "a"}), node("n2", {"zone": "a"})])
    assert result.feasible == ("n1",)
    assert "matchFields metadata.name In [n1] is false" in result.infeasible[0].detail


def test_terms_are_ored_and_expressions_anded() -> None:
    terms = affinity(
        term(expr("zone", "In", "a"), expr("gpu", "Exists")),
        term(expr("zone", "In", "b")),
    )
    nodes = [
        node("a-gpu", {"zone": "a", "gpu": "1"}),
        node("a-cpu", {"zone": "a"}),
        node("b-cpu", {"zone": "b"}),
    ]
    result = check([pod(affinity=terms)], nodes)
    assert result.feasible == ("a-gpu", "b-cpu")
    [exclusion] = result.infeasible
    assert exclusion.detail == (
        "none of the 2 required node affinity terms match: "
        "term 1: gpu Exists is false (node has no label gpu); "
        "term 2: zone In [b] is false (node has zone=a)"
    )


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param([], id="no-terms"),
        pytest.param([{}], id="one-empty-term"),
        pytest.param([{"matchExpressions": [], "matchFields": []}], id="term-with-empty-lists"),
    ],
)
def test_empty_terms_match_nothing(terms: list[dict[str, Any]]) -> None:
    result = check([pod(affinity=affinity(*terms))], [node("n", {"a": "b"})])
    assert result.feasible == ()
    assert "matches no node" in result.infeasible[0].detail


def test_empty_term_is_skipped_beside_a_matching_one() -> None:
    result = check([pod(affinity=affinity({}, term(expr("a", "Exists"))))], [node("n", {"a": "b"})])
    assert result.feasible == ("n",)


def test_an_invalid_requirement_spoils_only_its_own_term() -> None:
    terms = affinity(term(expr("a", "Exists"), expr("n", "Gt", "x")), term(expr("a", "In", "b")))
    assert check([pod(affinity=terms)], [node("n", {"a": "b"})]).feasible == ("n",)


def test_affinity_without_required_part_or_preferred_only_is_ignored() -> None:
    preferred = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": term(expr("zone", "In", "x"))}
            ]
        }
    }
    assert check([pod(affinity=preferred)], [node("n")]).feasible == ("n",)


# -- nodeSelector and nodeName --------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "detail"),
    [
        pytest.param({"disk": "ssd"}, {"disk": "ssd", "x": "y"}, None, id="match"),
        pytest.param(
            {"disk": "ssd"},
            {"disk": "hdd"},
            "nodeSelector disk=ssd does not match (node has disk=hdd)",
            id="value",
        ),
        pytest.param(
            {"disk": "ssd"}, {}, "nodeSelector disk=ssd does not match (node has no label disk)", id="absent"
        ),
        pytest.param(
            {"disk": "ssd", "zone": "a"}, {"disk": "ssd"}, "nodeSelector zone=a", id="all-must-match"
        ),
        pytest.param({"disk": ""}, {}, "nodeSelector disk= does not match", id="empty-value-needs-label"),
    ],
)
def test_node_selector(selector: dict[str, str], labels: dict[str, str], detail: str | None) -> None:
    result = check([pod(nodeSelector=selector)], [node("n", labels)])
    if detail is None:
        assert result.feasible == ("n",)
    else:
        [exclusion] = result.infeasible
        assert exclusion.rule is Rule.NODE_AFFINITY
        assert exclusion.detail.startswith(detail)


def test_node_selector_and_affinity_must_both_match() -> None:
    spec: dict[str, Any] = {
        "nodeSelector": {"disk": "ssd"},
        "affinity": affinity(term(expr("zone", "In", "a"))),
    }
    nodes = [
        node("both", {"disk": "ssd", "zone": "a"}),
        node("sel", {"disk": "ssd"}),
        node("aff", {"zone": "a"}),
    ]
    result = check([pod(**spec)], nodes)
    assert result.feasible == ("both",)
    assert [str(e) for e in result.infeasible] == [
        "sel: required node affinity does not match: zone In [a] is false (node has no label zone)",
        "aff: nodeSelector disk=ssd does not match (node has no label disk)",
    ]


def test_node_name_and_selector_together() -> None:
    spec: dict[str, Any] = {"nodeName": "node-a", "nodeSelector": {"kubernetes.io/hostname": "node-b"}}
    nodes = [
        node("node-a", {"kubernetes.io/hostname": "node-a"}),
        node("node-b", {"kubernetes.io/hostname": "node-b"}),
    ]
    result = check([pod(**spec)], nodes)
    assert result.feasible == ()
    assert result.reasons == [
        "node-a: nodeSelector kubernetes.io/hostname=node-b does not match"
        " (node has kubernetes.io/hostname=node-a)",
        "node-b: pod's spec.nodeName is node-a",
    ]
    assert result.summary == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) didn't match the requested node name."
    )


# -- tolerations ----------------------------------------------------------------

GPU_TAINT = {"key": "gpu", "value": "true", "effect": "NoSchedule"}

TOLERATION_CASES = [
    pytest.param(
        {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True, id="equal"
    ),
    pytest.param(
        {"key": "gpu", "value": "true", "effect": "NoSchedule"}, True, id="operator-defaults-to-equal"
    ),
    pytest.param({"key": "gpu", "value": "false", "effect": "NoSchedule"}, False, id="equal-other-value"),
    pytest.param({"key": "gpu", "value": "true"}, True, id="empty-effect-matches-all"),
    pytest.param({"key": "gpu", "value": "true", "effect": "NoExecute"}, False, id="other-effect"),
    pytest.param({"key": "gpu", "operator": "Exists"}, True, id="exists-any-value"),
    pytest.param({"operator": "Exists"}, True, id="exists-without-key-matches-all"),
    pytest.param({"operator": "Exists", "effect": "NoExecute"}, False, id="exists-without-key-other-effect"),
    pytest.param({"key": "other", "operator": "Exists"}, False, id="other-key"),
    pytest.param({"key": "gpu", "operator": "Gt", "value": "1"}, False, id="gt-non-integer-taint"),
    pytest.param({"key": "gpu", "operator": "Bogus", "value": "true"}, False, id="unknown-operator"),
]


@pytest.mark.parametrize(("toleration", "tolerated"), TOLERATION_CASES)
def test_toleration_matching(toleration: dict[str, str], tolerated: bool) -> None:
    assert toleration_tolerates(toleration, GPU_TAINT) is tolerated
    result = check([pod(tolerations=[toleration])], [node("n", taints=[GPU_TAINT])])
    assert result.feasible == (("n",) if tolerated else ())


@pytest.mark.parametrize(
    ("operator", "value", "tolerated"),
    [("Lt", "10", True), ("Lt", "5", False), ("Gt", "4", True), ("Gt", "5", False)],
)
def test_numeric_toleration_operators(operator: str, value: str, tolerated: bool) -> None:
    taint = {"key": "level", "value": "5", "effect": "NoSchedule"}
    assert toleration_tolerates({"key": "level", "operator": operator, "value": value}, taint) is tolerated


@pytest.mark.parametrize(
    ("effect", "feasible"),
    [("NoSchedule", False), ("NoExecute", False), ("PreferNoSchedule", True)],
)
def test_taint_effects(effect: str, feasible: bool) -> None:
    taint = {"key": "gpu", "value": "true", "effect": effect}
    result = check([pod()], [node("node-c", taints=[taint])])
    assert bool(result.feasible) is feasible
    if not feasible:
        assert result.reasons == [f"node-c: taint gpu=true:{effect} not tolerated"]
        assert result.infeasible[0].scheduler_reason == "node(s) had untolerated taint {gpu: true}"


def test_taint_without_value_is_shown_like_kubectl() -> None:
    result = check([pod()], [node("n", taints=[{"key": "dedicated", "effect": "NoSchedule"}])])
    assert result.reasons == ["n: taint dedicated:NoSchedule not tolerated"]
    assert result.summary == "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: }."


def test_the_bridges_own_taint_counts_as_tolerated_only_when_said_so() -> None:
    managed = {"key": keys.TAINT_MANAGED_NODE, "value": "slurm-bridge-scheduler", "effect": "NoExecute"}
    nodes = [node("n", taints=[managed])]
    assert check([pod()], nodes).feasible == ("n",)
    assert group_feasibility([pod()], nodes).feasible == ("n",)  # the default is the same set
    strict = group_feasibility([pod()], nodes, tolerated_by_bridge=())
    assert strict.infeasible[0].rule is Rule.TAINT


# -- cordon and readiness ---------------------------------------------------------


@pytest.mark.parametrize(
    ("tolerations", "feasible"),
    [
        pytest.param([], False, id="no-toleration"),
        pytest.param([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}], True, id="exists"),
        pytest.param(
            [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
            True,
            id="exists-noschedule",
        ),
        pytest.param(
            [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}],
            False,
            id="wrong-effect",
        ),
        pytest.param([{"operator": "Exists"}], True, id="tolerate-everything"),
    ],
)
def test_cordoned_node(tolerations: list[dict[str, str]], feasible: bool) -> None:
    result = check([pod(tolerations=tolerations)], [node("n", unschedulable=True)])
    assert bool(result.feasible) is feasible
    if not feasible:
        assert result.infeasible[0].rule is Rule.UNSCHEDULABLE
        assert result.summary == "0/1 nodes are available: 1 node(s) were unschedulable."


@pytest.mark.parametrize(
    ("ready", "tolerations", "feasible"),
    [
        pytest.param("True", [], True, id="ready"),
        pytest.param("False", [], False, id="not-ready"),
        pytest.param("Unknown", [], False, id="unknown"),
        pytest.param(None, [], False, id="no-ready-condition"),
        pytest.param(
            "False",
            [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}],
            True,
            id="tolerated",
        ),
        pytest.param(
            "False",
            # what DefaultTolerationSeconds adds to every pod: must not let it onto a NotReady node
            [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            False,
            id="default-noexecute-toleration-is-not-enough",
        ),
    ],
)
def test_not_ready_node(ready: str | None, tolerations: list[dict[str, Any]], feasible: bool) -> None:
    result = check([pod(tolerations=tolerations)], [node("n", ready=ready)])
    assert bool(result.feasible) is feasible
    if not feasible:
        assert result.infeasible[0].rule is Rule.NOT_READY
        assert result.infeasible[0].detail.startswith("not Ready (Ready=")
        assert result.summary == (
            "0/1 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }."
        )


def test_first_rule_in_kube_scheduler_order_is_reported() -> None:
    everything_wrong = node("n", {"zone": "b"}, taints=[GPU_TAINT], unschedulable=True, ready="False")
    spec: dict[str, Any] = {"nodeSelector": {"zone": "a"}}
    assert check([pod(**spec)], [everything_wrong]).infeasible[0].rule is Rule.UNSCHEDULABLE
    spec["tolerations"] = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    assert check([pod(**spec)], [everything_wrong]).infeasible[0].rule is Rule.TAINT
    spec["tolerations"].append({"key": "gpu", "operator": "Exists"})
    assert check([pod(**spec)], [everything_wrong]).infeasible[0].rule is Rule.NOT_READY
    spec["tolerations"].append({"key": "node.kubernetes.io/not-ready", "operator": "Exists"})
    assert check([pod(**spec)], [everything_wrong]).infeasible[0].rule is Rule.NODE_AFFINITY


# -- groups, summary and the Slurm side -------------------------------------------------


def test_a_node_must_suit_every_pod_of_the_group() -> None:
    pods = [
        pod("a", nodeSelector={"zone": "a"}),
        pod("b", tolerations=[{"key": "gpu", "operator": "Exists"}]),
    ]
    nodes = [
        node("za", {"zone": "a"}),
        node("za-gpu", {"zone": "a"}, taints=[GPU_TAINT]),
        node("zb", {"zone": "b"}),
    ]
    result = check(pods, nodes)
    assert result.feasible == ("za",)
    assert [(e.node, e.pod, e.rule) for e in result.infeasible] == [
        ("za-gpu", "ns/a", Rule.TAINT),
        ("zb", "ns/a", Rule.NODE_AFFINITY),
    ]
    assert result.summary is None


def test_summary_mirrors_kube_scheduler() -> None:
    nodes = [
        node("a", {"zone": "x"}),
        node("b", {"zone": "y"}),
        node("c", {"zone": "z"}, taints=[GPU_TAINT]),
        node("d", {"zone": "z"}, unschedulable=True),
    ]
    result = check([pod(nodeSelector={"zone": "z"})], nodes)
    assert result.summary == (
        "0/4 nodes are available: 1 node(s) had untolerated taint {gpu: true}, "
        "1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector."
    )


def test_no_nodes_and_no_pods() -> None:
    assert check([pod()], []).summary == "0/0 nodes are available: no nodes available to schedule pods."
    assert check([], [node("n", unschedulable=True)]).feasible == ("n",)


def test_excluded_slurm_nodes_use_the_slurm_name_label() -> None:
    nodes = [
        node("k8s-1", {keys.LABEL_SLURM_NODE_NAME: "hpc-1"}, unschedulable=True),
        node("k8s-2", taints=[GPU_TAINT]),
        node("k8s-3"),
    ]
    result = check([pod()], nodes)
    assert [e.slurm_node for e in result.infeasible] == ["hpc-1", "k8s-2"]
    assert excluded_slurm_nodes(result) == ["hpc-1", "k8s-2"]
    assert excluded_slurm_nodes(check([pod()], [node("k8s-3")])) is None


def test_exclusions_by_rules_match_the_groups_feasibility_and_check_each_rule_set_once() -> None:
    nodes = [
        node("za", {"zone": "a"}),
        node("za-gpu", {"zone": "a"}, taints=[GPU_TAINT]),
        node("zb", {"zone": "b", keys.LABEL_SLURM_NODE_NAME: "hpc-zb"}),
        node("zc", {"zone": "c"}, unschedulable=True),
        node("zd", {"zone": "d"}, ready="False"),
    ]
    gpu = [{"key": "gpu", "operator": "Exists"}]
    groups = [
        [pod("a", nodeSelector={"zone": "a"})],
        [pod("b", tolerations=gpu), pod("c", tolerations=gpu)],  # one rule set, two pods
        [pod("d", nodeSelector={"zone": "a"}), pod("e", tolerations=gpu)],
        [pod("f", nodeName="zb")],
        [pod("g", affinity=affinity(term(expr("zone", "In", "b", "c"))))],
        [pod("h")],
        [],
    ]
    rules = ExclusionsByRules(nodes)
    for group in groups:
        expected = excluded_slurm_nodes(check(group, nodes))
        assert sorted(rules.of_group(group)) == (expected or [])
    # a and d, b and c and e, f, g, h: five distinct rule sets among eight pods.
    assert rules.rule_sets == 5


def test_malformed_objects_do_not_raise() -> None:
    weird_pod: dict[str, Any] = {
        "metadata": None,
        "spec": {"tolerations": "no", "nodeSelector": None, "affinity": []},
    }
    weird_node: dict[str, Any] = {
        "metadata": {"name": "n", "labels": None},
        "spec": None,
        "status": {"conditions": "bad"},
    }
    result = check([weird_pod], [weird_node])
    assert result.infeasible[0].rule is Rule.NOT_READY


SCHEDULER = keys.DEFAULT_SCHEDULER_NAME


@pytest.mark.parametrize(
    ("labels", "taints", "ours"),
    [
        ({keys.LABEL_EXTERNAL_NODE: "true"}, [], True),
        ({keys.LABEL_EXTERNAL_NODE_ALIAS: ""}, [], True),
        ({keys.LABEL_SLURM_NODE_NAME: "sn-1"}, [], True),
        # slurm-operator's default layout: no label, a Slurm node of the same name, which node
        # sync marks with the managed-node taint naming this scheduler.
        (
            {},
            [{"key": keys.TAINT_MANAGED_NODE, "value": "slurm-bridge-scheduler", "effect": "NoExecute"}],
            True,
        ),
        ({}, [{"key": keys.TAINT_MANAGED_NODE, "value": "other-scheduler", "effect": "NoExecute"}], False),
        (
            {},
            [{"key": keys.TAINT_MANAGED_NODE, "value": "slurm-bridge-scheduler", "effect": "NoSchedule"}],
            False,
        ),
        ({}, [{"key": "gpu", "effect": "NoSchedule"}], False),
        ({}, [], False),
    ],
)
def test_the_bridges_nodes(labels: dict[str, str], taints: list[dict[str, str]], ours: bool) -> None:
    assert is_bridge_node(node("n", labels, taints=taints), SCHEDULER) is ours


# -- the same verdicts, each rule set checked once -----------------------------

SPARE_TAINT = {"key": "spare", "value": "yes", "effect": "NoSchedule"}
TOLERATES_SPARE = [{"key": "spare", "operator": "Exists"}]


def some_nodes() -> list[dict[str, Any]]:
    return [
        node("a", {"zone": "x"}),
        node("b", {"zone": "y"}),
        node("c", {"zone": "x"}, taints=[SPARE_TAINT]),
        node("d", {"zone": "x"}, unschedulable=True),
        node("e", {"zone": "y"}, ready="False"),
    ]


def first_pod_verdict(pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> Feasibility:
    """The rule as written: for each node in order, the first pod that may not run there."""
    feasible, infeasible = [], []
    for each in nodes:
        found = next((e for p in pods if (e := pod_exclusion(p, each, tolerated_by_bridge=()))), None)
        if found is None:
            feasible.append(each["metadata"]["name"])
        else:
            infeasible.append(found)
    return Feasibility(tuple(feasible), tuple(infeasible))


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param([pod(f"w-{i}") for i in range(4)], id="one-template"),
        pytest.param(
            [
                pod("zone-x", nodeSelector={"zone": "x"}),
                pod("spare", tolerations=TOLERATES_SPARE),
                pod("plain"),
            ],
            id="three-rule-sets",
        ),
        pytest.param(
            [
                pod("gpu-1", tolerations=TOLERATES_SPARE),
                pod("zone-y", nodeSelector={"zone": "y"}),
                pod("gpu-2"),
            ],
            id="first-excluder-differs-by-node",
        ),
    ],
)
def test_a_groups_verdict_is_each_nodes_first_excluding_pod(pods: list[dict[str, Any]]) -> None:
    nodes = some_nodes()
    assert FeasibilityByRules(nodes, tolerated_by_bridge=()).of(pods) == first_pod_verdict(pods, nodes)


def test_a_template_is_checked_once_and_each_group_names_its_own_pods() -> None:
    nodes = some_nodes()
    rules = FeasibilityByRules(nodes, tolerated_by_bridge=())
    first = rules.of([pod(f"job-1-{i}", nodeSelector={"zone": "x"}) for i in range(64)])
    second = rules.of([pod(f"job-2-{i}", nodeSelector={"zone": "x"}) for i in range(64)])
    assert rules.checked == 1
    assert first.feasible == second.feasible == ("a",)
    assert {e.pod for e in first.infeasible} == {"ns/job-1-0"}
    assert {e.pod for e in second.infeasible} == {"ns/job-2-0"}


def test_only_the_latest_rule_sets_are_kept() -> None:
    rules = FeasibilityByRules(some_nodes(), tolerated_by_bridge=())
    pinned = [pod(f"p-{i}", nodeName=f"n-{i}") for i in range(FeasibilityByRules.MAX_RULE_SETS + 1)]
    for each in pinned:
        rules.of([each])
    rules.of([pinned[-1]])  # kept
    assert rules.checked == len(pinned)
    rules.of([pinned[0]])  # the oldest was let go: checked again
    assert rules.checked == len(pinned) + 1
