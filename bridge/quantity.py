"""Kubernetes resource quantities ("500m", "1.5Gi", "2e3") as exact fractions.

The bridge must read the same numbers the API server accepted, so this follows
the quantity grammar of k8s.io/apimachinery exactly, with exact arithmetic: a
float would turn "0.1" CPU into 0.1000000000000000055 and round it up wrongly.
"""

import functools
import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# ASCII digits only: `\d` would also accept digits of other scripts ("٣"), which
# the API server and Slurm reject.
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))$"
)
MIB = 2**20
# Far longer than any real quantity; the bound keeps a hostile value from
# reaching Python's int conversion limit (a ValueError, not a QuantityError).
MAX_QUANTITY_LENGTH = 128


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


# Kept: a placement adds up every node's allocatable and each pod's requests, the same few
# strings ("4", "8000Mi") over and over. Fractions do not change; a refusal is not kept.
@functools.lru_cache(maxsize=1024)
def parse_quantity(text: str) -> Fraction:
    if len(text) > MAX_QUANTITY_LENGTH:
        raise QuantityError(f"{text[:20]!r}... is too long to be a Kubernetes quantity")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(
            f"{text!r} is not a Kubernetes quantity (examples: 2, 500m, 1.5, 512Mi, 4Gi, 1e3)"
        )
    value = Fraction(match["number"])
    if match["binary"]:
        value *= _BINARY[match["binary"]]
    elif match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > 30:
            raise QuantityError(f"{text!r}: exponent out of range")
        value *= Fraction(10) ** exponent
    else:
        value *= _DECIMAL[match["decimal"] or ""]
    return -value if match["sign"] == "-" else value


def whole_cpus(quantity: Fraction) -> int:
    """CPUs as Slurm counts them: whole CPUs, rounded up ("200m" → 1)."""
    return math.ceil(quantity)


def mebibytes(quantity: Fraction) -> int:
    """Bytes to MiB, rounded up so that the allocation never falls short of the pod's need."""
    return math.ceil(quantity / MIB)
