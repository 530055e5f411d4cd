"""The fake backend's ports (TEMPORARY stand-in: one object serves them all until the split)."""

from __future__ import annotations

from collections.abc import Mapping

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock


def fake_backend(hypervisor: FakeHypervisor) -> Backend:
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


def build_fake_backend(
    clock: Clock, *, datastores: tuple[str, ...], latency: Mapping[str, float]
) -> Backend:
    return fake_backend(FakeHypervisor(clock, datastores=datastores, latency=latency))
