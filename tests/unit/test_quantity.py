from fractions import Fraction

import pytest

from bridge.quantity import QuantityError, mebibytes, parse_quantity, whole_cpus


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)),
        ("500m", Fraction(1, 2)),
        ("0.1", Fraction(1, 10)),
        (".5", Fraction(1, 2)),
        ("1Ki", Fraction(1024)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("1e3", Fraction(1000)),
        ("2E-1", Fraction(1, 5)),
        ("4M", Fraction(4_000_000)),
        ("100n", Fraction(1, 10**7)),
        ("-1", Fraction(-1)),
    ],
)
def test_parses_every_suffix_exactly(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1Kb", "1 Gi", "Gi", "1e400", "--1"])
def test_rejects_what_the_api_server_rejects(text: str) -> None:
    with pytest.raises(QuantityError, match=r"quantity|exponent"):
        parse_quantity(text)


def test_cpus_round_up_and_memory_rounds_up_to_whole_mebibytes() -> None:
    assert whole_cpus(parse_quantity("200m")) == 1
    assert whole_cpus(parse_quantity("2")) == 2
    assert whole_cpus(parse_quantity("2001m")) == 3
    assert mebibytes(parse_quantity("1Gi")) == 1024
    assert mebibytes(parse_quantity("1G")) == 954  # 953.67 MiB: never short of the request
