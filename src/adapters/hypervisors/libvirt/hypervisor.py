"""The libvirt adapter: every port, on one persistent libvirt connection.

The hypervisor is the only state: a VM is a persistent domain whose id is its UUID, and what
pyrigaud remembers about it sits in the domain's <metadata> (see metadata.py). libvirt errors
are raised inside and turned into Results at each port method's edge.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import secrets
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec, TypeVar

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.cloud_init import (
    SeedInput,
    build_seed,
    needs_seed,
    time_zone_vendor_data,
)
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection, VirConnect
from pyrigaud.adapters.hypervisors.libvirt.disk_transfer import (
    MIGRATION_STORAGE_ROOT,
    TRANSFER_FORMATS,
    PvcTransfers,
)
from pyrigaud.adapters.hypervisors.libvirt.domain_cache import (
    RUNNING_STATES,
    DomainCache,
    DomainView,
    ListedVM,
    listed_view,
    read_view,
)
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import (
    HOT_ADD_FACTOR,
    DiskDevice,
    DomainDefinition,
    DomainFacts,
    NicDevice,
    awaiting_power_cycle,
    cloned_domain,
    dimm_xml,
    disk_element,
    disk_target,
    parse_domain,
    render_domain,
    with_resources,
)
from pyrigaud.adapters.hypervisors.libvirt.download import (
    ChecksumMismatchError,
    Download,
    DownloadError,
    UnknownChecksumTypeError,
    UnusableImageError,
    checksum_algorithm,
    image_format_of,
    logged_progress,
    open_download,
    peek_header,
)
from pyrigaud.adapters.hypervisors.libvirt.errors import (
    CONNECTION_LOSS_CODES,
    AdapterError,
    error_code,
    is_missing,
    provider_error,
)
from pyrigaud.adapters.hypervisors.libvirt.host_capabilities import (
    check_firmware,
    default_machine_is_pcie,
    tpm_version_of,
)
from pyrigaud.adapters.hypervisors.libvirt.metadata import (
    NAMESPACE_PREFIX,
    NAMESPACE_URI,
    VMMetadata,
    metadata_from_text,
)
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    GIB,
    PoolSettings,
    VolumeFacts,
    VolumeWriter,
    copy_volume,
    copy_volume_into,
    create_volume,
    delete_volume,
    find_pool,
    find_volume,
    grow_volume,
    planned_volume_path,
    seed_volume_name,
    upload_volume,
    volume_facts,
    volume_name,
    volume_xml,
    volumes_by_path,
    write_new_volume,
)
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.addresses import routable_addresses
from pyrigaud.domain.bounds import DEFAULT_ROOT_DISK_GIB, MAX_CPU, MAX_MEMORY_MIB
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.image_urls import UnsafeImageURLError, parse_image_url
from pyrigaud.domain.models import (
    Capabilities,
    CloneRequest,
    CreateRequest,
    Customization,
    DiskDetails,
    DiskInfo,
    DiskQuery,
    ExportRequest,
    ExportResult,
    Firmware,
    HealthReport,
    ImportRequest,
    ImportResult,
    NetworkAttachment,
    NetworkInfo,
    OwnerMark,
    PreparedImage,
    PrepareImageRequest,
    Snapshot,
    SnapshotRequest,
    VMChanges,
    VMDescription,
    VMImage,
    VMInfo,
    VMRecord,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskState

T = TypeVar("T")
P = ParamSpec("P")
VirDomain = Any

logger = logging.getLogger(__name__)

LIBVIRT_CAPABILITIES = Capabilities(
    supports_reconfigure_online=True,
    supports_disk_expansion_online=True,
    supports_snapshots=True,
    supports_memory_snapshots=True,
    supports_linked_clones=True,
    supports_image_import=True,  # from a pool volume, a local file, or an http(s) URL
    supported_disk_types=("qcow2",),
    supported_network_types=("network", "bridge", "user"),
    supports_clone=True,
    supports_hardware_upgrade=False,  # a machine-type bump is not a meaningful upgrade
    # Streamed between libvirt and files on a mounted PVC (disk_transfer.py); a powered-off VM.
    supports_disk_export=True,
    supports_disk_import=True,
    supported_export_formats=TRANSFER_FORMATS,
    supported_import_formats=TRANSFER_FORMATS,
    supported_export_backends=("pvc",),
    supported_import_backends=("pvc",),
    supported_transfer_modes=("auto",),
)

STATE_NAMES = {
    libvirt.VIR_DOMAIN_NOSTATE: "no state",
    libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "blocked",
    libvirt.VIR_DOMAIN_PAUSED: "paused",
    libvirt.VIR_DOMAIN_SHUTDOWN: "shutting down",
    libvirt.VIR_DOMAIN_SHUTOFF: "shut off",
    libvirt.VIR_DOMAIN_CRASHED: "crashed",
    libvirt.VIR_DOMAIN_PMSUSPENDED: "suspended",
}
ADDRESS_SOURCES = (
    libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
    libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
)
# A driver that cannot do the asked variant of a call answers with one of these.
REFUSED_VARIANT_CODES = frozenset(
    {
        libvirt.VIR_ERR_INVALID_ARG,
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
        libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
        libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
        libvirt.VIR_ERR_OPERATION_INVALID,
    }
)
# Raw keys that VMInfo's own fields already carry: left out of its provider_raw, so that a
# ListVMs of 10,000 VMs fits the manager's 4 MiB message limit.
IN_VMINFO = frozenset({"id", "name", "cpu", "memory_mib"})
IMAGE_FORMATS = frozenset({"qcow2", "raw"})
UNSPECIFIED_FORMATS = frozenset({"", "template"})
VOLUME_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
FILE_CHUNK_BYTES = 1024 * 1024
QEMU_MAC_PREFIX = "52:54:00"
SHUTDOWN_REQUEST_ATTEMPTS = 2
SHUTDOWN_RETRY_SECONDS = 0.5
BACKUP_POLL_SECONDS = 0.05
BACKUP_TIMEOUT_SECONDS = 3600  # bounded, yet room for copying a large disk


@dataclass(frozen=True)
class _ImageFields:
    """The request fields an image's problems are named by: ImagePrepare sends the CRD's
    camelCase keys, Create the VMImage's PascalCase ones."""

    url: str
    checksum: str
    checksum_type: str
    format: str


PREPARE_FIELDS = _ImageFields(
    "image_json.url", "image_json.checksum", "image_json.checksumType", "image_json.format"
)
CREATE_FIELDS = _ImageFields(
    "image_json.URL", "image_json.Checksum", "image_json.ChecksumType", "image_json.Format"
)


@dataclass(frozen=True)
class _RootPlan:
    """How Create makes the root volume: its capacity and where its content comes from."""

    capacity_bytes: int  # a URL image larger than this keeps its own size
    backing: VolumeFacts | None = None  # a Path image: the volume the qcow2 overlay sits on
    url_image: VMImage | None = None  # a URL image, downloaded into the VM's own volume
    scratch_name: str = ""  # where a raw URL image lands before its conversion to qcow2


@contextlib.contextmanager
def _image_spec_errors(fields: _ImageFields) -> Iterator[None]:
    """What the download module raises, as the error naming the request field at fault."""
    try:
        yield
    except UnsafeImageURLError as error:
        raise AdapterError(ProviderError.invalid_spec(fields.url, str(error))) from error
    except UnknownChecksumTypeError as error:
        raise AdapterError(ProviderError.invalid_spec(fields.checksum_type, str(error))) from error
    except ChecksumMismatchError as error:
        raise AdapterError(ProviderError.invalid_spec(fields.checksum, str(error))) from error
    except UnusableImageError as error:
        raise AdapterError(ProviderError.invalid_spec(fields.url, str(error))) from error
    except DownloadError as error:
        raise AdapterError(ProviderError.unavailable(str(error))) from error


