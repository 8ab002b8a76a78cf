"""bridge.labels: the API server's label-selector semantics, without the API server."""

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
    ],
)
def test_matching(text: str, matches: bool) -> None:
    assert parse_selector(text).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("env=prod,", "empty requirement"),
        ("team in (a", '"(" without ")"'),
        ("team in ()", "empty value in the set"),
        ("Bad Key=x", "not a requirement"),
        ("-bad=x", "label key"),
        ("example.com/=x", "label key"),
        ("UPPER.example.com/x=y", "prefix must be a DNS subdomain"),
        ("env=" + "v" * 64, "label value"),
        ("env=a b", "not a requirement"),
        ("a in ((b))", "nested parentheses"),
    ],
)
def test_mistakes_say_where(text: str, problem: str) -> None:
    with pytest.raises(LabelSelectorError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_selector(text)


def test_round_trip_to_the_api_server_form() -> None:
    selector = parse_selector("env = prod, team notin (b,a), gpu, !legacy")
    assert str(selector) == "env=prod,team notin (a,b),gpu,!legacy"
    assert parse_selector(str(selector)) == selector


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
    with pytest.raises(LabelSelectorError, match="In needs at least one value"):
        selector_from_object({"matchExpressions": [{"key": "a", "operator": "In"}]})


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
