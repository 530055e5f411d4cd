"""PowerControl on vSphere: power Tasks handed back as task ids, and a graceful shutdown's
deadline kept in the VM's extraConfig, where every replica reads it."""

from __future__ import annotations

import contextlib
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Result

from pyrigaud.adapters.hypervisors.vsphere.errors import EXPECTED_FAILURES, is_missing, run
from pyrigaud.adapters.hypervisors.vsphere.tasks import TaskOperation, begin
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import SHUTDOWN_DEADLINE_KEY
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim


class VSpherePowerControl:
    def __init__(self, vcenter: VCenter) -> None:
        self._vcenter = vcenter

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        return run(
            self._vcenter.session,
            f"reading power of VM {vm_id!r}",
            lambda instance: self._vcenter.power(instance, self._vcenter.vm(instance, vm_id)),
        )

    def power_on(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._change(vm_id, PowerState.ON)

    def power_off(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._change(vm_id, PowerState.OFF)

    def reboot(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        """The guest reboots itself (no Task: None), or the reset Task when it cannot."""

        def start(instance: Any) -> Any:
            vm = self._vcenter.vm(instance, vm_id)
            try:
                vm.RebootGuest()
            except EXPECTED_FAILURES as error:
                if is_missing(error):
                    raise
                # No guest tools (or, on the simulator, no RebootGuest at all): reset instead.
                return vm.ResetVM_Task()
            return None

        return begin(self._vcenter.session, TaskOperation(f"rebooting VM {vm_id!r}", vm_id, start))

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        def ask(instance: Any) -> None:
            vm = self._vcenter.vm(instance, vm_id)
            self._vcenter.set_extra_config(instance, vm, {SHUTDOWN_DEADLINE_KEY: str(deadline)})
            if self._vcenter.power(instance, vm) is PowerState.ON:
                with contextlib.suppress(vim.fault.ToolsUnavailable):
                    # No VMware Tools to ask: the recorded deadline still forces the power-off.
                    vm.ShutdownGuest()

        return run(self._vcenter.session, f"shutting down VM {vm_id!r}", ask)

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        def read(instance: Any) -> int | None:
            value = self._vcenter.extra_config(instance, vm_id).get(SHUTDOWN_DEADLINE_KEY, "")
            return int(value) if value.isdigit() else None

        return run(self._vcenter.session, f"reading VM {vm_id!r}", read)

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        return run(
            self._vcenter.session,
            f"updating VM {vm_id!r}",
            lambda instance: self._vcenter.set_extra_config(
                instance, self._vcenter.vm(instance, vm_id), {SHUTDOWN_DEADLINE_KEY: ""}
            ),
        )

    def _change(self, vm_id: str, target: PowerState) -> Result[TaskRef | None, ProviderError]:
        """The power Task, or None when the VM is already in the state asked for."""

        def start(instance: Any) -> Any:
            vm = self._vcenter.vm(instance, vm_id)
            if self._vcenter.power(instance, vm) is target:
                return None
            return vm.PowerOnVM_Task() if target is PowerState.ON else vm.PowerOffVM_Task()

        operation = TaskOperation(f"powering VM {vm_id!r} {target.value}", vm_id, start)
        return begin(self._vcenter.session, operation)
