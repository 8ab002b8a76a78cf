"""bridge.labels: the API server's label-selector semantics and error texts, without the API server."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.labels import LabelSelectorError, parse_selector, selector_from_object

LABELS = {"env": "prod", "team": "hpc", "gpu": "", "kubernetes.io/metadata.name": "ns1"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("", True),
        ("env=prod", True),
        ("env==prod", True),
        ("env=dev", False),
        ("env!=dev", True),
        ("missing!=x", True),  # != also matches objects without the key, as in Kubernetes
        ("team in (hpc, ml)", True),
        ("team notin (hpc)", False),
        ("missing notin (a)", True),
        ("missing in (a)", False),
        ("gpu", True),
        ("!gpu", False),
        ("!missing", True),
        ("gpu=", True),  # an empty value is a value
        ("env=prod,team in (hpc),!legacy", True),
        ("env=prod,team=ml", False),
        ("kubernetes.io/metadata.name in (ns1,ns2)", True),
        ("team in(hpc)", True),  # no space needed before "("
        ("env=prod,!gpu", False),
    ],
)
def test_matching(text: str, matches: bool) -> None:
    assert parse_selector(text).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # The API server's own words (k8s.io/apimachinery/pkg/labels), which tests/kube_fake/test_list.py
        # checks against a real kube-apiserver.
        ("env=prod,", "found '', expected: identifier after ','"),
        ("team in (a", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("Bad Key=x", "found 'Key', expected: in, notin, =, ==, !=, gt, lt"),
        ("=x", "found '=', expected: !, identifier, or 'end of string'"),
        ("-bad=x", '<nil>: Invalid value: "-bad": name part must consist of alphanumeric characters'),
        ("example.com/=x", "name part must be non-empty"),
        ("UPPER.example.com/x=y", "prefix part a lowercase RFC 1123 subdomain"),
        ("env=" + "v" * 64, 'values[0][env]: Invalid value: "' + "v" * 64 + '": must be no more than 63'),
        ("env=a b", "found 'b', expected: ',' or 'end of string'"),
        ("a in ((b))", "found '(', expected: ',', ')' or identifier"),
        (
            "cores>x",
            "values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        ("cores<99999999999999999999", "the value must be an integer"),  # beyond int64
    ],
)
def test_mistakes_say_where(text: str, problem: str) -> None:
    with pytest.raises(LabelSelectorError) as caught:
        parse_selector(text)
    assert problem in str(caught.value)


def test_an_empty_value_set_is_the_empty_value() -> None:
    """`k in ()` parses as the API server reads it: the set of the empty value, not a mistake.

    The same texts select the same pods from a real kube-apiserver
    (tests/kube_fake/test_list.py::test_an_empty_value_set_means_the_empty_value).
    """
    assert parse_selector("app in ()") == parse_selector("app=")
    assert parse_selector("app notin ()") == parse_selector("app!=")
    assert parse_selector("app in (web,)") == parse_selector("app in (,web)")
    empty, web, none = {"app": ""}, {"app": "web"}, {"other": "x"}
    assert [parse_selector("app in ()").matches(x) for x in (empty, web, none)] == [True, False, False]
    assert [parse_selector("app notin ()").matches(x) for x in (empty, web, none)] == [False, True, True]
    assert [parse_selector("app in (web,)").matches(x) for x in (empty, web, none)] == [True, True, False]
    assert str(parse_selector("app in (web,)")) == "app in (,web)"


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("cores>4", True),
        ("cores>8", False),
        ("cores<9", True),
        ("cores<8", False),
        ("env>1", False),  # not an integer: never matches
        ("missing<1", False),
    ],
)
def test_integer_comparisons(text: str, matches: bool) -> None:
    assert parse_selector(text).matches({"cores": "8", "env": "prod"}) is matches


def test_round_trip_to_the_api_server_form() -> None:
    selector = parse_selector("env = prod, team notin (b,a), gpu, !legacy")
    assert str(selector) == "env=prod,team notin (a,b),gpu,!legacy"
    assert parse_selector(str(selector)) == selector
    for text in ("cores>4,cores<16", "app in ()", "app notin (,web)", "a in (b,)"):
        assert parse_selector(str(parse_selector(text))) == parse_selector(text)


def test_label_selector_objects() -> None:
    selector = selector_from_object(
        {
            "matchLabels": {"env": "prod"},
            "matchExpressions": [
                {"key": "team", "operator": "In", "values": ["hpc", "ml"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.matches(LABELS)
    assert not selector.matches({**LABELS, "legacy": "1"})
    assert selector_from_object(None).matches({})
    assert selector_from_object({}).empty
    with pytest.raises(LabelSelectorError, match="operator must be"):
        selector_from_object({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]})
    with pytest.raises(LabelSelectorError, match="In and NotIn need at least one value"):
        selector_from_object({"matchExpressions": [{"key": "a", "operator": "In"}]})
    with pytest.raises(LabelSelectorError, match='matchLabels a: values\\[0\\]: Invalid value: "b c"'):
        selector_from_object({"matchLabels": {"a": "b c"}})


names = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)


@given(
    labels=st.dictionaries(names, names, max_size=4),
    key=names,
    values=st.lists(names, min_size=1, max_size=3),
)
def test_in_and_notin_are_complements(labels: dict[str, str], key: str, values: list[str]) -> None:
    joined = ",".join(values)
    assert parse_selector(f"{key} in ({joined})").matches(labels) != parse_selector(
        f"{key} notin ({joined})"
    ).matches(labels)
    assert parse_selector(key).matches(labels) != parse_selector(f"!{key}").matches(labels)