def _rereads_vm(
    mutation: Callable[Concatenate[LibvirtHypervisor, str, P], T],
) -> Callable[Concatenate[LibvirtHypervisor, str, P], T]:
    """A mutation of the VM named by its first argument: however it ends, Describe and
    ListVMs on this replica read the VM afresh afterwards (read your writes)."""

    @functools.wraps(mutation)
    def mutate(self: LibvirtHypervisor, vm_id: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return mutation(self, vm_id, *args, **kwargs)
        finally:
            self._domains.forget(vm_id)

    return mutate


def _rereads_new_vm(
    making: Callable[Concatenate[LibvirtHypervisor, P], Result[str, ProviderError]],
) -> Callable[Concatenate[LibvirtHypervisor, P], Result[str, ProviderError]]:
    """Create and Clone: the VM they made (or adopted, or finished) is read afresh."""

    @functools.wraps(making)
    def make(
        self: LibvirtHypervisor, /, *args: P.args, **kwargs: P.kwargs
    ) -> Result[str, ProviderError]:
        made = making(self, *args, **kwargs)
        if isinstance(made, Success):
            self._domains.forget(made.unwrap())
        return made

    return make


class LibvirtHypervisor:
    """Implements every port, thread-safe; the only state it keeps is a cache of what libvirt
    says (domain_cache.py), kept current by libvirt's events and by its own writes.
    """

    def __init__(
        self,
        connection: LibvirtConnection,
        clock: Clock,
        *,
        domain_type: str = "kvm",
        pools: PoolSettings | None = None,
        allow_loopback_urls: bool = False,
        volume_writer: VolumeWriter = upload_volume,
        migration_storage_root: str = MIGRATION_STORAGE_ROOT,
    ) -> None:
        """`volume_writer` puts bytes into a volume: a libvirt stream unless a test says else;
        `migration_storage_root` is where the PVCs of pvc:// URLs are mounted."""
        self._connection = connection
        self._clock = clock
        self._domain_type = domain_type
        self._pools = pools or PoolSettings()
        self._allow_loopback_urls = allow_loopback_urls
        self._write_volume = volume_writer
        self._transfers = PvcTransfers(migration_storage_root, self._pools, volume_writer)
        self._domains = DomainCache(
            _addresses, warm_up=lambda conn: self._list(conn, warm_up_only=True)
        )
        connection.on_close(self._domains.detach)
        # One listing at a time (the cache's warm-up is one): a second would redo the same reads.
        self._listing = threading.Lock()
        # What the last listing answered per VM, reused while its inputs are the same objects.
        self._listed: dict[str, ListedVM] = {}

    # --- VMLifecycle --------------------------------------------------------------------------

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        def find(conn: VirConnect) -> VMRecord | None:
            dom = _by_name(conn, name)
            return None if dom is None else _record(dom, _facts(dom))

        return self._run(f"find VM {name!r}", find)

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        def unfinished(conn: VirConnect) -> list[VMRecord]:
            found = []
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_PERSISTENT):
                facts = _facts(dom)
                if facts.metadata is not None and facts.metadata.building:
                    found.append(_record(dom, facts))
            return found

        return self._run("find unfinished VMs", unfinished)

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Made within the call: no task."""
        return self.create(request, owner).map(lambda vm_id: CreatedVM(id=vm_id))

    @_rereads_new_vm
    def create(self, request: CreateRequest, owner: OwnerMark) -> Result[str, ProviderError]:
        return self._run(
            f"create VM {request.name!r}", lambda conn: self._create(conn, request, owner)
        )

    @_rereads_vm
    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        def delete(conn: VirConnect) -> None:
            dom = _by_id(conn, vm_id)
            metadata = _facts(dom).metadata
            if dom.isActive():
                dom.destroy()
            _undefine(dom)
            for path in metadata.volumes if metadata else ():
                delete_volume(conn, path)

        return self._run(f"delete VM {vm_id!r}", delete)

    @_rereads_vm
    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[None, ProviderError]:
        return self._run(
            f"reconfigure VM {vm_id!r}", lambda conn: self._reconfigure(conn, vm_id, changes)
        )

    def upgrade_hardware(self, vm_id: str, target_version: int) -> Result[None, ProviderError]:
        return Failure(
            ProviderError.unsupported("libvirt VMs have no virtual hardware version to raise")
        )

    # --- PowerControl -------------------------------------------------------------------------

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        return self._run(
            f"read power state of {vm_id!r}", lambda conn: _power(_state(_by_id(conn, vm_id)))
        )

    @_rereads_vm
    def power_on(self, vm_id: str) -> Result[None, ProviderError]:
        return self._run(f"power on {vm_id!r}", lambda conn: _start(_by_id(conn, vm_id)))

    @_rereads_vm
    def power_off(self, vm_id: str) -> Result[None, ProviderError]:
        def power_off(conn: VirConnect) -> None:
            dom = _by_id(conn, vm_id)
            if dom.isActive():
                dom.destroy()

        return self._run(f"power off {vm_id!r}", power_off)

    @_rereads_vm
    def reboot(self, vm_id: str) -> Result[None, ProviderError]:
        def reboot(conn: VirConnect) -> None:
            dom = _by_id(conn, vm_id)
            if _state(dom) not in RUNNING_STATES:
                _start(dom)
                return
            try:
                dom.reboot(0)
            except libvirt.libvirtError as error:
                if error_code(error) not in REFUSED_VARIANT_CODES:
                    raise
                dom.reset(0)  # no ACPI / agent in the guest: a reset is the fallback

        return self._run(f"reboot {vm_id!r}", reboot)

    @_rereads_vm
    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        def request(conn: VirConnect) -> None:
            dom = _by_id(conn, vm_id)
            _ask_to_shut_down(dom)
            _write_metadata(dom, _own_metadata(dom).with_shutdown_deadline(deadline))

        return self._run(f"shut down {vm_id!r}", request)

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        def deadline(conn: VirConnect) -> int | None:
            metadata = read_metadata(_by_id(conn, vm_id))
            return metadata.shutdown_deadline if metadata else None

        return self._run(f"read shutdown deadline of {vm_id!r}", deadline)

    @_rereads_vm
    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        def clear(conn: VirConnect) -> None:
            dom = _by_id(conn, vm_id)
            metadata = _facts(dom).metadata
            if metadata is not None and metadata.shutdown_deadline is not None:
                _write_metadata(dom, metadata.with_shutdown_deadline(None))

        return self._run(f"clear shutdown deadline of {vm_id!r}", clear)

    # --- Inventory ----------------------------------------------------------------------------

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        """From the cache when it holds the VM (no libvirt call at all), else read and kept."""

        def describe(conn: VirConnect) -> VMDescription | None:
            self._domains.attach(conn)
            view, dom = self._domains.view(vm_id), None
            if view is None or view.live is None:
                dom = _lookup(conn, vm_id)
                if dom is None:
                    return None
                with self._domains.loading() as load:
                    view = read_view(dom)
                    load.keep_view(str(dom.UUIDString()), view)
            live = view.live or view.facts
            return VMDescription(
                power_state=_power(view.state),
                ips=self._last_addresses(conn, view, dom),
                console_url=f"vnc://127.0.0.1:{live.vnc_port}" if live.vnc_port else "",
                raw=_raw(view.facts.uuid, live, view.state, persistent=view.facts),
            )

        return self._run(f"describe {vm_id!r}", describe)

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        """Read from libvirt, never the cache: Reconfigure decides from it what to change."""

        def info(conn: VirConnect) -> VMInfo | None:
            self._domains.attach(conn)
            dom = _lookup(conn, vm_id)
            if dom is None:
                return None
            with self._domains.loading() as load:
                view = read_view(dom, with_live=False)
                load.keep_view(str(dom.UUIDString()), view)
            ips = (self._domains.addresses(view.facts.uuid) or ()) if view.running else ()
            return _info(
                view.facts.uuid, view.facts, view.state, ips, lambda path: volume_facts(conn, path)
            )

        return self._run(f"read VM {vm_id!r}", info)

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        """Bulk calls for the domains, their states and the volumes; per domain at most its XML.

        On a remote libvirtd every per-domain call is a socket round trip, so states come
        from one stats call and disk sizes from one volume listing per pool; definitions come
        from the cache, read only for domains it does not hold. Addresses are the last known.
        """
        return self._run("list VMs", self._list)

    def _list(self, conn: VirConnect, *, warm_up_only: bool = False) -> list[VMInfo]:
        """`warm_up_only`: the cache's own listing, not needed once another one has run."""
        self._domains.attach(conn)
        with self._listing:
            if not self._domains.claim_warm_up(conn) and warm_up_only:
                return []
            return self._list_locked(conn)

    def _list_locked(self, conn: VirConnect) -> list[VMInfo]:
        with self._domains.loading() as load:
            domains = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_PERSISTENT)
            states = (
                conn.domainListGetStats(domains, libvirt.VIR_DOMAIN_STATS_STATE) if domains else []
            )
            volumes = volumes_by_path(conn) if domains else {}
            before, now = self._listed, {}
            for dom, stats in states:
                vm_id = str(dom.UUIDString())
                state = int(stats["state.state"])
                view = self._domains.view(vm_id)
                if view is None:
                    view = listed_view(state, _facts(dom))
                    load.keep_view(vm_id, view)
                running = state in RUNNING_STATES
                ips = (self._domains.addresses(vm_id) or ()) if running else ()
                disks = tuple(volumes.get(disk.path) for disk in view.facts.disks)
                listed = before.get(vm_id)
                if listed is None or not listed.still(view.facts, state, ips, disks):
                    info = _info(vm_id, view.facts, state, ips, volumes.get)
                    listed = ListedVM(view.facts, state, ips, disks, info)
                now[vm_id] = listed
            self._listed = now  # only the current domains: bounded by the host
            load.keep_addresses_of(set(now))
        return [listed.info for listed in now.values()]

    def _last_addresses(
        self, conn: VirConnect, view: DomainView, dom: VirDomain | None
    ) -> tuple[str, ...]:
        """The guest's last known addresses; read now only if never read since it started."""
        if not view.running:
            return ()
        known = self._domains.addresses(view.facts.uuid)
        if known is not None:
            return known
        dom = dom or _lookup(conn, view.facts.uuid)
        return self._domains.read_addresses(view.facts.uuid, dom) if dom is not None else ()

    # --- Snapshots ----------------------------------------------------------------------------

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        return self._run(
            f"snapshot {request.vm_id!r}", lambda conn: _create_snapshot(conn, request)
        )

    def delete_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def delete(conn: VirConnect) -> None:
            _snapshot(_by_id(conn, vm_id), snapshot_id).delete(0)

        return self._run(f"delete snapshot {snapshot_id!r} of {vm_id!r}", delete)

    @_rereads_vm
    def revert_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def revert(conn: VirConnect) -> None:
            dom = _by_id(conn, vm_id)
            dom.revertToSnapshot(_snapshot(dom, snapshot_id), 0)

        return self._run(f"revert {vm_id!r} to snapshot {snapshot_id!r}", revert)

    # --- Cloning ------------------------------------------------------------------------------

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Made within the call: no task."""
        return self.clone(request, owner).map(lambda vm_id: CreatedVM(id=vm_id))

    @_rereads_new_vm
    def clone(self, request: CloneRequest, owner: OwnerMark) -> Result[str, ProviderError]:
        return self._run(
            f"clone {request.source_vm_id!r} to {request.target_name!r}",
            lambda conn: self._clone(conn, request, owner),
        )

    # --- Images and DiskTransfer --------------------------------------------------------------

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        return self._run(
            f"prepare image {request.target_name!r}",
            lambda conn: self._prepare_image(conn, request),
        )

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        return self._run(
            f"export disk of {request.vm_id!r}",
            lambda conn: self._transfers.export_disk(conn, _by_id(conn, request.vm_id), request),
        )

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        return self._run(
            "import disk",  # the URL is not echoed before it is checked
            lambda conn: self._transfers.import_disk(conn, request),
        )

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self._run(f"read disk of {query.vm_id!r}", lambda conn: _disk_details(conn, query))

    # --- Health, CapabilitySource, TaskTracker ------------------------------------------------

    def check(self) -> HealthReport:
        """One local call; it also subscribes to the events on a new connection."""

        def version_of(conn: VirConnect) -> int:
            self._domains.attach(conn)
            return int(conn.getLibVersion())

        try:
            version = self._connection.call(version_of)
        except Exception as error:
            return HealthReport(ok=False, message=f"libvirt at {self._connection.uri}: {error}")
        major, minor = version // 1_000_000, version // 1000 % 1000
        return HealthReport(ok=True, message=f"libvirt {major}.{minor} at {self._connection.uri}")

    def capabilities(self) -> Capabilities:
        return LIBVIRT_CAPABILITIES

    def task_state(self, task_id: str) -> TaskState | None:
        """libvirt has no native tasks: every operation here completes synchronously."""
        return None

    # --- internals ----------------------------------------------------------------------------

    def _run(self, doing: str, action: Callable[[VirConnect], T]) -> Result[T, ProviderError]:
        """The edge: libvirt exceptions and adapter failures become Failure values."""
        try:
            return Success(self._connection.call(action))
        except AdapterError as failure:
            return Failure(failure.error)
        except libvirt.libvirtError as error:
            return Failure(provider_error(error, doing))

    def _create(self, conn: VirConnect, request: CreateRequest, owner: OwnerMark) -> str:
        """Define the domain marked as building first, then make its volumes, then finish it.

        The building domain records every volume it is about to get, so a process killed at
        any point leaves one owner-marked, time-stamped domain that Delete removes whole.
        """
        existing = _by_name(conn, request.name)
        if existing is not None:
            return _adopt(existing, owner)
        check_firmware(conn, request.vm_class, self._domain_type)
        pool = find_pool(conn, request.placement.datastore or self._pools.default_pool, self._pools)
        # No networks asked for still gets one user-mode NIC: a VM nobody can reach is no use.
        attachments = request.networks or (NetworkAttachment(),)
        seeded = needs_seed(request.user_data, request.meta_data, attachments)
        if seeded:
            attachments = _with_macs(attachments)  # network-config matches NICs by MAC
        nics = tuple(_nic(conn, index, attachment) for index, attachment in enumerate(attachments))
        root = _root_disk(conn, request)
        sizes = [root.capacity_bytes] + [spec.size_gib * GIB for spec in request.disks]
        names = [volume_name(request.name, index) for index in range(len(sizes))]
        seed_name = seed_volume_name(request.name)
        planned = [*names, *([root.scratch_name] if root.scratch_name else [])]
        planned += [seed_name] if seeded else []
        building = DomainDefinition(
            name=request.name,
            domain_type=self._domain_type,
            vcpus=request.vm_class.cpu,
            max_vcpus=min(MAX_CPU, request.vm_class.cpu * HOT_ADD_FACTOR)
            if request.vm_class.performance.cpu_hot_add
            else request.vm_class.cpu,
            memory_mib=request.vm_class.memory_mib,
            max_memory_mib=min(MAX_MEMORY_MIB, request.vm_class.memory_mib * HOT_ADD_FACTOR)
            if request.vm_class.performance.memory_hot_add
            else 0,
            firmware=request.vm_class.firmware,
            secure_boot=request.vm_class.security.secure_boot,
            tpm_version=tpm_version_of(request.vm_class),
            disks=(),
            nics=(),
            metadata=VMMetadata(
                owner=owner,
                created_at=self._clock.now(),
                tags=request.tags,
                volumes=tuple(planned_volume_path(pool, name) for name in planned),
                building=True,
            ),
            uuid=str(uuid.uuid4()),
            pcie=default_machine_is_pcie(conn, self._domain_type),
        )
        dom = _begin_building(conn, building, owner)
        if isinstance(dom, str):
            return dom
        made: list[str] = []
        try:
            disks = []
            for index, (name, size) in enumerate(zip(names, sizes, strict=True)):
                if index == 0 and root.url_image is not None:
                    made.append(self._download_root(conn, pool, name, root.url_image, root))
                else:
                    backing = root.backing if index == 0 else None
                    made.append(create_volume(pool, name, size, backing))
                disks.append(DiskDevice(path=made[-1], format="qcow2", target=disk_target(index)))
            seed_path = ""
            if seeded:
                seed = SeedInput(
                    name=request.name,
                    instance_id=building.uuid,
                    user_data=request.user_data,
                    meta_data=request.meta_data,
                    networks=attachments,
                )
                seed_path = self._write_seed(conn, pool, seed_name, build_seed(seed))
                made.append(seed_path)
            complete = replace(
                building,
                disks=tuple(disks),
                nics=nics,
                seed_path=seed_path,
                metadata=building.metadata.with_volumes(tuple(made)).finished(),
            )
            return str(conn.defineXML(render_domain(complete)).UUIDString())
        except (libvirt.libvirtError, AdapterError):
            for path in made:  # only what this call made: a clashing volume is not ours
                delete_volume(conn, path)
            _abandon_building(dom)
            raise

    def _write_seed(self, conn: VirConnect, pool: Any, name: str, iso: bytes) -> str:
        xml = volume_xml(name, len(iso), volume_format="raw")
        try:
            return write_new_volume(conn, pool, xml, (iso,), self._write_volume)
        except libvirt.libvirtError as error:
            if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
                raise
            raise AdapterError(
                ProviderError.unsupported(
                    "this libvirt driver cannot upload volumes (virStorageVolUpload), so it "
                    "cannot carry the cloud-init seed that user_data, meta_data or static "
                    "addressing need"
                )
            ) from error

    def _prepare_image(self, conn: VirConnect, request: PrepareImageRequest) -> PreparedImage:
        source = request.source
        if source.template_name or source.content_library:
            raise AdapterError(
                ProviderError.invalid_spec(
                    "image_json.templateName", "libvirt has no templates; give a path or url"
                )
            )
        if not VOLUME_NAME_PATTERN.fullmatch(request.target_name):
            raise AdapterError(
                ProviderError.invalid_spec(
                    "target_name", "must be letters, digits, '.', '_' or '-' (at most 200)"
                )
            )
        origin = volume_facts(conn, source.path) if source.path else None
        image_format = _image_format(source.format, origin, source.url)
        pool_name = request.storage_hint or source.storage_pool or self._pools.default_pool
        field = "storage_hint" if request.storage_hint else "image_json.storagePool"
        pool = find_pool(conn, pool_name, self._pools, field)
        name = f"{request.target_name}.{image_format}"
        existing = find_volume(pool, name)
        if existing is not None:
            return PreparedImage(id=request.target_name, path=existing)
        if origin is not None:
            path = copy_volume_into(conn, pool, origin.path, name)
        elif source.path:
            path = self._import_file(conn, pool, name, image_format, source.path)
        else:
            path = self._import_url(conn, pool, name, image_format, request)
        return PreparedImage(id=request.target_name, path=path)

    def _import_file(
        self, conn: VirConnect, pool: Any, name: str, image_format: str, file_path: str
    ) -> str:
        if not os.path.isabs(file_path) or not os.path.isfile(file_path):
            raise AdapterError(
                ProviderError.invalid_spec(
                    "image_json.path",
                    f"{file_path!r} is neither a volume in a storage pool nor a file on this host",
                )
            )
        xml = volume_xml(name, os.path.getsize(file_path), volume_format=image_format)
        return self._upload_or_refuse(
            lambda: write_new_volume(conn, pool, xml, _file_chunks(file_path), self._write_volume)
        )

    def _import_url(
        self,
        conn: VirConnect,
        pool: Any,
        name: str,
        image_format: str,
        request: PrepareImageRequest,
    ) -> str:
        source = request.source
        download = self._open_image_url(
            source.url, source.checksum, source.checksum_type, PREPARE_FIELDS
        )
        with contextlib.closing(download):
            # Checked before a byte is stored: a qcow2 naming a backing file would hand a host
            # file to every VM made from this image.
            with _image_spec_errors(PREPARE_FIELDS):
                header, body = peek_header(download.chunks)
                _downloaded_format(image_format, header, PREPARE_FIELDS)
            xml = volume_xml(name, download.length or 0, volume_format=image_format)
            label = f"image {request.target_name!r}"
            return self._write_download(
                conn, pool, xml, download, fields=PREPARE_FIELDS, label=label, body=body
            )

    def _open_image_url(
        self, url: str, checksum: str, checksum_type: str, fields: _ImageFields
    ) -> Download:
        """The image's response, its headers read; a bad spec is named by `fields`."""
        with _image_spec_errors(fields):
            return open_download(
                url,
                checksum=checksum,
                checksum_type=checksum_type,
                allow_loopback=self._allow_loopback_urls,
            )

    def _write_download(
        self,
        conn: VirConnect,
        pool: Any,
        xml: str,
        download: Download,
        *,
        fields: _ImageFields,
        label: str,
        body: Iterator[bytes] | None = None,
    ) -> str:
        """A new volume holding the downloaded image (`body`, if some was already read, else
        the download's chunks), its checksum verified; on any failure, no volume."""
        chunks = logged_progress(body or download.chunks, label, download.length)
        with _image_spec_errors(fields):
            return self._upload_or_refuse(
                lambda: write_new_volume(conn, pool, xml, chunks, self._write_volume)
            )

    def _download_root(
        self, conn: VirConnect, pool: Any, name: str, image: VMImage, root: _RootPlan
    ) -> str:
        """The VM's own qcow2 root volume `name` from a URL image: never a file another VM
        shares, never a backing chain. A qcow2 image is downloaded straight into it, a raw one
        into the scratch volume and converted (libvirt converts only from volume to volume);
        then it is grown to the class's size. On any failure, neither volume is left."""
        download = self._open_image_url(
            image.url, image.checksum, image.checksum_type, CREATE_FIELDS
        )
        with contextlib.closing(download):
            with _image_spec_errors(CREATE_FIELDS):
                header, body = peek_header(download.chunks)
                image_format = _downloaded_format(image.format, header, CREATE_FIELDS)
            # Declared raw at its exact length: libvirt reads what the bytes are on refresh.
            target = name if image_format == "qcow2" else root.scratch_name
            xml = volume_xml(target, download.length or 0, volume_format="raw")
            label = f"root volume {name!r}"
            written = self._write_download(
                conn, pool, xml, download, fields=CREATE_FIELDS, label=label, body=body
            )
        path = written if image_format == "qcow2" else ""
        try:
            _check_stored_format(conn, written, image_format)
            path = path or copy_volume(conn, written, name)
            current = volume_facts(conn, path)
            if current is not None and current.capacity_bytes < root.capacity_bytes:
                grow_volume(conn, path, root.capacity_bytes)
        except BaseException:
            if path:
                delete_volume(conn, path)
            raise
        finally:
            if written != path:
                delete_volume(conn, written)
        return path

    @staticmethod
    def _upload_or_refuse(upload: Callable[[], str]) -> str:
        try:
            return upload()
        except libvirt.libvirtError as error:
            if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
                raise
            raise AdapterError(
                ProviderError.unsupported(
                    "this libvirt driver cannot upload volumes (virStorageVolUpload): import "
                    "the image from a volume already in a storage pool"
                )
            ) from error

    def _reconfigure(self, conn: VirConnect, vm_id: str, changes: VMChanges) -> None:
        dom = _by_id(conn, vm_id)
        facts = _facts(dom)
        running = _state(dom) in RUNNING_STATES
        wanted = [changes.root_disk_gib, *(spec.size_gib for spec in changes.disks)]
        for index, size_gib in enumerate(wanted):
            if size_gib is None or size_gib <= 0:
                continue
            if index < len(facts.disks):
                _grow_disk(conn, dom, facts.disks[index], size_gib * GIB, running)
            else:
                _attach_new_disk(conn, dom, facts, index, size_gib * GIB)
                facts = _facts(dom)
        if changes.cpu is None and changes.memory_mib is None:
            return
        inactive = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        # Live first, the definition last: its event tells every replica's cache to reread.
        waiting = _apply_live(dom, changes) if running else []
        try:
            conn.defineXML(with_resources(inactive, changes.cpu, changes.memory_mib))
        except libvirt.libvirtError as error:
            if not waiting or error_code(error) not in REFUSED_VARIANT_CODES:
                raise
            raise AdapterError(
                ProviderError.failed_precondition(
                    f"{_blockers(waiting)} (the next boot's configuration was refused too: "
                    f"{error.get_error_message()})"
                )
            ) from error
        if waiting:
            logger.info("VM %s waits for a power cycle: %s", facts.name, _blockers(waiting))

    def _clone(self, conn: VirConnect, request: CloneRequest, owner: OwnerMark) -> str:
        source = _by_id(conn, request.source_vm_id)
        existing = _by_name(conn, request.target_name)
        if existing is not None:
            return _adopt(existing, owner)
        running = bool(source.isActive())
        if request.linked and running:
            raise AdapterError(
                ProviderError.failed_precondition(
                    "power the source off for a linked clone: its disks become backing files"
                )
            )
        source_xml = source.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        facts = parse_domain(source_xml)
        own_media = frozenset(facts.metadata.volumes if facts.metadata else ())
        clone_uuid = str(uuid.uuid4())
        seed = _clone_seed(request, facts, clone_uuid, _carries_own_seed(source_xml, own_media))
        pools = [
            conn.storageVolLookupByPath(disk.path).storagePoolLookupByVolume()
            for disk in facts.disks
        ]
        planned = [
            planned_volume_path(pool, volume_name(request.target_name, index))
            for index, pool in enumerate(pools)
        ]
        # The seed sits beside the root disk, as Create's does.
        seed_pool = pools[0] if pools else find_pool(conn, self._pools.default_pool, self._pools)
        seed_name = seed_volume_name(request.target_name)
        if seed is not None:
            planned.append(planned_volume_path(seed_pool, seed_name))
        metadata = VMMetadata(owner=owner, created_at=self._clock.now())
        building = DomainDefinition(
            name=request.target_name,
            domain_type=self._domain_type,
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
        dom = _begin_building(conn, building, owner)
        if isinstance(dom, str):
            return dom
        copies: dict[str, str] = {}
        seed_path = ""
        try:
            if running:
                copies = _copy_running_disks(conn, source, facts, request.target_name)
                for path in copies.values():
                    metadata = metadata.with_volume(path)
            for index, disk in enumerate(facts.disks if not copies else ()):
                name = volume_name(request.target_name, index)
                if request.linked:
                    backing = volume_facts(conn, disk.path)
                    if backing is None:
                        raise AdapterError(
                            ProviderError.failed_precondition(
                                f"disk {disk.path!r} is not a storage-pool volume"
                            )
                        )
                    pool = conn.storageVolLookupByPath(disk.path).storagePoolLookupByVolume()
                    path = create_volume(pool, name, backing.capacity_bytes, backing)
                elif running:
                    path = _copy_unlocked_disk(conn, disk.path, name)
                else:
                    path = copy_volume(conn, disk.path, name)
                copies[disk.path] = path
                metadata = metadata.with_volume(path)
            if seed is not None:
                seed_path = self._write_seed(conn, seed_pool, seed_name, build_seed(seed))
                metadata = metadata.with_volume(seed_path)
            xml = cloned_domain(
                source_xml,
                name=request.target_name,
                vcpus=request.cpu,
                memory_mib=request.memory_mib,
                disk_paths=copies,
                metadata=metadata,
                dropped_media=own_media,
                uuid=building.uuid,
                macs=tuple(nic.mac_address for nic in seed.networks) if seed else (),
                seed_path=seed_path,
            )
            return str(conn.defineXML(xml).UUIDString())
        except (libvirt.libvirtError, AdapterError):
            for path in (*copies.values(), seed_path):
                if path:
                    delete_volume(conn, path)
            _abandon_building(dom)
            raise


def _carries_own_seed(xml: str, own_media: frozenset[str]) -> bool:
    """Whether a cdrom of the domain is one of its own volumes: the seed Create gave it."""
    root = ET.fromstring(xml)  # noqa: S314 - libvirt's own output
    return any(
        source.get("file", "") in own_media
        for source in root.iterfind("devices/disk[@device='cdrom']/source")
    )


def _clone_seed(
    request: CloneRequest, source: DomainFacts, clone_uuid: str, source_seeded: bool
) -> SeedInput | None:
    """The clone's own NoCloud seed, or None when neither the request nor the source has one.

    Its instance-id is the clone's UUID, so cloud-init runs again in the copied guest. The
    source's own seed is not carried over: its cloud-init already ran on the copied disk, and
    its static addresses and host name belong to the source. Customization networks address
    the clone's NICs by position (NICs keep their source's networks), each under a MAC chosen
    here that network-config matches; NICs past the list use DHCP.
    """
    wanted = request.customization or Customization()
    if not source_seeded and wanted == Customization():
        return None
    if len(wanted.networks) > len(source.nics):
        raise AdapterError(
            ProviderError.invalid_spec(
                f"customization.networks[{len(source.nics)}]",
                f"the source has {len(source.nics)} NIC(s), and a clone keeps its source's NICs",
            )
        )
    host = wanted.hostname or request.target_name
    padding = (NetworkAttachment(),) * (len(source.nics) - len(wanted.networks))
    return SeedInput(
        # cloud-init takes the host name from the first label and the FQDN from the whole.
        name=f"{host}.{wanted.domain}" if wanted.domain else host,
        instance_id=clone_uuid,
        user_data=wanted.user_data,
        networks=tuple(
            attachment.model_copy(update={"mac_address": _random_mac()})
            for attachment in (*wanted.networks, *padding)
        ),
        vendor_data=time_zone_vendor_data(wanted.time_zone) if wanted.time_zone else b"",
    )


def _copy_running_disks(
    conn: VirConnect, dom: VirDomain, facts: DomainFacts, target_name: str
) -> dict[str, str]:
    """Copies of a running VM's disks from one point in time, by libvirt's backup job.

    QEMU holds a write lock on a running disk, so a plain volume copy cannot even open it.
    An empty answer means the driver has no backup job but no lock either (libvirt's test
    driver runs no guest): a plain copy is then consistent.
    """
    copies: dict[str, str] = {}
    try:
        for index, disk in enumerate(facts.disks):
            volume = conn.storageVolLookupByPath(disk.path)
            copies[disk.path] = create_volume(
                volume.storagePoolLookupByVolume(),
                volume_name(target_name, index),
                int(volume.info()[1]),
            )
        dom.backupBegin(
            _backup_xml(facts, copies), None, libvirt.VIR_DOMAIN_BACKUP_BEGIN_REUSE_EXTERNAL
        )
        _wait_for_backup(dom)
    except libvirt.libvirtError as error:
        for path in copies.values():
            delete_volume(conn, path)
        if error_code(error) == libvirt.VIR_ERR_NO_SUPPORT:
            return {}
        raise
    except BaseException:
        for path in copies.values():
            delete_volume(conn, path)
        raise
    return copies


def _copy_unlocked_disk(conn: VirConnect, path: str, name: str) -> str:
    """A running VM's disk copied as is, for drivers with no backup job; refused if locked."""
    try:
        return copy_volume(conn, path, name)
    except libvirt.libvirtError as error:
        raise AdapterError(
            ProviderError.failed_precondition(
                f"cannot copy disk {path!r} of the running source (this host has no backup job "
                f"and the disk is in use: {error.get_error_message()}); power the source off"
            )
        ) from error


def _backup_xml(facts: DomainFacts, copies: dict[str, str]) -> str:
    root = ET.Element("domainbackup")
    disks = ET.SubElement(root, "disks")
    for disk in facts.disks:
        element = ET.SubElement(disks, "disk", {"name": disk.target, "type": "file"})
        ET.SubElement(element, "target", {"file": copies[disk.path]})
        ET.SubElement(element, "driver", {"type": "qcow2"})
    return ET.tostring(root, encoding="unicode")


def _wait_for_backup(dom: VirDomain) -> None:
    """Until the backup job ends (bounded); a job that fails or overruns leaves an error."""
    deadline = time.monotonic() + BACKUP_TIMEOUT_SECONDS
    while dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE:
        if time.monotonic() > deadline:
            with contextlib.suppress(libvirt.libvirtError):
                dom.abortJob()
            raise AdapterError(
                ProviderError.unavailable(
                    f"copying the disks of running VM {dom.name()!r} took over "
                    f"{BACKUP_TIMEOUT_SECONDS}s; aborted"
                )
            )
        time.sleep(BACKUP_POLL_SECONDS)
    stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
    if not stats.get("success", False):
        message = stats.get("errmsg", "the backup job failed")
        raise AdapterError(
            ProviderError.failed_precondition(
                f"could not copy the disks of running VM {dom.name()!r}: {message}"
            )
        )


# --- lookups --------------------------------------------------------------------------------


def _lookup(conn: VirConnect, vm_id: str) -> VirDomain | None:
    """The domain with UUID `vm_id`; anything that is not a UUID names nothing."""
    try:
        canonical = str(uuid.UUID(vm_id))
    except ValueError:
        return None
    if canonical != vm_id.lower():
        return None
    try:
        return conn.lookupByUUIDString(canonical)
    except libvirt.libvirtError as error:
        if is_missing(error) or error_code(error) == libvirt.VIR_ERR_INVALID_ARG:
            return None
        raise


def _by_id(conn: VirConnect, vm_id: str) -> VirDomain:
    dom = _lookup(conn, vm_id)
    if dom is None:
        raise AdapterError(ProviderError.vm_not_found(vm_id))
    return dom


def _by_name(conn: VirConnect, name: str) -> VirDomain | None:
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as error:
        if is_missing(error):
            return None
        raise


def _facts(dom: VirDomain) -> DomainFacts:
    """The persistent configuration: what the VM is (and will be after its next boot)."""
    return parse_domain(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


def _begin_building(
    conn: VirConnect, building: DomainDefinition, owner: OwnerMark
) -> VirDomain | str:
    """Define the placeholder of a VM being made; a str is the id of a racing replica's."""
    try:
        return conn.defineXML(render_domain(building))
    except libvirt.libvirtError:
        raced = _by_name(conn, building.name)
        if raced is not None and _owner(_facts(raced)) == owner:
            return str(raced.UUIDString())
        raise


def _abandon_building(dom: VirDomain) -> None:
    """Undo `_begin_building` after a failure (its volumes are the caller's to remove)."""
    with contextlib.suppress(libvirt.libvirtError):
        _undefine(dom)


def _record(dom: VirDomain, facts: DomainFacts) -> VMRecord:
    metadata = facts.metadata
    return VMRecord(
        id=str(dom.UUIDString()),
        name=facts.name,
        owner=metadata.owner if metadata else None,
        building_since=metadata.building_since if metadata else None,
    )


def _owner(facts: DomainFacts) -> OwnerMark | None:
    return facts.metadata.owner if facts.metadata else None


def _adopt(dom: VirDomain, owner: OwnerMark) -> str:
    if _owner(_facts(dom)) == owner:
        return str(dom.UUIDString())
    raise AdapterError(
        ProviderError.already_exists(f"a VM named {dom.name()!r} exists and is not ours")
    )


def _own_metadata(dom: VirDomain) -> VMMetadata:
    metadata = read_metadata(dom)
    if metadata is None:
        raise AdapterError(
            ProviderError.failed_precondition(
                f"VM {dom.name()!r} was not made by pyrigaud; it has no place for pyrigaud's state"
            )
        )
    return metadata


def _write_metadata(dom: VirDomain, metadata: VMMetadata) -> None:
    flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
    if dom.isActive():
        flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
    dom.setMetadata(
        libvirt.VIR_DOMAIN_METADATA_ELEMENT,
        metadata.render(),
        NAMESPACE_PREFIX,
        NAMESPACE_URI,
        flags,
    )


def read_metadata(dom: VirDomain) -> VMMetadata | None:
    """Our element as libvirt's metadata API returns it (the XML carries the same)."""
    try:
        text = dom.metadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE_URI, libvirt.VIR_DOMAIN_AFFECT_CONFIG
        )
    except libvirt.libvirtError as error:
        if is_missing(error):
            return None
        raise
    return metadata_from_text(str(text))


def _undefine(dom: VirDomain) -> None:
    """Undefine with snapshot metadata (and NVRAM for UEFI, where the driver allows it)."""
    base = libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    if _facts(dom).firmware == "UEFI":
        try:
            dom.undefineFlags(base | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
            return
        except libvirt.libvirtError as error:
            if error_code(error) not in REFUSED_VARIANT_CODES:
                raise
    dom.undefineFlags(base)


# --- power ------------------------------------------------------------------------------------


def _state(dom: VirDomain) -> int:
    return int(dom.state()[0])


def _power(state: int) -> PowerState:
    return PowerState.ON if state in RUNNING_STATES else PowerState.OFF


def _ask_to_shut_down(dom: VirDomain) -> None:
    """Ask the guest (agent, else ACPI) to shut down, if it runs.

    QEMU refuses the request while the domain leaves the running state for a moment (e.g.
    just after a snapshot revert): it is asked once more, and if it is refused again the
    recorded deadline's forced power-off still ends the shutdown.
    """
    for attempt in range(SHUTDOWN_REQUEST_ATTEMPTS):
        if _state(dom) not in RUNNING_STATES:
            return
        try:
            dom.shutdown()
            return
        except libvirt.libvirtError as error:
            if error_code(error) != libvirt.VIR_ERR_OPERATION_INVALID:
                raise
            logger.warning("VM %s refused a shutdown request: %s", dom.name(), error)
            if attempt + 1 < SHUTDOWN_REQUEST_ATTEMPTS:
                time.sleep(SHUTDOWN_RETRY_SECONDS)


def _start(dom: VirDomain) -> None:
    """Whatever Off state the domain is in, bring it to running."""
    state = _state(dom)
    if state in RUNNING_STATES:
        return
    if state == libvirt.VIR_DOMAIN_PAUSED:
        dom.resume()
    elif state == libvirt.VIR_DOMAIN_PMSUSPENDED:
        dom.pMWakeup(0)
    else:
        if dom.isActive():  # crashed or stuck shutting down: restart it
            dom.destroy()
        dom.create()


@dataclass(frozen=True)
class _Waiting:
    """A change a running VM cannot take now: why, and what a power cycle would change."""

    reason: str
    what: str  # "CPUs" or "memory"


def _apply_live(dom: VirDomain, changes: VMChanges) -> list[_Waiting]:
    """Hot-add within the headroom set at create (vCPUs, memory DIMMs); returns what waits
    for the next boot, and why. Nothing is removed live: shrinking waits too."""
    live = parse_domain(dom.XMLDesc(0))
    waiting: list[_Waiting] = []
    if changes.cpu is not None and changes.cpu != live.vcpus:
        cpu = changes.cpu
        waiting += _hot_add(
            _Waiting(_cpu_blocker(live, cpu), "CPUs"),
            lambda: dom.setVcpusFlags(cpu, libvirt.VIR_DOMAIN_AFFECT_LIVE),
        )
    if changes.memory_mib is not None and changes.memory_mib != live.memory_mib:
        dimm = dimm_xml(changes.memory_mib - live.memory_mib)
        waiting += _hot_add(
            _Waiting(_memory_blocker(live, changes.memory_mib), "memory"),
            lambda: dom.attachDeviceFlags(dimm, libvirt.VIR_DOMAIN_AFFECT_LIVE),
        )
    return waiting


def _hot_add(blocked: _Waiting, attempt: Callable[[], object]) -> list[_Waiting]:
    """`blocked.reason` empty: try it; a hypervisor that refuses makes it wait as well."""
    if blocked.reason:
        return [blocked]
    try:
        attempt()
    except libvirt.libvirtError as error:
        if error_code(error) not in REFUSED_VARIANT_CODES:
            raise
        return [replace(blocked, reason=f"the hypervisor refused: {error.get_error_message()}")]
    return []


def _cpu_blocker(live: DomainFacts, cpu: int) -> str:
    if cpu < live.vcpus:
        return "CPUs are not removed from a running VM"
    if live.max_vcpus <= live.vcpus:
        return "CPU hot-add disabled"
    if cpu > live.max_vcpus:
        return f"CPU hot-add goes up to {live.max_vcpus}"
    return ""


def _memory_blocker(live: DomainFacts, memory_mib: int) -> str:
    if memory_mib < live.memory_mib:
        return "memory is not removed from a running VM"
    if not live.max_memory_mib:
        return "memory hot-add disabled"
    if memory_mib > live.max_memory_mib:
        return f"memory hot-add goes up to {live.max_memory_mib} MiB"
    if not live.free_memory_slots:
        return "every memory hot-add slot is used"
    return ""


def _blockers(waiting: list[_Waiting]) -> str:
    return "; ".join(f"{item.reason}; power off to change {item.what}" for item in waiting)


# --- disks ------------------------------------------------------------------------------------


def _root_disk(conn: VirConnect, request: CreateRequest) -> _RootPlan:
    """How the root volume is made; a spec it cannot be made from is refused before anything
    exists and before any traffic.

    A Path image (a prepared one) gets a qcow2 overlay: copy-on-write, so VMs from one image
    never share a writable file, and no copy. A URL image (when no Path is given) is
    downloaded into the VM's own volume, planned with a scratch name for a raw image's
    conversion, so a crash mid-download leaves only volumes the building VM records.
    """
    image = request.image
    wanted = request.vm_class.disk_defaults.size_gib * GIB
    if image.is_blank:
        return _RootPlan(capacity_bytes=wanted or DEFAULT_ROOT_DISK_GIB * GIB)
    if image.template_name:
        raise AdapterError(
            ProviderError.invalid_spec(
                "image_json.TemplateName", "libvirt has no templates; give a Path or URL"
            )
        )
    if not image.path:
        _declared_format(image.format, CREATE_FIELDS.format)
        with _image_spec_errors(CREATE_FIELDS):
            parse_image_url(image.url)
            checksum_algorithm(image.checksum_type)
        scratch = f"{request.name}-download-{secrets.token_hex(4)}.raw"
        return _RootPlan(capacity_bytes=wanted, url_image=image, scratch_name=scratch)
    backing = volume_facts(conn, image.path)
    if backing is None:
        raise AdapterError(
            ProviderError.invalid_spec(
                "image_json.Path", f"{image.path!r} is not a volume in any storage pool"
            )
        )
    return _RootPlan(capacity_bytes=max(wanted, backing.capacity_bytes), backing=backing)


def _image_format(given: str, origin: VolumeFacts | None, url: str) -> str:
    """The prepared volume's format: as told, else the source volume's, else from the URL."""
    chosen = _declared_format(given, PREPARE_FIELDS.format)
    if chosen:
        return chosen
    if origin is not None:
        return origin.format
    return "raw" if url.split("?", 1)[0].endswith((".raw", ".img")) else "qcow2"


def _declared_format(given: str, field: str) -> str:
    """The image format a spec names ("" for none); any other than qcow2 or raw is refused."""
    chosen = given.strip().lower()
    if chosen in UNSPECIFIED_FORMATS:
        return ""
    if chosen not in IMAGE_FORMATS:
        raise AdapterError(ProviderError.invalid_spec(field, f"{given!r} is not qcow2 or raw"))
    return chosen


def _downloaded_format(given: str, header: bytes, fields: _ImageFields) -> str:
    """A URL image's format, read from its first bytes; one the spec names must agree."""
    found = image_format_of(header)
    declared = _declared_format(given, fields.format)
    if declared and declared != found:
        raise AdapterError(
            ProviderError.invalid_spec(
                fields.format, f"the image at the URL is {found}, not {declared}"
            )
        )
    return found


def _check_stored_format(conn: VirConnect, path: str, expected: str) -> None:
    """libvirt must read the stored image as the format its header showed: an image taken for
    raw that libvirt reads as, say, vmdk would be converted by following that format's own
    references to other files."""
    stored = volume_facts(conn, path)
    found = stored.format if stored is not None else "missing"
    if found != expected:
        raise AdapterError(
            ProviderError.invalid_spec(
                CREATE_FIELDS.url, f"libvirt reads the image as {found}; give a qcow2 or raw image"
            )
        )


def _file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as image:
        while chunk := image.read(FILE_CHUNK_BYTES):
            yield chunk


def _with_macs(attachments: tuple[NetworkAttachment, ...]) -> tuple[NetworkAttachment, ...]:
    """Every NIC with a MAC (a random one under QEMU's prefix if none given), for network-config."""
    return tuple(
        attachment
        if attachment.mac_address
        else attachment.model_copy(update={"mac_address": _random_mac()})
        for attachment in attachments
    )


def _random_mac() -> str:
    return ":".join((QEMU_MAC_PREFIX, *(f"{byte:02x}" for byte in secrets.token_bytes(3))))


def _grow_disk(
    conn: VirConnect, dom: VirDomain, disk: DiskDevice, capacity: int, running: bool
) -> None:
    current = volume_facts(conn, disk.path)
    if current is not None and current.capacity_bytes >= capacity:
        return  # disks only grow
    if running:
        dom.blockResize(disk.target, capacity, libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES)
    else:
        grow_volume(conn, disk.path, capacity)


def _attach_new_disk(
    conn: VirConnect, dom: VirDomain, facts: DomainFacts, index: int, capacity: int
) -> None:
    metadata = _own_metadata(dom)
    root = facts.disks[0].path if facts.disks else ""
    pool = conn.storageVolLookupByPath(root).storagePoolLookupByVolume()
    path = create_volume(pool, volume_name(facts.name, index), capacity)
    disk = DiskDevice(path=path, format="qcow2", target=disk_target(index))
    xml = ET.tostring(disk_element(disk), encoding="unicode")
    # Live first, then the persistent definition: one call with both flags can change the
    # definition and still fail live, leaving a disk whose volume the cleanup below removes.
    live = bool(dom.isActive())
    try:
        if live:
            _attach_disk(dom, xml, disk.target, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        try:
            _attach_disk(dom, xml, disk.target, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
        except AdapterError:
            if live:
                with contextlib.suppress(libvirt.libvirtError):
                    dom.detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            raise
        _write_metadata(dom, metadata.with_volume(path))
    except (libvirt.libvirtError, AdapterError):
        delete_volume(conn, path)
        raise


def _attach_disk(dom: VirDomain, xml: str, target: str, flags: int) -> None:
    """A refusal (no free PCI slot or root port, a bus that cannot hot-plug) names the disk."""
    try:
        dom.attachDeviceFlags(xml, flags)
    except libvirt.libvirtError as error:
        if error_code(error) in CONNECTION_LOSS_CODES and not dom.connect().isAlive():
            raise  # the connection went: the call is tried again on a new one
        now = "now" if flags & libvirt.VIR_DOMAIN_AFFECT_LIVE else "in its definition"
        raise AdapterError(
            ProviderError.failed_precondition(
                f"the VM cannot take disk {target} {now} ({error.get_error_message()}); "
                "power it off to add the disk"
            )
        ) from error


def _disk_details(conn: VirConnect, query: DiskQuery) -> DiskDetails:
    dom = _by_id(conn, query.vm_id)
    facts = _facts(dom)
    snapshots = tuple(str(snapshot.getName()) for snapshot in dom.listAllSnapshots(0))
    if query.snapshot_id and query.snapshot_id not in snapshots:
        raise AdapterError(
            ProviderError.not_found(f"VM {facts.name!r} has no snapshot {query.snapshot_id!r}")
        )
    if not facts.disks:
        raise AdapterError(ProviderError.not_found(f"VM {facts.name!r} has no disks"))
    chosen = (
        facts.disks[0]
        if not query.disk_id
        else next((disk for disk in facts.disks if query.disk_id in (disk.target, disk.path)), None)
    )
    if chosen is None:
        raise AdapterError(
            ProviderError.not_found(f"VM {facts.name!r} has no disk {query.disk_id!r}")
        )
    volume = volume_facts(conn, chosen.path)
    return DiskDetails(
        disk_id=chosen.target,
        format=volume.format if volume else chosen.format,
        virtual_size_bytes=volume.capacity_bytes if volume else 0,
        actual_size_bytes=volume.allocation_bytes if volume else 0,
        path=chosen.path,
        is_bootable=chosen == facts.disks[0],
        snapshots=snapshots,
        backing_file=volume.backing_path if volume else "",
        metadata={"vm": facts.name, "target": chosen.target},
    )


# --- networks -------------------------------------------------------------------------------


def _nic(conn: VirConnect, index: int, attachment: NetworkAttachment) -> NicDevice:
    model = attachment.model or "virtio"
    if attachment.network_name:
        try:
            conn.networkLookupByName(attachment.network_name)
        except libvirt.libvirtError as error:
            if not is_missing(error):
                raise
            raise AdapterError(
                ProviderError.invalid_spec(
                    f"networks_json[{index}].NetworkName",
                    f"no libvirt network named {attachment.network_name!r}",
                )
            ) from error
        return NicDevice("network", attachment.network_name, model, attachment.mac_address)
    if attachment.bridge:
        return NicDevice("bridge", attachment.bridge, model, attachment.mac_address)
    return NicDevice("user", "", model, attachment.mac_address)


def _addresses(dom: VirDomain) -> tuple[str, ...]:
    """Guest addresses from DHCP leases, else the guest agent; none when neither answers."""
    for source in ADDRESS_SOURCES:
        try:
            interfaces = dom.interfaceAddresses(source, 0) or {}
        except libvirt.libvirtError:
            continue  # no lease / no agent: try the next source
        found = [
            str(address["addr"])
            for interface in interfaces.values()
            for address in interface.get("addrs") or ()
        ]
        if found:
            return tuple(found)
    return ()


def _info(
    vm_id: str,
    facts: DomainFacts,
    state: int,
    ips: tuple[str, ...],
    volume_of: Callable[[str], VolumeFacts | None],
) -> VMInfo:
    routable = routable_addresses(ips)
    disks = []
    for disk in facts.disks:
        volume = volume_of(disk.path)
        disks.append(
            DiskInfo(
                id=disk.target,
                path=disk.path,
                size_gib=-(-volume.capacity_bytes // GIB) if volume else 0,
                format=volume.format if volume else disk.format,
            )
        )
    return VMInfo(
        id=vm_id,
        name=facts.name,
        power_state=_power(state),
        ips=ips,
        cpu=facts.vcpus,
        memory_mib=facts.memory_mib,
        disks=tuple(disks),
        networks=tuple(
            NetworkInfo(
                name=nic.source or nic.kind,
                mac=nic.mac,
                ip_address=routable[index] if index < len(routable) else "",
            )
            for index, nic in enumerate(facts.nics)
        ),
        provider_raw={
            key: value for key, value in _raw(vm_id, facts, state).items() if key not in IN_VMINFO
        },
    )


def _raw(
    vm_id: str, facts: DomainFacts, state: int, *, persistent: DomainFacts | None = None
) -> dict[str, str]:
    """`persistent` (with the live `facts`) adds what waits for a power cycle: read from
    libvirt both times, so every replica says the same."""
    owner = facts.metadata.owner if facts.metadata and facts.metadata.owner else None
    waiting = {}
    if persistent is not None:
        waiting["pendingPowerCycle"] = ",".join(awaiting_power_cycle(facts, persistent))
    return {
        "id": vm_id,
        "name": facts.name,
        "state": STATE_NAMES.get(state, "unknown"),
        "cpu": str(facts.vcpus),
        "max_cpu": str(facts.max_vcpus),
        "memory_mib": str(facts.memory_mib),
        "firmware": facts.firmware,
        "owner": owner.provider if owner else "",
        **waiting,
    }


# --- snapshots ------------------------------------------------------------------------------


def _snapshot(dom: VirDomain, snapshot_id: str) -> Any:
    try:
        return dom.snapshotLookupByName(snapshot_id, 0)
    except libvirt.libvirtError as error:
        if is_missing(error) or error_code(error) == libvirt.VIR_ERR_INVALID_ARG:
            raise AdapterError(
                ProviderError.not_found(f"VM {dom.name()!r} has no snapshot {snapshot_id!r}")
            ) from error
        raise


def _create_snapshot(conn: VirConnect, request: SnapshotRequest) -> Snapshot:
    dom = _by_id(conn, request.vm_id)
    try:
        return _snapshot_value(dom.snapshotLookupByName(request.name, 0))  # a retry: same one
    except libvirt.libvirtError as error:
        if not is_missing(error):
            raise
    # Always internal (inside the qcow2 disks): a running VM's then carries its memory, and
    # reports so. libvirt 9's disk-only snapshots of a running VM are external overlay files
    # it cannot revert to, and that would outlive the VM's own volumes.
    return _snapshot_value(dom.snapshotCreateXML(_snapshot_xml(request), 0))


def _snapshot_xml(request: SnapshotRequest) -> str:
    root = ET.Element("domainsnapshot")
    ET.SubElement(root, "name").text = request.name
    if request.description:
        ET.SubElement(root, "description").text = request.description
    return ET.tostring(root, encoding="unicode")


def _snapshot_value(snapshot: Any) -> Snapshot:
    root = ET.fromstring(snapshot.getXMLDesc(0))  # noqa: S314 - libvirt's own output
    memory = root.find("memory")
    captured = memory is not None and memory.get("snapshot", "no") != "no"
    return Snapshot(
        id=str(snapshot.getName()),
        name=str(snapshot.getName()),
        description=root.findtext("description", ""),
        include_memory=captured,
    )
