"""The vSphere backend as the composition root builds it: one port object each, over one
shared session (no round trip until the first call)."""

from __future__ import annotations

from collections.abc import Callable

from pyrigaud.adapters.hypervisors.vsphere.capabilities import VSphereCapabilities
from pyrigaud.adapters.hypervisors.vsphere.clone_maker import CloneMaker
from pyrigaud.adapters.hypervisors.vsphere.cloning import VSphereCloning
from pyrigaud.adapters.hypervisors.vsphere.device_models import FallbackCounters
from pyrigaud.adapters.hypervisors.vsphere.disk_transfer import VSphereDiskTransfer
from pyrigaud.adapters.hypervisors.vsphere.disk_vm import DiskVMMaker
from pyrigaud.adapters.hypervisors.vsphere.health import VSphereHealth
from pyrigaud.adapters.hypervisors.vsphere.images import VSphereImages
from pyrigaud.adapters.hypervisors.vsphere.inventory import VSphereInventory
from pyrigaud.adapters.hypervisors.vsphere.inventory_cache import InventoryCache
from pyrigaud.adapters.hypervisors.vsphere.inventory_updates import follow
from pyrigaud.adapters.hypervisors.vsphere.power import VSpherePowerControl
from pyrigaud.adapters.hypervisors.vsphere.provisioning import VSphereVMLifecycle
from pyrigaud.adapters.hypervisors.vsphere.read_your_writes import (
    RefreshingCloning,
    RefreshingLifecycle,
    RefreshingPower,
    RefreshingSnapshots,
)
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.adapters.hypervisors.vsphere.snapshots import VSphereSnapshots
from pyrigaud.adapters.hypervisors.vsphere.tasks import VSphereTaskTracker
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.virtual_hardware import VSphereHardwareFacts
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import ImportMarks
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.domain.models import Placement


def vsphere_backend(
    session: VSphereSession,
    *,
    defaults: Placement,
    clock: Clock,
    allow_loopback_urls: bool = False,
    on_resync: Callable[[], None] = lambda: None,
    owner: str,
    image_judge: ImageJudge,
    scratch_dir: str | None = None,
    fallbacks: FallbackCounters | None = None,
) -> Backend:
    """Every port over `session`; `clock` dates the building mark of a Create made in steps
    (the wall clock that every replica shares). The inventory cache's feed starts now, and
    stops when the session closes. `defaults` are the PROVIDER_DEFAULT_* placement settings;
    `on_resync` is told each time the inventory cache's update feed broke and reads the whole
    inventory again; `allow_loopback_urls` lets ImagePrepare fetch from loopback (tests only);
    `image_judge` judges the disks of an OVA before vCenter sees them; `scratch_dir` is where
    ExportDisk's and ImportDisk's format conversions keep anonymous scratch files (None: the
    system's temporary directory); `owner` is this provider's owner mark, written on the VMs
    imports make until they are complete; `fallbacks` are told of each VM made around a
    migrated disk with a device its guest had no equivalent of."""
    vcenter = VCenter(session)
    cache = InventoryCache(vcenter)
    follow(session, cache, on_resync)
    clone_maker = CloneMaker(vcenter, defaults, clock)
    marks = ImportMarks(owner, clock)
    return Backend(
        lifecycle=RefreshingLifecycle(
            VSphereVMLifecycle(
                vcenter, clone_maker, DiskVMMaker(vcenter, defaults, clock, fallbacks)
            ),
            cache,
        ),
        power=RefreshingPower(VSpherePowerControl(vcenter), cache),
        inventory=VSphereInventory(vcenter, cache),
        health=VSphereHealth(session),
        capabilities=VSphereCapabilities(),
        tasks=VSphereTaskTracker(session, on_ended=cache.refresh),
        snapshots=RefreshingSnapshots(VSphereSnapshots(vcenter), cache),
        cloning=RefreshingCloning(VSphereCloning(vcenter, clone_maker), cache),
        disk_transfer=VSphereDiskTransfer(vcenter, defaults, marks, scratch_dir=scratch_dir),
        images=VSphereImages(
            vcenter,
            defaults,
            marks,
            image_judge,
            allow_loopback_urls=allow_loopback_urls,
            scratch_dir=scratch_dir,
        ),
        hardware=VSphereHardwareFacts(vcenter),
    )
