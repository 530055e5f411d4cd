"""VMLifecycle on libvirt: find, create, delete and reconfigure persistent domains.

A VM is a persistent domain whose id is its UUID; what pyrigaud remembers about it (owner,
creation time, building mark, its volumes) sits in the domain's <metadata>. Create defines a
placeholder marked as building before it makes any volume (building.py), so a crash at any
point leaves one owner-marked, time-stamped domain that Delete removes whole.
"""

from __future__ import annotations

import logging
import uuid
import xml.etree.ElementTree as ET
from dataclasses import replace
from functools import partial

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.libvirt.building import (
    abandon_building,
    begin_building,
    with_macs,
    write_seed,
)
from pyrigaud.adapters.hypervisors.libvirt.calls import RAISED_BY_LIBVIRT, caught
from pyrigaud.adapters.hypervisors.libvirt.cloud_init import SeedInput, build_seed, needs_seed
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.device_models import (
    Fallback,
    FallbackCounts,
    GuestDevices,
    nearest_devices,
)
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import (
    HOT_ADD_FACTOR,
    DiskDevice,
    DomainDefinition,
    DomainFacts,
    NicDevice,
    disk_element,
    disk_target,
    render_domain,
    with_resources,
)
from pyrigaud.adapters.hypervisors.libvirt.errors import (
    REFUSED_VARIANT_CODES,
    error_code,
    is_missing,
)
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest, blockers, guest_action
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.host_capabilities import (
    check_firmware,
    default_machine_is_pcie,
    tpm_version_of,
)
from pyrigaud.adapters.hypervisors.libvirt.image_sources import ImageDownloads, plan_root_disk
from pyrigaud.adapters.hypervisors.libvirt.metadata import VMMetadata
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    GIB,
    create_volume,
    delete_volume,
    find_pool,
    grow_volume,
    planned_volume_path,
    seed_volume_name,
    volume_facts,
    volume_name,
)
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import MAX_CPU, MAX_MEMORY_MIB
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    CreateRequest,
    NetworkAttachment,
    OwnerMark,
    VMChanges,
    VMRecord,
)

logger = logging.getLogger(__name__)


