"""A staging type is its own modules plus one registry line: the domain names no type and no
manager field, the registry is the only list of types, and a type added there alone is read
from a request and served."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import SplitResult

import pytest
from returns.result import Result, Success

import pyrigaud
from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging import registry
from pyrigaud.adapters.staging.pvc import pvc_store
from pyrigaud.adapters.staging.rules import StagingKind, invalid
from pyrigaud.domain import fields, models
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import ExportRequest
from pyrigaud.domain.staging import StagedLocation, StagingOptions, StagingType
from pyrigaud.domain.values import Value
from pyrigaud.entrypoints.grpc.wire import field_names as names
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

from support import error_of, ok
from support.transfer import export_request

SRC = Path(pyrigaud.__file__).parent
TYPES = tuple(registry.STAGING_KINDS)
# Where a type may be spelled: the registry and the type's own modules (`s3.py`, `s3_calls.py`,
# `s3_location.py`, ...). The operator's kit (`client/`) knows the manager's vocabulary only
# through the wire, and the in-memory fake's default capabilities, which tests build it with,
# claim every type the manager has (the served fake claims what the registry built).
SPELLED_IN = ("adapters/staging/registry.py", "client/", "adapters/hypervisors/fake/hypervisor.py")
# The manager's names of the requests' fields that are no domain path nor a domain model's field.
DOMAIN_PATHS = {value for name, value in vars(fields).items() if name.isupper()} | {
    attribute
    for model in vars(models).values()
    if isinstance(model, type) and issubclass(model, Value)
    for attribute in model.model_fields
}
MANAGER_NAMES = sorted(
    {
        value
        for name, value in vars(names).items()
        if name.isupper() and isinstance(value, str) and "_" in value
    }
    - DOMAIN_PATHS
)


def code_strings(path: Path) -> Iterator[str]:
    """The string constants of a module's code, its docstrings aside."""
    tree = ast.parse(path.read_text())
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from () if id(node) in docstrings else (node.value,)


def modules(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (SRC / folder).rglob("*.py"))


def names_a_type(text: str) -> bool:
    return any(text == kind or text.startswith(f"{kind}://") for kind in TYPES)


def test_the_manager_names_are_found() -> None:
    assert {"backend_type", "storage_options_json", "image_json"} <= set(MANAGER_NAMES)


@pytest.mark.parametrize("path", modules("domain"), ids=str)
def test_the_domain_names_no_staging_type(path: Path) -> None:
    assert [text for text in code_strings(path) if names_a_type(text)] == []


@pytest.mark.parametrize("path", modules("domain", "adapters", "application"), ids=str)
def test_only_the_wire_spells_the_managers_field_names(path: Path) -> None:
    spelled = [
        text
        for text in code_strings(path)
        for name in MANAGER_NAMES
        if name in text.replace(".", " ").replace("[", " ").split()
    ]
    assert spelled == []


@pytest.mark.parametrize("path", modules("."), ids=lambda path: str(path.relative_to(SRC)))
def test_the_registry_is_the_only_list_of_staging_types(path: Path) -> None:
    where = path.relative_to(SRC).as_posix()
    own_module = any(where.startswith(f"adapters/staging/{kind}") for kind in TYPES)
    if own_module or where.startswith(SPELLED_IN):
        return
    assert [text for text in code_strings(path) if names_a_type(text)] == []


# A staging type of this test's own: objects in memory, named `mem://<box>/<key>`.
MEM = StagingType("mem")


class MemOptions(StagingOptions):
    box_limit: int = 0


class MemRules:
    staging_type = MEM
    shape = "mem://<box>/<key>"
    option_keys = ("boxLimit",)
    takes_query = False
    takes_credentials = False
    no_place = "nothing outlives the process"

    def options(self, options: Mapping[str, object]) -> Result[MemOptions, ProviderError]:
        limit = options.get("boxLimit", 0)
        if not isinstance(limit, int):
            return invalid(fields.storage_option("boxLimit"), "must be an integer")
        return Success(MemOptions(box_limit=limit))

    def located(
        self,
        field: str,
        url: str,
        parts: SplitResult,
        options: MemOptions,
        credentials: Mapping[str, str] | None,
    ) -> Result[StagedLocation, ProviderError]:
        return Success(
            StagedLocation(
                staging_type=MEM,
                field=field,
                url=url,
                container=parts.netloc,
                key=parts.path.lstrip("/"),
                options=options,
            )
        )

    def place_url(self, options: MemOptions) -> Result[str, ProviderError]:
        return invalid(fields.STAGING_TYPE, self.no_place)


def mem_export(
    options: dict[str, object], staging_types: registry.StagingTypes = registry.STAGING_TYPES
) -> Result[ExportRequest, ProviderError]:
    return export_request(
        "vm", "mem://box/disk.qcow2", backend="mem", options=options, staging_types=staging_types
    )


def test_a_type_added_by_one_registry_line_is_read_and_served(tmp_path: Path) -> None:
    refused = error_of(mem_export({}))
    assert for_the_manager(refused) == "backend_type: must be pvc, nfs or s3"

    line = {MEM: StagingKind(MemRules(), pvc_store)}  # files stand in for memory
    with_mem = registry.StagingTypes({**registry.STAGING_KINDS, **line})
    request = ok(mem_export({"boxLimit": 3}, with_mem))
    destination = request.destination
    assert (destination.staging_type, destination.container, destination.key) == (
        "mem",
        "box",
        "disk.qcow2",
    )
    assert destination.options == MemOptions(box_limit=3)
    bad = error_of(mem_export({"boxLimit": "x"}, with_mem))
    assert for_the_manager(bad) == "storage_options_json.boxLimit: must be an integer"
    assert with_mem.stores("tests", SystemClock(), str(tmp_path)).types[-1] == MEM


def test_an_option_another_type_reads_is_checked_whatever_the_requests_type() -> None:
    """The manager sends one set of storage options: a value its reader refuses is refused
    on a request of any type, as before the types had rules of their own."""
    refused = error_of(
        export_request("vm", "pvc://mig/x.qcow2", options={"endpoint": "ftp://host"})
    )
    assert for_the_manager(refused) == (
        "storage_options_json.endpoint: must be http://, https:// or a bare host[:port]"
    )
