"""One error model across src/ (docs/architecture.md, "Error model"): an expected failure is a
Result from the edge where a library's exception became a value to the gRPC edge, and code
branches on a Result with `match` only. This scan fails, naming file:line, on what the old
model did: raising and catching ExpectedError (a value turned exception turned value), telling
Success from Failure by isinstance or type(), and unwrap()/failure() after such a check. It
holds the one way Results are sequenced too: a Failure passed on is returned as it is, never
rebuilt, and lambdas (one-step transforms only) stay under a budget. A stream's failure has one
channel too: the Result of consuming it, never an `outcome()` asked beside it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

CONTAINERS = frozenset({"Success", "Failure"})
ESCAPES = frozenset({"unwrap", "failure"})
LAMBDA_BUDGET = 150  # lines of src/ holding a lambda, the generated stubs aside
# `case Failure(error):` and, on the next line, `return Failure(error)`: a Failure rebuilt.
REWRAP = re.compile(r"^[ \t]*case Failure\((\w+)\):[ \t]*\n[ \t]*return Failure\(\1\)[ \t]*$", re.M)


def _names(node: ast.expr) -> set[str]:
    """The class names `node` spells: `Success`, `result.Failure`, `(Success, Failure)`."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple | ast.BinOp):
        parts = node.elts if isinstance(node, ast.Tuple) else [node.left, node.right]
        return set().union(*(_names(part) for part in parts))
    return set()


def _offences(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        offence = _offence(node)
        if offence is not None and isinstance(node, ast.expr | ast.alias):
            yield node.lineno, offence


def _offence(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name) and node.id == "ExpectedError":
        return "names ExpectedError (raised or caught: a value made an exception)"
    if isinstance(node, ast.alias) and node.name == "ExpectedError":
        return "imports ExpectedError"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        is_check = node.func.id == "isinstance" and len(node.args) == 2
        if is_check and _names(node.args[1]) & CONTAINERS:
            return "isinstance on Success/Failure: branch with match"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        bare = not node.args and not node.keywords
        if node.func.attr in ESCAPES and bare:
            return f".{node.func.attr}(): take the value in a match case"
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        spells_type = any(
            isinstance(side, ast.Call)
            and isinstance(side.func, ast.Name)
            and side.func.id == "type"
            for side in sides
        )
        if spells_type and set().union(*(_names(side) for side in sides)) & CONTAINERS:
            return "type() compared with Success/Failure: branch with match"
    return None


def _sources() -> Iterator[Path]:
    for path in sorted(SRC.rglob("*.py")):
        if "/generated/" not in path.relative_to(ROOT).as_posix():
            yield path


def test_src_branches_on_results_only_with_match_and_never_raises_them() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _sources()
        for line, what in _offences(ast.parse(path.read_text(), str(path)))
    ]
    assert not offenders, "\n".join(offenders)


def test_the_scan_finds_each_offence() -> None:
    """The scan itself: every shape it forbids is found, and a match is not."""
    offending = """
from pyrigaud.domain.errors import ExpectedError
try:
    raise ExpectedError(error)
except ExpectedError:
    pass
if isinstance(result, (Success, Failure)) or type(result) is Success:
    value = result.unwrap() or result.failure()
"""
    assert sorted(line for line, _ in _offences(ast.parse(offending))) == [2, 4, 5, 7, 7, 8, 8]
    allowed = """
match result:
    case Success(value):
        pass
    case Failure(error):
        pass
"""
    assert list(_offences(ast.parse(allowed))) == []


def _rewraps(source: str) -> Iterator[int]:
    """The lines where a Failure passed on is rebuilt rather than returned as it is."""
    for found in REWRAP.finditer(source):
        yield source.count("\n", 0, found.start()) + 2


def _lambda_lines(tree: ast.AST) -> set[int]:
    return {node.lineno for node in ast.walk(tree) if isinstance(node, ast.Lambda)}


def test_src_passes_a_failure_on_as_it_is() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: a Failure rebuilt; return it as it is "
        "(`case Failure() as failed: return failed`)"
        for path in _sources()
        for line in _rewraps(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)


def test_src_keeps_its_lambdas_under_budget() -> None:
    counts = {
        str(path.relative_to(ROOT)): len(_lambda_lines(ast.parse(path.read_text(), str(path))))
        for path in _sources()
    }
    total = sum(counts.values())
    most = sorted(counts.items(), key=itemgetter(1), reverse=True)[:10]
    assert total < LAMBDA_BUDGET, f"{total} lines with a lambda, the most in: {most}"


def _outcome_calls(tree: ast.AST) -> Iterator[int]:
    """The lines that ask a stream for its outcome beside consuming it (`x.outcome()`)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "outcome"
        ):
            yield node.lineno


def test_src_takes_a_streams_failure_only_as_the_result_of_consuming_it() -> None:
    """One error channel: a stream's failure is what consuming it answers (`Chunks.consumed_by`,
    `answered_by`, `results`), never a second question asked after the iteration."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: .outcome() beside the stream; consume it with "
        "`consumed_by` / `answered_by` and take its Result"
        for path in _sources()
        if path != SRC / "domain" / "chunks.py"
        for line in _outcome_calls(ast.parse(path.read_text(), str(path)))
    ]
    assert not offenders, "\n".join(offenders)
    assert list(_outcome_calls(ast.parse("ended = stream.outcome()\nkind = r.outcome\n"))) == [1]


def test_the_sequencing_scans_find_what_they_forbid() -> None:
    """The scans themselves: a rebuilt Failure is found and one returned as it is is not; a
    lambda is counted once per line."""
    rebuilt = """
match result:
    case Failure(error):
        return Failure(error)
"""
    assert list(_rewraps(rebuilt)) == [4]
    passed_on = """
match result:
    case Failure() as failed:
        return failed
    case Failure(error):
        log(error)
        return Failure(other)
"""
    assert list(_rewraps(passed_on)) == []
    lambdas = "a = lambda: 1\nb = sorted(x, key=lambda y: y, reverse=bool(lambda: 0))\n"
    assert _lambda_lines(ast.parse(lambdas)) == {1, 2}
