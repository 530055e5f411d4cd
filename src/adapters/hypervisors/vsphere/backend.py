"""The vSphere backend's ports (TEMPORARY stand-in: one object serves them all until the split)."""

from __future__ import annotations

from collections.abc import Callable

from pyrigaud.adapters.hypervisors.vsphere.hypervisor import vsphere_hypervisor
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Credentials
from pyrigaud.domain.models import Placement


def build_vsphere_backend(
    endpoint: str,
    credentials: Credentials,
    *,
    insecure: bool,
    defaults: Placement,
    on_relogin: Callable[[], None],
) -> Backend:
    hypervisor = vsphere_hypervisor(
        endpoint, credentials, insecure, defaults, on_relogin=on_relogin
    )
    return Backend(
        lifecycle=hypervisor,
        power=hypervisor,
        inventory=hypervisor,
        health=hypervisor,
        capabilities=hypervisor,
        tasks=hypervisor,
        snapshots=hypervisor,
        cloning=hypervisor,
        images=hypervisor,
        disk_transfer=hypervisor,
    )
