"""One edge per adapter package (docs/architecture.md, "Error model"): a library's exceptions
become values in its edge module and nowhere else, and the image URL rules and downloads,
which call no library that raises expectedly, raise nothing at all. This scan fails, naming
file:line, on a catch outside the edge: an `except` or `contextlib.suppress` of libvirt's
error outside libvirt's edge, of a vSphere fault or network error outside vSphere's, or a
`raise` (or an exception class) in the image URL rules or downloads."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
HYPERVISORS = SRC / "adapters" / "hypervisors"

LIBVIRT_EDGE = frozenset({"calls.py", "errors.py"})
LIBVIRT_CAUGHT = frozenset({"libvirtError"})
# The session re-logs in on NotAuthenticated and names a failed login: what the edge calls.
VSPHERE_EDGE = frozenset({"calls.py", "errors.py", "session.py"})
VSPHERE_CAUGHT = frozenset(
    {"EXPECTED_FAILURES", "MethodFault", "OSError", "ConnectionError", "HTTPException"}
)
VSPHERE_FAULT_ROOTS = frozenset({"vim", "vmodl"})
RAISE_FREE = (SRC / "domain" / "image_urls.py", SRC / "adapters" / "downloads.py")


def _spelled(node: ast.AST) -> set[str]:
    """Every name and attribute `node` spells: `libvirt.libvirtError` gives both parts."""
    return {
        part.id if isinstance(part, ast.Name) else part.attr
        for part in ast.walk(node)
        if isinstance(part, ast.Name | ast.Attribute)
    }


def _caught(tree: ast.AST) -> Iterator[tuple[int, set[str]]]:
    """What each `except`, `contextlib.suppress(...)` and `raised=` (undone_on_failure's
    catch) names, by line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            yield node.lineno, _spelled(node.type)
        if isinstance(node, ast.Call):
            if "suppress" in _spelled(node.func):
                yield node.lineno, set().union(*(_spelled(arg) for arg in node.args))
            for keyword in node.keywords:
                if keyword.arg == "raised":
                    yield node.lineno, _spelled(keyword.value)


def _libvirt_offences(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for line, names in _caught(tree):
        if names & LIBVIRT_CAUGHT:
            yield line, "catches libvirtError outside the edge: use a calls.py helper"


def _vsphere_offences(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for line, names in _caught(tree):
        if names & (VSPHERE_CAUGHT | VSPHERE_FAULT_ROOTS):
            yield line, "catches a fault or network error outside the edge: use a calls.py helper"


def _raise_offences(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            yield node.lineno, "raises: an expected failure is a Failure naming the field"
        if isinstance(node, ast.ClassDef) and any(
            name.endswith(("Error", "Exception")) for base in node.bases for name in _spelled(base)
        ):
            yield node.lineno, "defines an exception class: an expected failure is a value"


def _offenders() -> Iterator[str]:
    scans = [
        *((path, _libvirt_offences) for path in _package("libvirt", LIBVIRT_EDGE)),
        *((path, _vsphere_offences) for path in _package("vsphere", VSPHERE_EDGE)),
        *((path, _raise_offences) for path in RAISE_FREE),
    ]
    for path, scan in scans:
        for line, what in scan(ast.parse(path.read_text(), str(path))):
            yield f"{path.relative_to(ROOT)}:{line}: {what}"


def _package(name: str, edge: frozenset[str]) -> list[Path]:
    return sorted(path for path in (HYPERVISORS / name).glob("*.py") if path.name not in edge)


def test_library_exceptions_are_caught_only_at_their_package_edge() -> None:
    offenders = list(_offenders())
    assert not offenders, "\n".join(offenders)


def test_the_scan_finds_each_offence() -> None:
    """The scan itself: every shape it forbids is found, and the edge helpers are not."""
    libvirt_code = """
try:
    conn.lookupByName(name)
except libvirt.libvirtError:
    pass
with contextlib.suppress(libvirt.libvirtError):
    stream.abort()
undone_on_failure(work, undo, raised=(libvirt.libvirtError,))
or_none(lambda: conn.lookupByName(name))
def describe(error: libvirt.libvirtError) -> None: ...
"""
    assert sorted(line for line, _ in _libvirt_offences(ast.parse(libvirt_code))) == [4, 6, 8]
    vsphere_code = """
try:
    wait(connection, task)
except vim.fault.FileNotFound:
    pass
except EXPECTED_FAILURES:
    pass
except (OSError, http.client.HTTPException):
    pass
with contextlib.suppress(*EXPECTED_FAILURES):
    lease.HttpNfcLeaseAbort()
best_effort(lease.HttpNfcLeaseAbort)
try:
    payload = json.loads(text)
except ValueError:
    pass
"""
    assert sorted(line for line, _ in _vsphere_offences(ast.parse(vsphere_code))) == [4, 6, 8, 10]
    raising = """
class UnsafeImageURLError(ValueError):
    pass
raise UnsafeImageURLError("no")
"""
    assert sorted(line for line, _ in _raise_offences(ast.parse(raising))) == [2, 4]
