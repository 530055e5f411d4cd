"""Cloning on libvirt: a full or linked copy of a VM's disks under a new domain.

Made as Create makes a VM (building.py): a placeholder marked as building and recording the
volumes it is about to get, then the copies, then the finished definition. A running source's
disks are copied from one point in time by libvirt's backup job.
"""

from __future__ import annotations

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
    random_mac,
    write_seed,
)
from pyrigaud.adapters.hypervisors.libvirt.calls import (
    RAISED_BY_LIBVIRT,
    best_effort,
    caught,
    or_none,
)
from pyrigaud.adapters.hypervisors.libvirt.cloud_init import (
    SeedInput,
    build_seed,
    time_zone_vendor_data,
)
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import (
    DomainDefinition,
    DomainFacts,
    cloned_domain,
    parse_domain,
)
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.metadata import VMMetadata
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    copy_volume,
    create_volume,
    delete_volume,
    find_pool,
    planned_volume_path,
    seed_volume_name,
    volume_facts,
    volume_name,
)
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    Customization,
    Firmware,
    NetworkAttachment,
    OwnerMark,
)

BACKUP_POLL_SECONDS = 0.05
BACKUP_TIMEOUT_SECONDS = 3600  # bounded, yet room for copying a large disk


class LibvirtCloning:
    """Made within the call: Clone returns no task."""

    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        return self._host.make(
            f"clone {request.source_vm_id!r} to {request.target_name!r}",
            partial(self._clone, request=request, owner=owner),
        )

    def _clone(
        self, conn: VirConnect, request: CloneRequest, owner: OwnerMark
    ) -> Result[str, ProviderError]:
        return Guest.by_id(conn, request.source_vm_id).bind(
            partial(self._clone_of, conn, request=request, owner=owner)
        )

    def _clone_of(
        self, conn: VirConnect, source: Guest, request: CloneRequest, owner: OwnerMark
    ) -> Result[str, ProviderError]:
        host = self._host
        running = bool(source.dom.isActive())
        if request.linked and running:
            return Failure(
                ProviderError.failed_precondition(
                    "power the source off for a linked clone: its disks become backing files"
                )
            )
        source_xml = source.inactive_xml()
        facts = parse_domain(source_xml)
        own_media = frozenset(facts.metadata.volumes if facts.metadata else ())
        clone_uuid = str(uuid.uuid4())
        match _clone_seed(request, facts, clone_uuid, _carries_own_seed(source_xml, own_media)):
            case Failure() as failed:
                return failed
            case Success(seed):
                pass
        pools = [
            conn.storageVolLookupByPath(disk.path).storagePoolLookupByVolume()
            for disk in facts.disks
        ]
        planned = [
            planned_volume_path(pool, volume_name(request.target_name, index))
            for index, pool in enumerate(pools)
        ]
        # The seed sits beside the root disk, as Create's does.
        match Success(pools[0]) if pools else find_pool(conn, host.pools.default_pool, host.pools):
            case Failure() as failed:
                return failed
            case Success(seed_pool):
                pass
        seed_name = seed_volume_name(request.target_name)
        if seed is not None:
            planned.append(planned_volume_path(seed_pool, seed_name))
        metadata = VMMetadata(owner=owner, created_at=host.clock.now())
        building = DomainDefinition(
            name=request.target_name,
            domain_type=host.domain_type_of(conn),
            vcpus=facts.vcpus,
            max_vcpus=facts.vcpus,
            memory_mib=facts.memory_mib,
            max_memory_mib=0,
            firmware=Firmware.BIOS,  # a placeholder: the finished clone takes the source's
            secure_boot=False,
            disks=(),
            nics=(),
            metadata=replace(metadata, volumes=tuple(planned), building=True),
            uuid=clone_uuid,
        )
        match begin_building(conn, building):
            case Failure() as failed:
                return failed
            case Success(placeholder):
                pass
        made: list[str] = []

        def filled() -> Result[str, ProviderError]:
            match _disk_copies(
                conn, source, facts, request, running=running, clock=host.clock, made=made
            ):
                case Failure() as failed:
                    return failed
                case Success(copies):
                    pass
            seed_path = ""
            if seed is not None:
                match write_seed(conn, seed_pool, seed_name, build_seed(seed), host.write_volume):
                    case Failure() as failed:
                        return failed
                    case Success(seed_path):
                        made.append(seed_path)
            xml = cloned_domain(
                source_xml,
                name=request.target_name,
                vcpus=request.cpu,
                memory_mib=request.memory_mib,
                disk_paths=copies,
                metadata=metadata.with_volumes(tuple(made)),
                dropped_media=own_media,
                uuid=building.uuid,
                macs=tuple(nic.mac_address for nic in seed.networks) if seed else (),
                seed_path=seed_path,
            )
            return Success(str(conn.defineXML(xml).UUIDString()))

        def undo() -> None:
            for path in made:
                delete_volume(conn, path)
            abandon_building(placeholder)

        return undone_on_failure(filled, undo, raised=RAISED_BY_LIBVIRT)


