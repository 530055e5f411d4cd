"""The adapter contract suite's fixtures: one harness per hypervisor backend, keyed by port.

Each backend under test says which optional ports it lacks. The suite of a port runs on every
backend that has it (`harness_with(port)`); `test_unsupported_ports.py` checks that a backend
lacking one answers its RPCs UNSUPPORTED and says so in its capabilities. New backends join by
adding an entry to BACKENDS.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.domain.models import Capabilities, OwnerMark, VMImage

from contract.harness import Harness, staging_root
from support import ManualClock
from support.libvirt import add_base_image, isolated_host_uri, make_backend
from support.qemu import qemu_harness
from support.qemu_wanted import qemu_param
from support.vsphere import contract_harness as vsphere_simulator_harness


def _fake() -> Iterator[Harness]:
    """The fake's disks are in memory; its transfers stage on the harness's PVC root."""
    clock = ManualClock()
    fake = FakeHypervisor(clock)
    fake.add_image("/images/base.qcow2", size_gib=2)
    with tempfile.TemporaryDirectory() as directory:
        yield Harness(
            backend=fake_backend(fake),
            clock=clock,
            image=VMImage(path="/images/base.qcow2"),
            staging_root=staging_root(Path(directory)),
        )


class _NoOptionalPorts:
    """Capabilities claiming no optional port, for the backend that has none."""

    def capabilities(self) -> Capabilities:
        return Capabilities()


def _fake_without_optional_ports() -> Iterator[Harness]:
    """The fake with every optional port left out: every real backend now has them all, and
    the suite must still show that a lacked port is unclaimed and answers UNSUPPORTED."""
    for harness in _fake():
        bare = dataclasses.replace(
            harness.backend,
            capabilities=_NoOptionalPorts(),
            snapshots=None,
            cloning=None,
            images=None,
            disk_transfer=None,
        )
        yield dataclasses.replace(harness, backend=bare)


def _libvirt_test_driver() -> Iterator[Harness]:
    """libvirt's built-in test driver: a fresh in-memory host per connection, no daemon."""
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as directory:
        root = staging_root(Path(directory) / "staging")
        backend, connection = make_backend(isolated_host_uri(Path(directory)), clock)
        image = VMImage(path=add_base_image(connection), format="qcow2")
        yield Harness(
            backend=backend, clock=clock, image=image, staging_root=root, moves_bytes=False
        )
        connection.close()


@dataclass(frozen=True)
class BackendUnderTest:
    harness: Callable[[], Iterator[Harness]]
    lacks: frozenset[str] = field(default_factory=frozenset)  # optional ports it has not
    needs_qemu: bool = False  # the real libvirtd + QEMU


BACKENDS: dict[str, BackendUnderTest] = {
    "fake": BackendUnderTest(_fake),
    "fake-bare": BackendUnderTest(
        _fake_without_optional_ports,
        lacks=frozenset({"snapshots", "cloning", "images", "disk_transfer"}),
    ),
    "libvirt-test": BackendUnderTest(_libvirt_test_driver),
    "vsphere-sim": BackendUnderTest(vsphere_simulator_harness),
    # Real libvirtd + QEMU: wanted with PYRIGAUD_TEST_QEMU=1, as it needs root and
    # scripts/libvirtd.sh; skipped otherwise (support.qemu).
    "libvirt-qemu": BackendUnderTest(qemu_harness, needs_qemu=True),
}


def backend_params(names: list[str]) -> list[object]:
    """The backends' names as parameters, those that need the daemon marked so."""
    return [qemu_param(name) if BACKENDS[name].needs_qemu else name for name in sorted(names)]


def backends_with(port: str) -> list[object]:
    return backend_params([name for name, backend in BACKENDS.items() if port not in backend.lacks])


def lacked_ports() -> list[object]:
    """(backend, port) for every optional port a backend under test lacks, as parameters."""
    return [
        qemu_param(name, port) if BACKENDS[name].needs_qemu else (name, port)
        for name, port in sorted(
            (name, port) for name, backend in BACKENDS.items() for port in backend.lacks
        )
    ]


def harness_of(name: str) -> Iterator[Harness]:
    yield from BACKENDS[name].harness()


@pytest.fixture(params=backend_params(list(BACKENDS)))
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Every backend: for the ports every backend has."""
    yield from harness_of(request.param)


def _harness_of_backends_with(port: str) -> object:
    """The fixture `<port>_harness`: every backend that has `port`, for that port's suite."""

    @pytest.fixture(name=f"{port}_harness", params=backends_with(port))
    def harness_with_port(request: pytest.FixtureRequest) -> Iterator[Harness]:
        yield from harness_of(request.param)

    return harness_with_port


snapshots_harness = _harness_of_backends_with("snapshots")
cloning_harness = _harness_of_backends_with("cloning")
images_harness = _harness_of_backends_with("images")
disk_transfer_harness = _harness_of_backends_with("disk_transfer")


@pytest.fixture
def owner() -> OwnerMark:
    return OwnerMark(provider="tests/contract")
