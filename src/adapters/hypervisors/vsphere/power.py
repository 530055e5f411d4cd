"""PowerControl on vSphere: power Tasks handed back as task ids, and a graceful shutdown's
deadline kept in the VM's extraConfig, where every replica reads it."""

from __future__ import annotations

from functools import partial
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.functions import not_
from returns.result import Result

from pyrigaud.adapters.hypervisors.vsphere.calls import Faulted, answer, fault_is, or_none, run
from pyrigaud.adapters.hypervisors.vsphere.errors import is_missing
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

        def read(instance: Any) -> Result[PowerState, ProviderError]:
            return self._vcenter.vm(instance, vm_id).bind(partial(self._vcenter.power, instance))

        return run(self._vcenter.session, f"reading power of VM {vm_id!r}", read)

    def power_on(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._change(vm_id, PowerState.ON)

    def power_off(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._change(vm_id, PowerState.OFF)

    def reboot(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        """The guest reboots itself (no Task: None), or the reset Task when it cannot."""

        def restart(vm: Any) -> Any:
            refused = answer(vm.RebootGuest, not_(is_missing))
            if isinstance(refused, Faulted):
                # No guest tools (or, on the simulator, no RebootGuest at all): reset instead.
                return vm.ResetVM_Task()
            return None

        def start(instance: Any) -> Result[Any, ProviderError]:
            return self._vcenter.vm(instance, vm_id).map(restart)

        return begin(self._vcenter.session, TaskOperation(f"rebooting VM {vm_id!r}", vm_id, start))

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        def shut_down(vm: Any, state: PowerState) -> None:
            if state is PowerState.ON:
                # No VMware Tools to ask: the recorded deadline still forces the power-off.
                or_none(vm.ShutdownGuest, fault_is(vim.fault.ToolsUnavailable))

        def asked(instance: Any, vm: Any) -> Result[None, ProviderError]:
            def power(_recorded: None) -> Result[PowerState, ProviderError]:
                return self._vcenter.power(instance, vm)

            return (
                self._vcenter.set_extra_config(instance, vm, {SHUTDOWN_DEADLINE_KEY: str(deadline)})
                .bind(power)
                .map(partial(shut_down, vm))
            )

        def ask(instance: Any) -> Result[None, ProviderError]:
            return self._vcenter.vm(instance, vm_id).bind(partial(asked, instance))

        return run(self._vcenter.session, f"shutting down VM {vm_id!r}", ask)

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        def deadline_in(extra: dict[str, str]) -> int | None:
            value = extra.get(SHUTDOWN_DEADLINE_KEY, "")
            return int(value) if value.isdigit() else None

        def read(instance: Any) -> Result[int | None, ProviderError]:
            return self._vcenter.extra_config(instance, vm_id).map(deadline_in)

        return run(self._vcenter.session, f"reading VM {vm_id!r}", read)

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:

        def clear(instance: Any) -> Result[None, ProviderError]:
            def cleared(vm: Any) -> Result[None, ProviderError]:
                return self._vcenter.set_extra_config(instance, vm, {SHUTDOWN_DEADLINE_KEY: ""})

            return self._vcenter.vm(instance, vm_id).bind(cleared)

        return run(self._vcenter.session, f"updating VM {vm_id!r}", clear)

    def _change(self, vm_id: str, target: PowerState) -> Result[TaskRef | None, ProviderError]:
        """The power Task, or None when the VM is already in the state asked for."""

        def started(vm: Any, state: PowerState) -> Any:
            if state is target:
                return None
            return vm.PowerOnVM_Task() if target is PowerState.ON else vm.PowerOffVM_Task()

        def task_for(instance: Any, vm: Any) -> Result[Any, ProviderError]:
            return self._vcenter.power(instance, vm).map(partial(started, vm))

        def start(instance: Any) -> Result[Any, ProviderError]:
            return self._vcenter.vm(instance, vm_id).bind(partial(task_for, instance))

        operation = TaskOperation(f"powering VM {vm_id!r} {target.value}", vm_id, start)
        return begin(self._vcenter.session, operation)
