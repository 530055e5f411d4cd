"""Health on libvirt: whether its host answers, and which domain type VMs get there."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import HealthReport


class LibvirtHealth:
    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    def check(self) -> HealthReport:
        """One local call (and, once per connection with LIBVIRT_DOMAIN_TYPE=auto, the host's
        capabilities); it also subscribes to the events on a new connection. The message says
        the domain type VMs get, and `(auto)` when the host chose it."""
        connection = self._host.connection

        def version_of(conn: VirConnect) -> Result[tuple[int, str], ProviderError]:
            self._host.domains.attach(conn)
            return Success((int(conn.getLibVersion()), self._host.domain_type_of(conn)))

        match self._host.run("check health", version_of):
            case Failure(error):
                return HealthReport(ok=False, message=f"libvirt at {connection.uri}: {error}")
            case Success((version, domain_type)):
                pass
        major, minor = version // 1_000_000, version // 1000 % 1000
        chosen = "" if self._host.domain_type == domain_type else f" ({self._host.domain_type})"
        where = f"libvirt {major}.{minor} at {connection.uri}"
        return HealthReport(ok=True, message=f"{where}, {domain_type}{chosen} domains")
