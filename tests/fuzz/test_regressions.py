"""Every kind of disagreement the fuzzer found, replayed from its recipe (fuzz/regressions/):
the judge refuses the image, or accepts it and pyrigaud lands the disk qemu-img reads. A case
`known_open` is one today's judge still accepts: expected to fail (strictly: once the judge
refuses it, the run says so, and the case is closed by setting known_open to false)."""

from __future__ import annotations

import pytest

from fuzz.oracle import outcome
from fuzz.recipes import Regression, load_regressions

REGRESSIONS = load_regressions()


def _case(regression: Regression) -> object:
    if not regression.known_open:
        return pytest.param(regression, id=regression.name)
    still_accepted = pytest.mark.xfail(strict=True, raises=AssertionError, reason=regression.reason)
    return pytest.param(regression, id=regression.name, marks=still_accepted)


def test_there_are_regression_cases() -> None:
    assert REGRESSIONS


@pytest.mark.parametrize("regression", [_case(regression) for regression in REGRESSIONS])
def test_a_kept_disagreement_is_closed(regression: Regression) -> None:
    found = outcome(regression.recipe)
    assert found.disagreement is None, (regression.signature, found)
