"""One simulator per test session (shared with the contract suite); a fresh backend per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pyrigaud.application.backend import Backend

from support.vsphere import Simulator, remove_vms_made_since, shared_simulator


@pytest.fixture(scope="session")
def simulator() -> Simulator:
    return shared_simulator()


@pytest.fixture
def backend(simulator: Simulator) -> Iterator[Backend]:
    """The backend's ports; VMs a test made are deleted after it so names can be reused."""
    ports = simulator.backend()
    before = {vm.id for vm in ports.inventory.list_vms().unwrap()}
    yield ports
    remove_vms_made_since(ports, before)


@pytest.fixture
def instance(simulator: Simulator) -> Iterator[Any]:
    """A logged-in service instance of the simulator, for a test's own pyVmomi calls."""
    session = simulator.session()
    yield session.call(lambda connection: connection)
    session.close()
