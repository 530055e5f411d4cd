"""Validate: is the hypervisor reachable (O(1), side-effect free)."""

from __future__ import annotations

from pyrigaud.application.ports import Health
from pyrigaud.domain.models import HealthReport


class ValidateProvider:
    def __init__(self, health: Health) -> None:
        self._health = health

    def __call__(self) -> HealthReport:
        """An outage is a report (ok=False), never an error: Validate is where it is shown."""
        return self._health.check()
