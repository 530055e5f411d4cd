"""Property-collector reads: one round trip per question, never one per VM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim
vmodl: Any = untyped_vmodl

VM_PROPERTIES = (
    "name",
    "runtime.powerState",
    "config.hardware.numCPU",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "guest.net",
    "config.instanceUuid",
)


def retrieve(
    instance: Any, objects: Sequence[Any], properties: Sequence[str]
) -> list[dict[str, Any]]:
    """Each object's requested properties (plus "_ref"), in one RetrievePropertiesEx."""
    collector = instance.content.propertyCollector
    spec = vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=obj) for obj in objects],
        propSet=[
            vmodl.query.PropertyCollector.PropertySpec(type=kind, pathSet=list(properties))
            for kind in {type(obj) for obj in objects}
        ],
    )
    return _all_pages(collector, collector.RetrievePropertiesEx([spec], _options()))


def retrieve_all_vms(instance: Any, properties: Sequence[str]) -> list[dict[str, Any]]:
    """Every VM's properties (see retrieve_all)."""
    return retrieve_all(instance, vim.VirtualMachine, properties)


def retrieve_all(instance: Any, kind: Any, properties: Sequence[str]) -> list[dict[str, Any]]:
    """Every object of `kind` with its properties, through one container view, paging on the
    returned token.

    The simulator returns everything at once (it ignores maxObjects and has no
    ContinueRetrievePropertiesEx), so the token path is not exercised by the tests.
    """
    content = instance.content
    view = content.viewManager.CreateContainerView(content.rootFolder, [kind], True)
    try:
        collector = content.propertyCollector
        spec = view_filter(view, kind, properties)
        return _all_pages(collector, collector.RetrievePropertiesEx([spec], _options()))
    finally:
        view.DestroyView()


def view_filter(view: Any, kind: Any, properties: Sequence[str]) -> Any:
    """The filter spec selecting `properties` of every object of `kind` in a container view."""
    return vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[
            vmodl.query.PropertyCollector.ObjectSpec(
                obj=view,
                skip=True,
                selectSet=[
                    vmodl.query.PropertyCollector.TraversalSpec(
                        name="view", path="view", skip=False, type=vim.view.ContainerView
                    )
                ],
            )
        ],
        propSet=[vmodl.query.PropertyCollector.PropertySpec(type=kind, pathSet=list(properties))],
    )


def _options() -> Any:
    return vmodl.query.PropertyCollector.RetrieveOptions(maxObjects=1000)


def _all_pages(collector: Any, page: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _ in range(1_000_000):
        if page is None:
            break
        rows.extend(_row(content) for content in page.objects)
        if not page.token:
            break
        page = collector.ContinueRetrievePropertiesEx(page.token)
    return rows


def _row(content: Any) -> dict[str, Any]:
    row: dict[str, Any] = {prop.name: prop.val for prop in content.propSet or ()}
    row["_ref"] = content.obj
    return row


def extra_config(row: Mapping[str, Any]) -> dict[str, str]:
    """The VM's extraConfig; a key set twice keeps its last value (the simulator appends)."""
    return {str(option.key): str(option.value) for option in row.get("config.extraConfig") or ()}
