"""The domain cache on a real libvirtd: a VM started and stopped by plain libvirt, outside
the backend, reads so in Describe once libvirtd's event arrives (polled, bounded)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyrigaud.domain.models import OwnerMark
from pyrigaud.domain.power import PowerState

from support import ok
from support.libvirt import create_vm
from support.qemu import QemuHost

OWNER = OwnerMark(provider="tests/qemu-cache")
EVENT_WAIT_SECONDS = 60.0


def eventually(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + EVENT_WAIT_SECONDS
    while not check():
        assert time.monotonic() < deadline, "libvirtd's event never reached the backend"
        time.sleep(0.05)


def power_of(qemu: QemuHost, vm_id: str) -> PowerState:
    description = ok(qemu.backend.inventory.describe(vm_id))
    assert description is not None
    return description.power_state


def test_a_vm_powered_outside_the_adapter_is_seen(qemu: QemuHost, conn: Any) -> None:
    vm_id = ok(create_vm(qemu.backend, qemu.request("cache-outside", image=qemu.image), OWNER))
    assert power_of(qemu, vm_id) is PowerState.OFF  # now cached
    dom = conn.lookupByUUIDString(vm_id)
    dom.create()
    eventually(lambda: power_of(qemu, vm_id) is PowerState.ON)
    dom.destroy()
    eventually(lambda: power_of(qemu, vm_id) is PowerState.OFF)
    dom.undefineFlags(0)
    eventually(lambda: ok(qemu.backend.inventory.describe(vm_id)) is None)
