"""Is the hypervisor there, and what can it do."""

from __future__ import annotations

from typing import Protocol

from pyrigaud.domain.models import Capabilities, HealthReport


class Health(Protocol):
    def check(self) -> HealthReport:
        """One cheap round trip, independent of the number of VMs; never raises for an outage."""
        ...


class CapabilitySource(Protocol):
    def capabilities(self) -> Capabilities: ...
