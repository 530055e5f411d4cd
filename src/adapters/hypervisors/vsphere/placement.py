"""Where a new VM goes: the request's placement, else the provider's defaults, else the source's.

Names are looked up with one container view per kind (name only), so placement costs a few
round trips whatever the inventory size. An unknown name is INVALID_SPEC naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve, retrieve_all
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Placement

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim


@dataclass(frozen=True)
class Location:
    """The folder, pool, datastore and (optional) host a clone is made in."""

    folder: Any
    pool: Any
    datastore: Any
    host: Any = None


def merged(requested: Placement, defaults: Placement) -> Placement:
    """Each field of the request, else the provider default (PROVIDER_DEFAULT_*)."""
    return Placement(
        datastore=requested.datastore or defaults.datastore,
        storage_pod=requested.storage_pod or defaults.storage_pod,
        cluster=requested.cluster or defaults.cluster,
        folder=requested.folder or defaults.folder,
        host=requested.host or defaults.host,
    )


def resolve(instance: Any, placement: Placement, source: Any) -> Result[Location, ProviderError]:
    own = _source_location(instance, source)

    def pool_of(host: Any) -> Result[Any, ProviderError]:
        if placement.cluster:
            return named_entity(
                instance, vim.ClusterComputeResource, placement.cluster, fields.PLACEMENT_CLUSTER
            ).map(partial(_resource_pool, instance))
        if host is not None:
            return Success(_resource_pool(instance, _compute_of(instance, host)))
        return Success(own.pool)

    def datastore() -> Result[Any, ProviderError]:
        if placement.datastore:
            return named_entity(
                instance, vim.Datastore, placement.datastore, fields.PLACEMENT_DATASTORE
            )
        if placement.storage_pod:
            return named_entity(
                instance, vim.StoragePod, placement.storage_pod, fields.PLACEMENT_STORAGE_POD
            ).bind(partial(roomiest_member, instance, name=placement.storage_pod))
        return Success(own.datastore)

    def folder() -> Result[Any, ProviderError]:
        if placement.folder:
            return named_entity(instance, vim.Folder, placement.folder, fields.PLACEMENT_FOLDER)
        return Success(own.folder)

    return Result.do(
        Location(folder=in_folder, pool=pool, datastore=on_datastore, host=host)
        for host in named_entity(instance, vim.HostSystem, placement.host, fields.PLACEMENT_HOST)
        for pool in pool_of(host)
        for on_datastore in datastore()
        for in_folder in folder()
    )


def named_entity(instance: Any, kind: Any, name: str, field: str) -> Result[Any, ProviderError]:
    """The entity of that kind called `name` (None when no name is given); INVALID_SPEC naming
    `field` when nothing is called so."""
    if not name:
        return Success(None)
    found = [
        row["_ref"] for row in retrieve_all(instance, kind, ("name",)) if row.get("name") == name
    ]
    if not found:
        return Failure(ProviderError.invalid_spec(field, f"nothing named {name!r}"))
    return Success(found[0])


def roomiest_member(instance: Any, pod: Any, name: str) -> Result[Any, ProviderError]:
    members = list(retrieve(instance, [pod], ("childEntity",))[0].get("childEntity") or ())
    datastores = [member for member in members if isinstance(member, vim.Datastore)]
    if not datastores:
        return Failure(
            ProviderError.invalid_spec(fields.PLACEMENT_STORAGE_POD, f"{name!r} has no datastore")
        )
    rows = retrieve(instance, datastores, ("summary.freeSpace",))
    return Success(max(rows, key=_free_space)["_ref"])


def _free_space(row: dict[str, Any]) -> int:
    return int(row.get("summary.freeSpace") or 0)


def _source_location(instance: Any, source: Any) -> Location:
    row = retrieve(instance, [source], ("parent", "resourcePool", "datastore", "runtime.host"))[0]
    pool = row.get("resourcePool")
    if pool is None:  # a template has no pool: use its host's
        pool = _resource_pool(instance, _compute_of(instance, row["runtime.host"]))
    datastores = list(row.get("datastore") or ())
    return Location(
        folder=row["parent"], pool=pool, datastore=datastores[0] if datastores else None
    )


def resolve_on_datastore(
    instance: Any, placement: Placement, datastore: Any
) -> Result[Location, ProviderError]:
    """Where a VM that copies no other VM goes (an imported image, a VM around an existing
    disk), on `datastore`: the placement's cluster or host, else the compute resource of a host
    that mounts the datastore; the placement's folder, else its datacenter's VM folder."""

    def pool_of(host: Any) -> Result[Any, ProviderError]:
        if placement.cluster:
            return named_entity(
                instance, vim.ClusterComputeResource, placement.cluster, fields.PLACEMENT_CLUSTER
            ).map(partial(_resource_pool, instance))
        mounts = list(retrieve(instance, [datastore], ("host",))[0].get("host") or ())
        if host is None and not mounts:
            return Failure(ProviderError.failed_precondition("no host mounts the datastore"))
        return Success(_resource_pool(instance, _compute_of(instance, host or mounts[0].key)))

    def folder() -> Result[Any, ProviderError]:
        if placement.folder:
            return named_entity(instance, vim.Folder, placement.folder, fields.PLACEMENT_FOLDER)
        datacenter = _datacenter_of(instance, datastore)
        return Success(retrieve(instance, [datacenter], ("vmFolder",))[0]["vmFolder"])

    return Result.do(
        Location(folder=in_folder, pool=pool, datastore=datastore, host=host)
        for host in named_entity(instance, vim.HostSystem, placement.host, fields.PLACEMENT_HOST)
        for pool in pool_of(host)
        for in_folder in folder()
    )


def import_location(
    instance: Any, defaults: Placement, storage_hint: str
) -> Result[Location, ProviderError]:
    """Where an imported image or disk lands: the datastore `storage_hint` names, else
    PROVIDER_DEFAULT_DATASTORE, else the roomiest datastore of PROVIDER_DEFAULT_STORAGE_POD; in
    the default cluster and folder."""
    name = storage_hint or defaults.datastore
    if name:
        datastore = named_entity(instance, vim.Datastore, name, fields.STORAGE_HINT)
    elif defaults.storage_pod:
        datastore = named_entity(
            instance, vim.StoragePod, defaults.storage_pod, fields.STORAGE_HINT
        ).bind(partial(roomiest_member, instance, name=defaults.storage_pod))
    else:
        datastore = Failure(
            ProviderError.invalid_spec(
                fields.STORAGE_HINT,
                "name the datastore to import into (or set PROVIDER_DEFAULT_DATASTORE)",
            )
        )
    placement = Placement(cluster=defaults.cluster, folder=defaults.folder)
    return datastore.bind(partial(resolve_on_datastore, instance, placement))


def _compute_of(instance: Any, host: Any) -> Any:
    return retrieve(instance, [host], ("parent",))[0]["parent"]


def _resource_pool(instance: Any, compute: Any) -> Any:
    return retrieve(instance, [compute], ("resourcePool",))[0]["resourcePool"]


def _datacenter_of(instance: Any, entity: Any) -> Any:
    while not isinstance(entity, vim.Datacenter):
        entity = retrieve(instance, [entity], ("parent",))[0]["parent"]
    return entity
