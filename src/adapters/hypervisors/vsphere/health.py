"""Health on vSphere: whether vCenter answers."""

from __future__ import annotations

from returns.result import Failure, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import run
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.domain.models import HealthReport


class VSphereHealth:
    def __init__(self, session: VSphereSession) -> None:
        self._session = session

    def check(self) -> HealthReport:
        """vCenter's clock, read through the session: a login and one round trip."""
        match run(self._session, "vCenter", lambda instance: Success(instance.CurrentTime())):
            case Failure(error):
                return HealthReport(ok=False, message=str(error))
        return HealthReport(ok=True, message="vCenter reachable")
