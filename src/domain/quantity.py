"""Kubernetes resource quantities ("8Gi", "512Mi", "2G", "1.5Gi", "1e9") as whole MiB."""

from __future__ import annotations

import math
import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]{1,3}))?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MIB = 1024 * 1024
_MAX_TEXT = 64


def quantity_to_mib(text: str) -> int | None:
    """Bytes of a quantity rounded up to whole MiB; None when it is not a non-negative quantity.

    A bare number is bytes, as in Kubernetes. Exponents are bounded so that hostile input like
    "1e999999" cannot make us compute huge numbers.
    """
    text = text.strip()
    if len(text) > _MAX_TEXT:
        return None
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return None
    number = Fraction(match["number"])
    if number < 0:
        return None
    suffix, exponent = match["suffix"], match["exponent"]
    if suffix in _BINARY:
        value: Fraction = number * Fraction(1024) ** _BINARY[suffix]
    elif exponent is not None:
        value = number * Fraction(10) ** int(exponent)
    else:
        value = number * Fraction(10) ** _DECIMAL[suffix or ""]
    return math.ceil(value / _MIB)
