"""Health on the fake hypervisor: reachable unless a test says otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from returns.result import Failure

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.domain.models import HealthReport


@dataclass(frozen=True)
class FakeHealth:
    hypervisor: FakeHypervisor

    def check(self) -> HealthReport:
        """Unreachable only when a failure is injected for "check"."""
        match self.hypervisor.faults.before("check"):
            case Failure(error):
                return HealthReport(ok=False, message=error.message)
        return HealthReport(ok=True, message="fake hypervisor reachable")
