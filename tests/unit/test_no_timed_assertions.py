"""No test asserts a duration: on a shared 2-core machine a speed claim is a flaky test, and
durations belong to the benchmarks. Tests assert the behaviour and wait for the state they
check (a bounded wait that fails with a message is a liveness bound, not an assertion).

The scan reads every test module's syntax tree for an `assert` comparing a real clock's
difference (`time.monotonic() - started`, or a name given such a difference): a manual clock's
`now()` is the test's own time, not the machine's, and is not flagged."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]
REAL_CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}


def _reads_a_real_clock(node: ast.AST) -> bool:
    """`time.monotonic()` or `monotonic()` (and the other clocks of the time module)."""
    if not isinstance(node, ast.Call) or node.args:
        return False
    function = node.func
    if isinstance(function, ast.Attribute):
        return (
            function.attr in REAL_CLOCKS
            and isinstance(function.value, ast.Name)
            and function.value.id == "time"
        )
    return isinstance(function, ast.Name) and function.id in REAL_CLOCKS - {"time"}


def _is_reading(node: ast.AST, readings: set[str]) -> bool:
    return _reads_a_real_clock(node) or (isinstance(node, ast.Name) and node.id in readings)


def _clock_difference(node: ast.AST, readings: set[str], durations: set[str]) -> bool:
    """Whether `node` holds a difference of real clock readings (a reading, or a name given
    one, on either side), or a name given such a difference."""
    for inner in ast.walk(node):
        if (
            isinstance(inner, ast.BinOp)
            and isinstance(inner.op, ast.Sub)
            and (_is_reading(inner.left, readings) or _is_reading(inner.right, readings))
        ):
            return True
        if isinstance(inner, ast.Name) and inner.id in durations:
            return True
    return False


def _names_given(tree: ast.AST, value_is: Callable[[ast.expr], bool]) -> set[str]:
    """The names assigned a value `value_is` holds of."""
    return {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and value_is(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def timed_assertions(source: str) -> list[int]:
    """The lines of the asserts in `source` that compare a real clock's difference."""
    tree = ast.parse(source)
    readings = _names_given(tree, _reads_a_real_clock)
    durations = _names_given(tree, lambda value: _clock_difference(value, readings, set()))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        and any(
            _clock_difference(compared, readings, durations)
            for comparison in ast.walk(node.test)
            if isinstance(comparison, ast.Compare)
            for compared in (comparison.left, *comparison.comparators)
        )
    ]


@pytest.mark.parametrize(
    "source",
    [
        "assert time.monotonic() - started < 2.5",
        "assert 0.3 <= time.perf_counter() - began",
        "elapsed = time.monotonic() - started\nassert elapsed < 5",
        "took = monotonic() - t0\nassert took >= 0.95, 'waited'",
        "answered = time.monotonic()\nassert answered - proxy.outage_began < 9",
    ],
)
def test_the_scan_finds_a_timed_assertion(source: str) -> None:
    assert timed_assertions(source)


@pytest.mark.parametrize(
    "source",
    [
        "deadline = time.monotonic() + 20\nwhile time.monotonic() < deadline: pass",
        "assert clock.now() - started > DEADLINE_SECONDS",  # a manual clock: the test's time
        "took = time.monotonic() - started\nprint(f'{took:.1f} s')",
        "long_ago = time.time() - WEEK\nassert old.stat().st_mtime > 0",
        "started = time.monotonic()\nassert time.monotonic() < started + 60",
    ],
)
def test_the_scan_leaves_waits_manual_clocks_and_printed_figures_alone(source: str) -> None:
    assert timed_assertions(source) == []


def test_no_test_asserts_a_duration() -> None:
    found = [
        f"{path.relative_to(TESTS)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in timed_assertions(path.read_text())
    ]
    assert found == [], "assert the behaviour and wait for the state, not for time"
