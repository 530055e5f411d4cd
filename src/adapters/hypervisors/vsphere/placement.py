"""Where a new VM goes: the request's placement, else the provider's defaults, else the source's.

Names are looked up with one container view per kind (name only), so placement costs a few
round trips whatever the inventory size. An unknown name is INVALID_SPEC naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve, retrieve_all
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError
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


def resolve(instance: Any, placement: Placement, source: Any) -> Location:
    own = _source_location(instance, source)
    host = named_entity(instance, vim.HostSystem, placement.host, fields.PLACEMENT_HOST)
    pool = own.pool
    if placement.cluster:
        cluster = named_entity(
            instance, vim.ClusterComputeResource, placement.cluster, fields.PLACEMENT_CLUSTER
        )
        pool = retrieve(instance, [cluster], ("resourcePool",))[0]["resourcePool"]
    elif host is not None:
        compute = retrieve(instance, [host], ("parent",))[0]["parent"]
        pool = retrieve(instance, [compute], ("resourcePool",))[0]["resourcePool"]
    datastore = own.datastore
    if placement.datastore:
        datastore = named_entity(
            instance, vim.Datastore, placement.datastore, fields.PLACEMENT_DATASTORE
        )
    elif placement.storage_pod:
        pod = named_entity(
            instance, vim.StoragePod, placement.storage_pod, fields.PLACEMENT_STORAGE_POD
        )
        datastore = roomiest_member(instance, pod, placement.storage_pod)
    folder = own.folder
    if placement.folder:
        folder = named_entity(instance, vim.Folder, placement.folder, fields.PLACEMENT_FOLDER)
    return Location(folder=folder, pool=pool, datastore=datastore, host=host)


def named_entity(instance: Any, kind: Any, name: str, field: str) -> Any:
    if not name:
        return None
    found = [
        row["_ref"] for row in retrieve_all(instance, kind, ("name",)) if row.get("name") == name
    ]
    if not found:
        raise ExpectedError(ProviderError.invalid_spec(field, f"nothing named {name!r}"))
    return found[0]


def roomiest_member(instance: Any, pod: Any, name: str) -> Any:
    members = list(retrieve(instance, [pod], ("childEntity",))[0].get("childEntity") or ())
    datastores = [member for member in members if isinstance(member, vim.Datastore)]
    if not datastores:
        raise ExpectedError(
            ProviderError.invalid_spec(fields.PLACEMENT_STORAGE_POD, f"{name!r} has no datastore")
        )
    rows = retrieve(instance, datastores, ("summary.freeSpace",))
    return max(rows, key=lambda row: int(row.get("summary.freeSpace") or 0))["_ref"]


def _source_location(instance: Any, source: Any) -> Location:
    row = retrieve(instance, [source], ("parent", "resourcePool", "datastore", "runtime.host"))[0]
    pool = row.get("resourcePool")
    if pool is None:  # a template has no pool: use its host's
        compute = retrieve(instance, [row["runtime.host"]], ("parent",))[0]["parent"]
        pool = retrieve(instance, [compute], ("resourcePool",))[0]["resourcePool"]
    datastores = list(row.get("datastore") or ())
    return Location(
        folder=row["parent"], pool=pool, datastore=datastores[0] if datastores else None
    )


def resolve_on_datastore(instance: Any, placement: Placement, datastore: Any) -> Location:
    """Where a VM that copies no other VM goes (an imported image, a VM around an existing
    disk), on `datastore`: the placement's cluster or host, else the compute resource of a host
    that mounts the datastore; the placement's folder, else its datacenter's VM folder."""
    host = named_entity(instance, vim.HostSystem, placement.host, fields.PLACEMENT_HOST)
    if placement.cluster:
        cluster = named_entity(
            instance, vim.ClusterComputeResource, placement.cluster, fields.PLACEMENT_CLUSTER
        )
        pool = retrieve(instance, [cluster], ("resourcePool",))[0]["resourcePool"]
    else:
        mounts = list(retrieve(instance, [datastore], ("host",))[0].get("host") or ())
        if host is None and not mounts:
            raise ExpectedError(ProviderError.failed_precondition("no host mounts the datastore"))
        compute = retrieve(instance, [host or mounts[0].key], ("parent",))[0]["parent"]
        pool = retrieve(instance, [compute], ("resourcePool",))[0]["resourcePool"]
    if placement.folder:
        folder = named_entity(instance, vim.Folder, placement.folder, fields.PLACEMENT_FOLDER)
    else:
        folder = retrieve(instance, [_datacenter_of(instance, datastore)], ("vmFolder",))[0][
            "vmFolder"
        ]
    return Location(folder=folder, pool=pool, datastore=datastore, host=host)


def import_location(instance: Any, defaults: Placement, storage_hint: str) -> Location:
    """Where an imported image or disk lands: the datastore `storage_hint` names, else
    PROVIDER_DEFAULT_DATASTORE, else the roomiest datastore of PROVIDER_DEFAULT_STORAGE_POD; in
    the default cluster and folder."""
    name = storage_hint or defaults.datastore
    if name:
        datastore = named_entity(instance, vim.Datastore, name, fields.STORAGE_HINT)
    elif defaults.storage_pod:
        pod = named_entity(instance, vim.StoragePod, defaults.storage_pod, fields.STORAGE_HINT)
        datastore = roomiest_member(instance, pod, defaults.storage_pod)
    else:
        raise ExpectedError(
            ProviderError.invalid_spec(
                fields.STORAGE_HINT,
                "name the datastore to import into (or set PROVIDER_DEFAULT_DATASTORE)",
            )
        )
    return resolve_on_datastore(
        instance, Placement(cluster=defaults.cluster, folder=defaults.folder), datastore
    )


def _datacenter_of(instance: Any, entity: Any) -> Any:
    while not isinstance(entity, vim.Datacenter):
        entity = retrieve(instance, [entity], ("parent",))[0]["parent"]
    return entity