class LibvirtVMLifecycle:
    """Made within the call: Create returns no task. An imported disk's guest gets the
    nearest equivalent of its hardware (device_models.py); each fallback counted in
    `fallbacks`."""

    def __init__(
        self,
        host: LibvirtHost,
        downloads: ImageDownloads,
        fallbacks: FallbackCounts | None = None,
    ) -> None:
        self._host = host
        self._downloads = downloads
        self._fallbacks = fallbacks or FallbackCounts()

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        def find(conn: VirConnect) -> Result[VMRecord | None, ProviderError]:
            guest = Guest.by_name(conn, name)
            return Success(None if guest is None else guest.record())

        return self._host.run(f"find VM {name!r}", find)

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        def unfinished(conn: VirConnect) -> Result[list[VMRecord], ProviderError]:
            found = []
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_PERSISTENT):
                record = Guest(dom).record()
                if record.building_since is not None:
                    found.append(record)
            return Success(found)

        return self._host.run("find unfinished VMs", unfinished)

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        return self._host.make(
            f"create VM {request.name!r}", partial(self._create, request=request, owner=owner)
        )

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        def delete(conn: VirConnect, guest: Guest) -> Result[None, ProviderError]:
            metadata = guest.facts().metadata
            guest.stop()
            guest.undefine()
            for path in metadata.volumes if metadata else ():
                delete_volume(conn, path)
            return Success(None)

        return self._host.mutate(vm_id, f"delete VM {vm_id!r}", guest_action(vm_id, delete))

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[None, ProviderError]:
        return self._host.mutate(
            vm_id,
            f"reconfigure VM {vm_id!r}",
            guest_action(vm_id, partial(_reconfigured, changes=changes)),
        )

    def upgrade_hardware(self, vm_id: str, target_version: int) -> Result[None, ProviderError]:
        # Never reached through UpgradeHardware: the capabilities claim no upgrades.
        return Failure(ProviderError.not_supported("virtual hardware upgrades"))

    def _create(
        self, conn: VirConnect, request: CreateRequest, owner: OwnerMark
    ) -> Result[str, ProviderError]:
        """Define the domain marked as building first, then make its volumes, then finish it.

        The building domain records every volume it is about to get, so a process killed at
        any point leaves one owner-marked, time-stamped domain that Delete removes whole.
        """
        host = self._host
        match Result.do(
            found
            for _ in check_firmware(conn, request.vm_class, host.domain_type_of(conn))
            for found in find_pool(
                conn, request.placement.datastore or host.pools.default_pool, host.pools
            )
        ):
            case Failure() as failed:
                return failed
            case Success(pool):
                pass
        # No networks asked for still gets one user-mode NIC: a VM nobody can reach is no use.
        attachments = request.networks or (NetworkAttachment(),)
        seeded = needs_seed(request.user_data, request.meta_data, attachments)
        if seeded:
            attachments = with_macs(attachments)  # network-config matches NICs by MAC
        pcie, devices = _machine_devices(conn, host.domain_type_of(conn), request)
        match Result.do(
            (found, plan)
            for found in _nics(conn, attachments, devices)
            for plan in plan_root_disk(conn, request)
        ):
            case Failure() as failed:
                return failed
            case Success((nics, root)):
                pass
        sizes = [root.capacity_bytes] + [spec.size_gib * GIB for spec in request.disks]
        names = [volume_name(request.name, index) for index in range(len(sizes))]
        seed_name = seed_volume_name(request.name)
        planned = [*names, *([root.scratch_name] if root.scratch_name else [])]
        planned += [seed_name] if seeded else []
        vm_class = request.vm_class
        building = DomainDefinition(
            name=request.name,
            domain_type=host.domain_type_of(conn),
            vcpus=vm_class.cpu,
            max_vcpus=min(MAX_CPU, vm_class.cpu * HOT_ADD_FACTOR)
            if vm_class.performance.cpu_hot_add
            else vm_class.cpu,
            memory_mib=vm_class.memory_mib,
            max_memory_mib=min(MAX_MEMORY_MIB, vm_class.memory_mib * HOT_ADD_FACTOR)
            if vm_class.performance.memory_hot_add
            else 0,
            firmware=vm_class.firmware,
            secure_boot=vm_class.security.secure_boot,
            tpm_version=tpm_version_of(vm_class),
            disks=(),
            nics=(),
            metadata=VMMetadata(
                owner=owner,
                created_at=host.clock.now(),
                tags=request.tags,
                volumes=tuple(planned_volume_path(pool, name) for name in planned),
                building=True,
            ),
            uuid=str(uuid.uuid4()),
            pcie=pcie,
        )
        match begin_building(conn, building):
            case Failure() as failed:
                return failed
            case Success(guest):
                pass
        made: list[str] = []

        def finished() -> Result[str, ProviderError]:
            disks = []
            for index, (name, size) in enumerate(zip(names, sizes, strict=True)):
                if index == 0 and root.url_image is not None:
                    match self._downloads.root_volume(conn, pool, name, root.url_image, root):
                        case Failure() as failed:
                            return failed
                        case Success(path):
                            made.append(path)
                else:
                    backing = root.backing if index == 0 else None
                    made.append(create_volume(pool, name, size, backing))
                disks.append(_disk(made[-1], index, devices))
            seed_path = ""
            if seeded:
                seed = SeedInput(
                    name=request.name,
                    instance_id=building.uuid,
                    user_data=request.user_data,
                    meta_data=request.meta_data,
                    networks=attachments,
                )
                match write_seed(conn, pool, seed_name, build_seed(seed), host.write_volume):
                    case Failure() as failed:
                        return failed
                    case Success(seed_path):
                        made.append(seed_path)
            complete = replace(
                building,
                disks=tuple(disks),
                nics=nics,
                seed_path=seed_path,
                metadata=building.metadata.with_volumes(tuple(made)).finished(),
            )
            return Success(self._finish(conn, complete, devices.fallbacks_made(attachments)))

        def undo() -> None:
            for path in made:  # only what this call made: a clashing volume is not ours
                delete_volume(conn, path)
            abandon_building(guest)

        return undone_on_failure(finished, undo, raised=RAISED_BY_LIBVIRT)

    def _finish(
        self, conn: VirConnect, complete: DomainDefinition, fallbacks: tuple[Fallback, ...]
    ) -> str:
        """The finished definition in place of the building one; the fallbacks its guest got
        logged and counted."""
        vm_id = str(conn.defineXML(render_domain(complete)).UUIDString())
        self._fallbacks.report(complete.name, fallbacks)
        return vm_id


def _machine_devices(
    conn: VirConnect, domain_type: str, request: CreateRequest
) -> tuple[bool, GuestDevices]:
    """Whether the host's default machine is PCI Express (q35), and the devices the guest gets
    on its machine: q35 (the default one, or secure boot's) has no IDE controller."""
    pcie = default_machine_is_pcie(conn, domain_type)
    ide = not (pcie or request.vm_class.security.secure_boot)
    return pcie, nearest_devices(request.hardware, has_ide=ide)


