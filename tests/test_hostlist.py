import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.hostlist import MAX_HOSTS, compress, expand


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("", []),
        ("n1", ["n1"]),
        (
            "k8s-node-[1-3,7],gpu[01-02]",
            ["k8s-node-1", "k8s-node-2", "k8s-node-3", "k8s-node-7", "gpu01", "gpu02"],
        ),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n[1-2]x", ["n1x", "n2x"]),
        ("a, b ,,c", ["a", "b", "c"]),
        ("n[3,1]", ["n3", "n1"]),
        ("n1,n1", ["n1", "n1"]),
    ],
)
def test_expand(expression: str, names: list[str]) -> None:
    assert expand(expression) == names


@pytest.mark.parametrize(
    "expression", ["n[1-2", "n1-2]", "n[[1]]", "n[]", "n[a-b]", "n[3-1]", "n[1-]", "n[-1]"]
)
def test_expand_rejects_malformed(expression: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        expand(expression)


def test_expand_refuses_absurd_sizes() -> None:
    with pytest.raises(ValueError, match="too large"):
        expand(f"n[0-{MAX_HOSTS}]")
    with pytest.raises(ValueError, match="more than"):
        expand(f"a[1-{MAX_HOSTS}],b[1-2]")


@pytest.mark.parametrize(
    ("names", "expression"),
    [
        ([], ""),
        (["n1"], "n1"),
        (
            ["k8s-node-7", "k8s-node-2", "k8s-node-1", "k8s-node-3", "gpu02", "gpu01"],
            "gpu[01-02],k8s-node-[1-3,7]",
        ),
        (["n10", "n9", "n2"], "n[2,9-10]"),
        (["n08", "n09", "n10"], "n[08-10]"),
        (["n1", "n01", "n2", "n02"], "n[1-2,01-02]"),
        (["n1", "n1"], "n1"),
        (["node", "node1", "x"], "node,node1,x"),
        (["rack1-a", "rack2-a"], "rack1-a,rack2-a"),
    ],
)
def test_compress(names: list[str], expression: str) -> None:
    assert compress(names) == expression


@pytest.mark.parametrize("name", ["", "a,b", "n[1]"])
def test_compress_rejects_names_a_hostlist_cannot_hold(name: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        compress([name])


_prefixes = st.sampled_from(["n", "gpu", "k8s-node-", "rack1-n", "a.b-", ""])
_numbers = st.integers(min_value=0, max_value=130)
_widths = st.integers(min_value=1, max_value=4)


@st.composite
def _host_names(draw: st.DrawFn) -> str:
    prefix = draw(_prefixes)
    if prefix and draw(st.booleans()) and not prefix[-1].isdigit():
        return prefix.rstrip("-.")  # a name without a number
    return prefix + str(draw(_numbers)).zfill(draw(_widths))


@given(st.lists(_host_names(), max_size=40))
def test_round_trip(names: list[str]) -> None:
    expression = compress(names)
    expanded = expand(expression)
    assert sorted(expanded) == sorted(set(names))
    assert compress(expanded) == expression


@given(_prefixes, _numbers, st.integers(min_value=1, max_value=50), _widths)
def test_consecutive_numbers_make_one_range(prefix: str, first: int, count: int, width: int) -> None:
    names = [prefix + str(value).zfill(width) for value in range(first, first + count)]
    expression = compress(names)
    assert expression.count(",") == 0
    assert expand(expression) == names
