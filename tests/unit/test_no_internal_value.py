"""INTERNAL is never a value (docs/architecture.md, "Error model"): an expected failure is a
ProviderError of a kind its cause deserves, and a bug is an exception, which the gRPC edge
(`entrypoints/grpc/`) alone answers INTERNAL. This scan fails, naming file:line, on INTERNAL
made anywhere else: an `ErrorKind.INTERNAL`, a `ProviderError.internal(...)`, a gRPC
`StatusCode.INTERNAL` set outside the edge (the operator's kit only reads codes it received)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from pyrigaud.domain.errors import ErrorKind

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
# Where a status code INTERNAL may be named: the edge that answers a bug with it, and the
# operator's kit, which tells a provider's bugs from the codes it receives.
STATUS_READERS = ("src/entrypoints/grpc/", "src/client/")


def _offences(tree: ast.AST, may_name_status: bool) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "INTERNAL":
            owner = node.value.attr if isinstance(node.value, ast.Attribute) else None
            owner = node.value.id if isinstance(node.value, ast.Name) else owner
            if owner == "ErrorKind":
                yield node.lineno, "ErrorKind.INTERNAL: give the kind the cause deserves"
            elif owner == "StatusCode" and not may_name_status:
                yield node.lineno, "StatusCode.INTERNAL outside the gRPC edge"
        called = node.func if isinstance(node, ast.Call) else None
        if isinstance(called, ast.Attribute) and called.attr == "internal":
            yield called.lineno, ".internal(...): a bug raises, an expected failure has a kind"
        if isinstance(node, ast.Constant) and node.value == "internal":
            yield node.lineno, "'internal' spelled as a kind's value"


def _sources() -> Iterator[tuple[Path, bool]]:
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if "/generated/" not in relative:
            yield path, relative.startswith(STATUS_READERS)


def test_no_error_kind_is_internal() -> None:
    assert "internal" not in {kind.value for kind in ErrorKind}
    assert not hasattr(ErrorKind, "INTERNAL")


def test_src_makes_no_internal_value_outside_the_grpc_edge() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path, may_name_status in _sources()
        for line, what in _offences(ast.parse(path.read_text(), str(path)), may_name_status)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_scan_finds_each_offence() -> None:
    """The scan itself: every shape it forbids is found; the edge may name the status code."""
    offending = """
kind = ErrorKind.INTERNAL
kind = errors.ErrorKind.INTERNAL
error = ProviderError.internal("x")
context.set_code(grpc.StatusCode.INTERNAL)
kind = ErrorKind("internal")
"""
    assert sorted(line for line, _ in _offences(ast.parse(offending), False)) == [2, 3, 4, 5, 6]
    assert [line for line, _ in _offences(ast.parse(offending), True)] != []
    edge = "context.set_code(grpc.StatusCode.INTERNAL)\ncode = libvirt.VIR_ERR_INTERNAL_ERROR\n"
    assert list(_offences(ast.parse(edge), True)) == []
