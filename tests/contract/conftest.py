"""The adapter contract suite's fixtures: one harness per hypervisor adapter.

Each harness gives the adapter (which implements every port) plus what a test needs that
only the backend knows how to make, such as an image a VM can be created from. New adapters
join by adding a harness to ADAPTERS.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.domain.models import OwnerMark, VMImage

from contract.harness import Harness
from libvirt_support import add_base_image, isolated_host_uri, make_adapter
from qemu_support import qemu_enabled, qemu_harness
from support import ManualClock
from vsphere_support import contract_harness as vsphere_simulator_harness


def _fake() -> Iterator[Harness]:
    clock = ManualClock()
    adapter = FakeHypervisor(clock)
    adapter.add_image("/images/base.qcow2", size_gib=2)
    yield Harness(adapter=adapter, clock=clock, image=VMImage(path="/images/base.qcow2"))


def _libvirt_test_driver() -> Iterator[Harness]:
    """libvirt's built-in test driver: a fresh in-memory host per connection, no daemon."""
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as directory:
        adapter, connection = make_adapter(isolated_host_uri(Path(directory)), clock)
        image = VMImage(path=add_base_image(connection), format="qcow2")
        yield Harness(adapter=adapter, clock=clock, image=image)
        connection.close()


ADAPTERS: dict[str, Callable[[], Iterator[Harness]]] = {
    "fake": _fake,
    "libvirt-test": _libvirt_test_driver,
    "vsphere-sim": vsphere_simulator_harness,
}
if qemu_enabled():  # real libvirtd + QEMU: opt-in, as it needs root and scripts/libvirtd.sh
    ADAPTERS["libvirt-qemu"] = qemu_harness


@pytest.fixture(params=sorted(ADAPTERS))
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from ADAPTERS[request.param]()


@pytest.fixture
def owner() -> OwnerMark:
    return OwnerMark(provider="tests/contract")
