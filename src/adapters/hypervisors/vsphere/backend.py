"""The vSphere backend as the composition root builds it: one port object each, over one
shared session (no round trip until the first call)."""

from __future__ import annotations

from collections.abc import Callable

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.vsphere.clone_maker import CloneMaker
from pyrigaud.adapters.hypervisors.vsphere.cloning import VSphereCloning
from pyrigaud.adapters.hypervisors.vsphere.disk_transfer import VSphereDiskTransfer
from pyrigaud.adapters.hypervisors.vsphere.disk_vm import DiskVMMaker
from pyrigaud.adapters.hypervisors.vsphere.health import VSphereCapabilities, VSphereHealth
from pyrigaud.adapters.hypervisors.vsphere.images import VSphereImages
from pyrigaud.adapters.hypervisors.vsphere.inventory import VSphereInventory
from pyrigaud.adapters.hypervisors.vsphere.power import VSpherePowerControl
from pyrigaud.adapters.hypervisors.vsphere.provisioning import VSphereVMLifecycle
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession, credentials_from
from pyrigaud.adapters.hypervisors.vsphere.snapshots import VSphereSnapshots
from pyrigaud.adapters.hypervisors.vsphere.tasks import VSphereTaskTracker
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock, Credentials
from pyrigaud.domain.models import Placement


def build_vsphere_backend(
    endpoint: str,
    credentials: Credentials,
    *,
    insecure: bool,
    defaults: Placement,
    on_relogin: Callable[[], None],
    allow_loopback_urls: bool = False,
) -> Backend:
    """`defaults` are the PROVIDER_DEFAULT_* placement settings; `on_relogin` is told each
    time an expired session is replaced by a new login; `allow_loopback_urls` lets
    ImagePrepare fetch from loopback (tests only)."""
    session = VSphereSession(endpoint, credentials_from(credentials), insecure, on_relogin)
    return vsphere_backend(
        session,
        defaults=defaults,
        clock=SystemClock(),
        allow_loopback_urls=allow_loopback_urls,
    )


def vsphere_backend(
    session: VSphereSession,
    *,
    defaults: Placement,
    clock: Clock,
    allow_loopback_urls: bool = False,
) -> Backend:
    """Every port over `session`; `clock` dates the building mark of a Create made in steps
    (the wall clock that every replica shares)."""
    vcenter = VCenter(session)
    clone_maker = CloneMaker(vcenter, defaults, clock)
    return Backend(
        lifecycle=VSphereVMLifecycle(vcenter, clone_maker, DiskVMMaker(vcenter, defaults, clock)),
        power=VSpherePowerControl(vcenter),
        inventory=VSphereInventory(vcenter),
        health=VSphereHealth(session),
        capabilities=VSphereCapabilities(),
        tasks=VSphereTaskTracker(session),
        snapshots=VSphereSnapshots(vcenter),
        cloning=VSphereCloning(vcenter, clone_maker),
        disk_transfer=VSphereDiskTransfer(vcenter),
        images=VSphereImages(vcenter, defaults, allow_loopback_urls=allow_loopback_urls),
    )
