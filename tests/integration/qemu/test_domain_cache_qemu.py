"""The domain cache on a real libvirtd: a VM started and stopped by plain libvirt, outside
the adapter, reads so in Describe once libvirtd's event arrives (polled, bounded)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyrigaud.domain.models import OwnerMark
from pyrigaud.domain.power import PowerState

from contract.harness import Harness
from support import ok

OWNER = OwnerMark(provider="tests/qemu-cache")
EVENT_WAIT_SECONDS = 60.0


def eventually(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + EVENT_WAIT_SECONDS
    while not check():
        assert time.monotonic() < deadline, "libvirtd's event never reached the adapter"
        time.sleep(0.05)


def power_of(qemu: Harness, vm_id: str) -> PowerState:
    description = ok(qemu.adapter.describe(vm_id))
    assert description is not None
    return description.power_state


def test_a_vm_powered_outside_the_adapter_is_seen(qemu: Harness, conn: Any) -> None:
    vm_id = ok(qemu.adapter.create(qemu.request("cache-outside", image=qemu.image), OWNER))
    assert power_of(qemu, vm_id) is PowerState.OFF  # now cached
    dom = conn.lookupByUUIDString(vm_id)
    dom.create()
    eventually(lambda: power_of(qemu, vm_id) is PowerState.ON)
    dom.destroy()
    eventually(lambda: power_of(qemu, vm_id) is PowerState.OFF)
    dom.undefineFlags(0)
    eventually(lambda: ok(qemu.adapter.describe(vm_id)) is None)
