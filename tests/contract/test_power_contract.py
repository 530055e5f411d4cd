"""PowerControl and Inventory's view of power, on every backend."""

from __future__ import annotations

from pyrigaud.domain.models import OwnerMark
from pyrigaud.domain.power import PowerState

from contract.harness import Harness
from contract.steps import create, finished
from support import ok


def test_power_transitions_are_idempotent(harness: Harness, owner: OwnerMark) -> None:
    power = harness.backend.power
    vm_id = create(harness, owner, "contract-power")
    finished(harness, power.power_on(vm_id))
    finished(harness, power.power_on(vm_id))
    assert ok(power.power_state(vm_id)) is PowerState.ON
    finished(harness, power.reboot(vm_id))
    assert ok(power.power_state(vm_id)) is PowerState.ON
    finished(harness, power.power_off(vm_id))
    finished(harness, power.power_off(vm_id))
    assert ok(power.power_state(vm_id)) is PowerState.OFF


def test_a_running_vm_reports_guest_addresses(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-ips")
    finished(harness, harness.backend.power.power_on(vm_id))
    description = ok(harness.backend.inventory.describe(vm_id))
    assert description is not None
    assert description.power_state is PowerState.ON
    if harness.guest_reports_addresses:
        assert description.ips
    else:
        # No guest OS, so no lease and no agent: reporting no address is the honest answer.
        assert description.ips == ()
    assert dict(description.raw)


def test_a_shutdown_request_records_its_deadline_on_the_vm(
    harness: Harness, owner: OwnerMark
) -> None:
    power = harness.backend.power
    vm_id = create(harness, owner, "contract-shutdown")
    finished(harness, power.power_on(vm_id))
    assert ok(power.shutdown_deadline(vm_id)) is None
    deadline = int(harness.clock.now()) + 60
    ok(power.request_shutdown(vm_id, deadline))
    assert ok(power.shutdown_deadline(vm_id)) == deadline
    ok(power.clear_shutdown_deadline(vm_id))
    assert ok(power.shutdown_deadline(vm_id)) is None