def _reconfigured(
    conn: VirConnect, guest: Guest, changes: VMChanges
) -> Result[None, ProviderError]:
    facts = guest.facts()
    running = guest.is_running()
    wanted = [changes.root_disk_gib, *(spec.size_gib for spec in changes.disks)]
    for index, size_gib in enumerate(wanted):
        if size_gib is None or size_gib <= 0:
            continue
        if index < len(facts.disks):
            _grow_disk(conn, guest, facts.disks[index], size_gib * GIB, running)
            continue
        match _attach_new_disk(conn, guest, facts, index, size_gib * GIB):
            case Failure() as failed:
                return failed
        facts = guest.facts()
    if changes.cpu is None and changes.memory_mib is None:
        return Success(None)
    inactive = guest.inactive_xml()
    # Live first, the definition last: its event tells every replica's cache to reread.
    waiting = guest.hot_add(changes) if running else []

    def refused(error: libvirt.libvirtError) -> ProviderError | None:
        if not waiting or error_code(error) not in REFUSED_VARIANT_CODES:
            return None
        return ProviderError.failed_precondition(
            f"{blockers(waiting)} (the next boot's configuration was refused too: "
            f"{error.get_error_message()})"
        )

    def defined(_domain: object) -> None:
        if waiting:
            logger.info("VM %s waits for a power cycle: %s", facts.name, blockers(waiting))

    def redefined() -> Result[object, ProviderError]:
        return Success(conn.defineXML(with_resources(inactive, changes.cpu, changes.memory_mib)))

    return caught(redefined, refused).map(defined)


def _disk(path: str, index: int, devices: GuestDevices) -> DiskDevice:
    """The root disk (index 0) on what its guest knows; added disks on virtio."""
    if index:
        return DiskDevice(path=path, format="qcow2", target=disk_target(index))
    bus = devices.disk_bus
    target = disk_target(index, bus)
    return DiskDevice(path, "qcow2", target, bus=bus, controller=devices.scsi_controller)


def _nics(
    conn: VirConnect, attachments: tuple[NetworkAttachment, ...], devices: GuestDevices
) -> Result[tuple[NicDevice, ...], ProviderError]:
    """A model the request names wins over the one the guest's hardware asks for."""
    nics: list[NicDevice] = []
    for index, attachment in enumerate(attachments):
        match _nic(conn, index, attachment, attachment.model or devices.nic_model(index)):
            case Failure() as failed:
                return failed
            case Success(nic):
                nics.append(nic)
    return Success(tuple(nics))


def _nic(
    conn: VirConnect, index: int, attachment: NetworkAttachment, model: str
) -> Result[NicDevice, ProviderError]:
    if attachment.network_name:

        def missing(error: libvirt.libvirtError) -> ProviderError | None:
            if not is_missing(error):
                return None
            return ProviderError.invalid_spec(
                fields.network_name(index), f"no libvirt network named {attachment.network_name!r}"
            )

        def network() -> Result[object, ProviderError]:
            return Success(conn.networkLookupByName(attachment.network_name))

        return Result.do(
            NicDevice("network", attachment.network_name, model, attachment.mac_address)
            for _ in caught(network, missing)
        )
    if attachment.bridge:
        return Success(NicDevice("bridge", attachment.bridge, model, attachment.mac_address))
    return Success(NicDevice("user", "", model, attachment.mac_address))


def _grow_disk(
    conn: VirConnect, guest: Guest, disk: DiskDevice, capacity: int, running: bool
) -> None:
    current = volume_facts(conn, disk.path)
    if current is not None and current.capacity_bytes >= capacity:
        return  # disks only grow
    if running:
        guest.dom.blockResize(disk.target, capacity, libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES)
    else:
        grow_volume(conn, disk.path, capacity)


def _attach_new_disk(
    conn: VirConnect, guest: Guest, facts: DomainFacts, index: int, capacity: int
) -> Result[None, ProviderError]:
    def attached(metadata: VMMetadata) -> Result[None, ProviderError]:
        return _attached(conn, guest, facts, index, capacity, metadata=metadata)

    return guest.own_metadata().bind(attached)


def _attached(
    conn: VirConnect,
    guest: Guest,
    facts: DomainFacts,
    index: int,
    capacity: int,
    *,
    metadata: VMMetadata,
) -> Result[None, ProviderError]:
    root = facts.disks[0].path if facts.disks else ""
    pool = conn.storageVolLookupByPath(root).storagePoolLookupByVolume()
    path = create_volume(pool, volume_name(facts.name, index), capacity)
    disk = DiskDevice(path=path, format="qcow2", target=disk_target(index))
    xml = ET.tostring(disk_element(disk), encoding="unicode")
    # Live first, then the persistent definition: one call with both flags can change the
    # definition and still fail live, leaving a disk whose volume the cleanup below removes.
    live = bool(guest.dom.isActive())

    in_definition = partial(guest.attach_disk, xml, disk.target, libvirt.VIR_DOMAIN_AFFECT_CONFIG)

    def defined_after_live(_attached_live: None) -> Result[None, ProviderError]:
        return undone_on_failure(in_definition, partial(guest.detach_live, xml))

    def defined() -> Result[None, ProviderError]:
        if not live:
            return in_definition()
        return guest.attach_disk(xml, disk.target, libvirt.VIR_DOMAIN_AFFECT_LIVE).bind(
            defined_after_live
        )

    def recorded(_defined: None) -> None:
        guest.write_metadata(metadata.with_volume(path))

    def defined_and_recorded() -> Result[None, ProviderError]:
        return defined().map(recorded)

    return undone_on_failure(
        defined_and_recorded, partial(delete_volume, conn, path), raised=RAISED_BY_LIBVIRT
    )
