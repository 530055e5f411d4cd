"""The libvirt host every port module acts on, and the one edge where failures become values.

A port method hands `run` what to do with the live connection; inside, libvirt errors and
ExpectedError are raised freely, and `run` turns both into a Failure. Mutations go through
`mutate` or `make`, so that Describe and ListVMs on this replica read the VM afresh
afterwards (read your writes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection, VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_cache import DomainCache
from pyrigaud.adapters.hypervisors.libvirt.errors import provider_error
from pyrigaud.adapters.hypervisors.libvirt.host_capabilities import domain_type_for
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings, VolumeWriter
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ExpectedError, ProviderError

T = TypeVar("T")


@dataclass(frozen=True)
class LibvirtHost:
    """What the port modules share: the connection, the settings, and the domain cache.

    `write_volume` puts bytes into a volume (a libvirt stream unless a test says else);
    `domain_type` is LIBVIRT_DOMAIN_TYPE (`auto` is resolved per connection).
    """

    connection: LibvirtConnection
    clock: Clock
    domains: DomainCache
    domain_type: str
    pools: PoolSettings
    write_volume: VolumeWriter

    def domain_type_of(self, conn: VirConnect) -> str:
        """The domain type VMs get here: LIBVIRT_DOMAIN_TYPE, or for `auto` what the host
        offers (host_capabilities.py)."""
        return domain_type_for(conn, self.domain_type)

    def run(self, doing: str, action: Callable[[VirConnect], T]) -> Result[T, ProviderError]:
        """The edge: libvirt exceptions and expected failures become Failure values."""
        return self.attempt(doing, lambda: self.connection.call(action))

    def run_once(self, doing: str, action: Callable[[VirConnect], T]) -> Result[T, ProviderError]:
        """`run`, never started over on a reopened connection: for an action that consumes a
        stream of bytes, which a second start would take up part-way."""
        return self.attempt(doing, lambda: self.connection.call(action, once=True))

    @staticmethod
    def attempt(doing: str, action: Callable[[], T]) -> Result[T, ProviderError]:
        """The edge for work on a connection already in hand (a volume stream being read):
        no call slot taken, no reopening, which would restart a stream part-way."""
        try:
            return Success(action())
        except ExpectedError as failure:
            return Failure(failure.error)
        except libvirt.libvirtError as error:
            return Failure(provider_error(error, doing))

    def mutate(
        self, vm_id: str, doing: str, action: Callable[[VirConnect], T]
    ) -> Result[T, ProviderError]:
        """`run` a change of the VM `vm_id`; however it ends, the VM is read afresh after."""
        try:
            return self.run(doing, action)
        finally:
            self.domains.forget(vm_id)

    def make(
        self, doing: str, action: Callable[[VirConnect], str]
    ) -> Result[CreatedVM, ProviderError]:
        """`run` the making of a VM (Create, Clone) that returns its id; it is read afresh."""
        made = self.run(doing, action)
        if isinstance(made, Success):
            self.domains.forget(made.unwrap())
        return made.map(lambda vm_id: CreatedVM(id=vm_id))
