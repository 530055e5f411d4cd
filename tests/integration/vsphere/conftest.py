"""One simulator per test session (shared with the contract suite); a fresh adapter per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyrigaud.adapters.hypervisors.vsphere.hypervisor import VSphereHypervisor

from vsphere_support import Simulator, shared_simulator


@pytest.fixture(scope="session")
def simulator() -> Simulator:
    return shared_simulator()


@pytest.fixture
def adapter(simulator: Simulator) -> Iterator[VSphereHypervisor]:
    """The adapter; VMs a test made are deleted after it so names can be reused."""
    hypervisor = simulator.adapter()
    before = {vm.id for vm in hypervisor.list_vms().unwrap()}
    yield hypervisor
    for vm in hypervisor.list_vms().unwrap():
        if vm.id not in before:
            hypervisor.delete(vm.id).unwrap()