def _disk_copies(
    conn: VirConnect,
    source: Guest,
    facts: DomainFacts,
    request: CloneRequest,
    *,
    running: bool,
    clock: Clock,
    made: list[str],
) -> Result[dict[str, str], ProviderError]:
    """The clone's volume of each of the source's disks, by the source disk's path; each one
    made is added to `made` at once, for the undoing of a failed clone."""
    copies: dict[str, str] = {}
    if running:
        match _copy_running_disks(conn, source, facts, request.target_name, clock):
            case Failure() as failed:
                return failed
            case Success(copies):
                made.extend(copies.values())
    for index, disk in enumerate(facts.disks if not copies else ()):
        name = volume_name(request.target_name, index)
        match _disk_copy(conn, disk.path, name, linked=request.linked, running=running):
            case Failure() as failed:
                return failed
            case Success(path):
                copies[disk.path] = path
                made.append(path)
    return Success(copies)


def _disk_copy(
    conn: VirConnect, path: str, name: str, *, linked: bool, running: bool
) -> Result[str, ProviderError]:
    """The clone's volume `name` of the source's disk at `path`: an overlay on it if `linked`."""
    if linked:
        backing = volume_facts(conn, path)
        if backing is None:
            return Failure(
                ProviderError.failed_precondition(f"disk {path!r} is not a storage-pool volume")
            )
        pool = conn.storageVolLookupByPath(path).storagePoolLookupByVolume()
        return Success(create_volume(pool, name, backing.capacity_bytes, backing))
    if running:
        return _copy_unlocked_disk(conn, path, name)
    return Success(copy_volume(conn, path, name))


def _carries_own_seed(xml: str, own_media: frozenset[str]) -> bool:
    """Whether a cdrom of the domain is one of its own volumes: the seed Create gave it."""
    root = ET.fromstring(xml)  # noqa: S314 - libvirt's own output
    return any(
        source.get("file", "") in own_media
        for source in root.iterfind("devices/disk[@device='cdrom']/source")
    )


def _clone_seed(
    request: CloneRequest, source: DomainFacts, clone_uuid: str, source_seeded: bool
) -> Result[SeedInput | None, ProviderError]:
    """The clone's own NoCloud seed, or None when neither the request nor the source has one.

    Its instance-id is the clone's UUID, so cloud-init runs again in the copied guest. The
    source's own seed is not carried over: its cloud-init already ran on the copied disk, and
    its static addresses and host name belong to the source. Customization networks address
    the clone's NICs by position (NICs keep their source's networks), each under a MAC chosen
    here that network-config matches; NICs past the list use DHCP.
    """
    wanted = request.customization or Customization()
    if not source_seeded and wanted == Customization():
        return Success(None)
    if len(wanted.networks) > len(source.nics):
        return Failure(
            ProviderError.invalid_spec(
                fields.customize_network(len(source.nics)),
                f"the source has {len(source.nics)} NIC(s), and a clone keeps its source's NICs",
            )
        )
    host = wanted.hostname or request.target_name
    padding = (NetworkAttachment(),) * (len(source.nics) - len(wanted.networks))
    seed = SeedInput(
        # cloud-init takes the host name from the first label and the FQDN from the whole.
        name=f"{host}.{wanted.domain}" if wanted.domain else host,
        instance_id=clone_uuid,
        user_data=wanted.user_data,
        networks=tuple(
            attachment.model_copy(update={"mac_address": random_mac()})
            for attachment in (*wanted.networks, *padding)
        ),
        vendor_data=time_zone_vendor_data(wanted.time_zone) if wanted.time_zone else b"",
    )
    return Success(seed)


