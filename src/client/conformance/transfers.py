"""Capability honesty for images and disk transfers: a claimed ImagePrepare, ExportDisk and
ImportDisk work, checked only with what the operator supplies (an image source, a staging
store), since no provider has one the kit could assume."""

from __future__ import annotations

import json
import time
from typing import Any

from pyrigaud.client.conformance.session import (
    TASK_POLL_SECONDS,
    NotApplicableError,
    RpcRefusedError,
    Session,
    Staging,
    expect,
)
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

TRANSFER_MODE = "relay"  # what the manager sends for its "auto"
PREFERRED_FORMAT = "qcow2"
LISTING_LAG_SECONDS = 10.0  # how long a prepared template may take to show in ListVMs


def image_prepare(session: Session) -> None:
    """ImagePrepare twice answers the same image; a Create from it works."""
    if not session.claims("supports_image_import"):
        raise NotApplicableError("supports_image_import is false (unclaimed-import covers it)")
    if not session.options.prepare_image:
        raise NotApplicableError("supports_image_import is claimed; pass --prepare-image-json")
    request = pb.ImagePrepareRequest(
        image_json=json.dumps(session.options.prepare_image),
        target_name=session.name("image"),
        storage_hint=_storage_hint(session),
    )
    first = _prepared(session, request)
    made = first.prepared_image_id == request.target_name  # not an image the provider had
    shown = f"prepared image {first.prepared_image_path or first.prepared_image_id}"
    if made:
        session.left.append(shown)  # until a Delete removes it
    again = _prepared(session, request)
    expect(
        again.prepared_image_id == first.prepared_image_id,
        f"ImagePrepare of the same image answered {again.prepared_image_id!r}, "
        f"then {first.prepared_image_id!r}",
    )
    if first.prepared_image_path:
        _create_and_remove(session, "from-image", {"Path": first.prepared_image_path})
    else:
        _create_and_remove(session, "from-image", {"TemplateName": first.prepared_image_id})
    if made and not first.prepared_image_path:
        _remove_prepared(session, request.target_name, shown)


def _remove_prepared(session: Session, name: str, shown: str) -> None:
    """A prepared image without a path is a named thing of the provider's, a vSphere template:
    Delete removes it once ListVMs shows it (an inventory cache may show it a moment after
    ImagePrepare); one ListVMs never shows stays `left`. (An image with a path is a file or a
    volume, which no RPC removes.)"""
    give_up = time.monotonic() + LISTING_LAG_SECONDS
    image = session.listed_named(name)
    while image is None and time.monotonic() < give_up:
        time.sleep(TASK_POLL_SECONDS)
        image = session.listed_named(name)
    if image is None:
        return
    session.created[name] = image.id
    session.wait("Delete", session.answer("Delete", pb.DeleteRequest(id=image.id)).task)
    expect(not session.describe(image.id).exists, f"Describe still sees {shown} after Delete")
    session.left.remove(shown)


def _prepared(session: Session, request: pb.ImagePrepareRequest) -> Any:
    prepared = session.answer("ImagePrepare", request, claimed="supports_image_import")
    session.wait("ImagePrepare", prepared.task)
    expect(bool(prepared.prepared_image_id), "ImagePrepare answered an empty prepared_image_id")
    return prepared


def disk_export_import(session: Session) -> None:
    """The manager's migration: export a stopped VM's disk to the staging URL, import it with
    checksum verification, then Create from the imported path."""
    unclaimed = [
        c for c in ("supports_disk_export", "supports_disk_import") if not session.claims(c)
    ]
    if unclaimed:
        raise NotApplicableError(f"{' and '.join(unclaimed)} false (unclaimed-* covers it)")
    staging = session.options.staging
    if staging is None:
        raise NotApplicableError("disk export and import are claimed; pass --staging-url")
    vm_id = session.needs_vm()
    session.power(vm_id, pb.POWER_OP_OFF)
    disk_format = _export_format(session)
    export = pb.ExportDiskRequest(vm_id=vm_id, destination_url=staging.url, format=disk_format)
    _stage(export, staging)
    exported = session.answer("ExportDisk", export, claimed="supports_disk_export")
    session.wait("ExportDisk", exported.task)
    expect(bool(exported.checksum), "ExportDisk answered no checksum")
    session.left.append(f"staged export {staging.url}")  # the operator's store, not the provider's
    importing = pb.ImportDiskRequest(
        source_url=staging.url,
        format=disk_format,
        target_name=session.name("imported"),
        storage_hint=_storage_hint(session),
        verify_checksum=True,
        expected_checksum=exported.checksum,
    )
    _stage(importing, staging)
    imported = session.answer("ImportDisk", importing, claimed="supports_disk_import")
    session.wait("ImportDisk", imported.task)
    expect(
        imported.checksum == exported.checksum,
        f"ImportDisk checksum {imported.checksum!r} differs from "
        f"the export's {exported.checksum!r}",
    )
    expect(bool(imported.disk_id), "ImportDisk answered an empty disk_id")
    shown = f"imported disk {imported.path or imported.disk_id}"
    session.left.append(shown)  # until the VM made from it takes it along
    image = {  # the manager's imported-disk VMImage: all six keys (docs/migration.md)
        "TemplateName": "",
        "Path": imported.path,
        "URL": "",
        "Format": disk_format,
        "Checksum": "",
        "ChecksumType": "sha256",
    }
    own_disk = _create_and_remove(session, "from-import", image)
    if imported.path and own_disk == imported.path:
        session.left.remove(shown)


def _storage_hint(session: Session) -> str:
    """Where images and imported disks land: the datastore of --placement-json, as the run's
    VMs (empty: the provider's default)."""
    return str(session.options.placement.get("Datastore") or "")


def _stage(request: pb.ExportDiskRequest | pb.ImportDiskRequest, staging: Staging) -> None:
    """The staging store's fields, the same on both sides of the transfer."""
    request.credentials.update(staging.credentials)
    request.backend_type = staging.backend
    request.transfer_mode = TRANSFER_MODE
    request.storage_options_json = staging.storage_options_json


def _export_format(session: Session) -> str:
    assert session.capabilities is not None  # claims() was true
    claimed = list(session.capabilities.supported_export_formats)
    return PREFERRED_FORMAT if not claimed or PREFERRED_FORMAT in claimed else claimed[0]


def _create_and_remove(session: Session, suffix: str, image: dict[str, Any]) -> str:
    """Create a VM from `image`, then Delete it; the path of its disk (a VM whose own disk is
    the image's file took that file along), "" when GetDiskInfo does not say."""
    vm_id = session.create(suffix, image=image)
    expect(session.describe(vm_id).exists, f"Describe does not see the VM made from {image}")
    try:
        path = str(session.call("GetDiskInfo", pb.GetDiskInfoRequest(vm_id=vm_id)).path)
    except RpcRefusedError:  # the disk-info clause reports it
        path = ""
    session.wait("Delete", session.answer("Delete", pb.DeleteRequest(id=vm_id)).task)
    return path
