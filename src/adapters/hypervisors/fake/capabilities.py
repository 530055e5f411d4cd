"""CapabilitySource on the fake hypervisor: what its test sets it to claim."""

from __future__ import annotations

from dataclasses import dataclass

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.domain.models import Capabilities


@dataclass(frozen=True)
class FakeCapabilities:
    hypervisor: FakeHypervisor

    def capabilities(self) -> Capabilities:
        return self.hypervisor.capabilities