def _copy_running_disks(
    conn: VirConnect, source: Guest, facts: DomainFacts, target_name: str, clock: Clock
) -> Result[dict[str, str], ProviderError]:
    """Copies of a running VM's disks from one point in time, by libvirt's backup job.

    QEMU holds a write lock on a running disk, so a plain volume copy cannot even open it.
    An empty answer means the driver has no backup job but no lock either (libvirt's test
    driver runs no guest): a plain copy is then consistent.
    """
    copies: dict[str, str] = {}

    def copied() -> Result[dict[str, str], ProviderError]:
        for index, disk in enumerate(facts.disks):
            volume = conn.storageVolLookupByPath(disk.path)
            copies[disk.path] = create_volume(
                volume.storagePoolLookupByVolume(),
                volume_name(target_name, index),
                int(volume.info()[1]),
            )
        source.dom.backupBegin(
            _backup_xml(facts, copies), None, libvirt.VIR_DOMAIN_BACKUP_BEGIN_REUSE_EXTERNAL
        )
        return Result.do(copies for _ in _wait_for_backup(source, clock))

    def removed() -> None:
        for path in copies.values():
            delete_volume(conn, path)

    made = or_none(partial(undone_on_failure, copied, removed), {libvirt.VIR_ERR_NO_SUPPORT})
    return Success({}) if made is None else made


def _copy_unlocked_disk(conn: VirConnect, path: str, name: str) -> Result[str, ProviderError]:
    """A running VM's disk copied as is, for drivers with no backup job; refused if locked."""

    def locked(error: libvirt.libvirtError) -> ProviderError:
        return ProviderError.failed_precondition(
            f"cannot copy disk {path!r} of the running source (this host has no backup job "
            f"and the disk is in use: {error.get_error_message()}); power the source off"
        )

    def copied() -> Result[str, ProviderError]:
        return Success(copy_volume(conn, path, name))

    return caught(copied, locked)


def _backup_xml(facts: DomainFacts, copies: dict[str, str]) -> str:
    root = ET.Element("domainbackup")
    disks = ET.SubElement(root, "disks")
    for disk in facts.disks:
        element = ET.SubElement(disks, "disk", {"name": disk.target, "type": "file"})
        ET.SubElement(element, "target", {"file": copies[disk.path]})
        ET.SubElement(element, "driver", {"type": "qcow2"})
    return ET.tostring(root, encoding="unicode")


def _wait_for_backup(source: Guest, clock: Clock) -> Result[None, ProviderError]:
    """Until the backup job ends (bounded, polled on `clock`); a job that fails or overruns
    is a Failure."""
    dom = source.dom
    deadline = clock.now() + BACKUP_TIMEOUT_SECONDS
    while dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE:
        if clock.now() > deadline:
            best_effort(dom.abortJob)
            return Failure(
                ProviderError.unavailable(
                    f"copying the disks of running VM {source.name!r} took over "
                    f"{BACKUP_TIMEOUT_SECONDS}s; aborted"
                )
            )
        clock.sleep(BACKUP_POLL_SECONDS)
    stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
    if not stats.get("success", False):
        message = stats.get("errmsg", "the backup job failed")
        return Failure(
            ProviderError.failed_precondition(
                f"could not copy the disks of running VM {source.name!r}: {message}"
            )
        )
    return Success(None)
