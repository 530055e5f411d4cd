"""What every port module shares, and its way into the package's edge (calls.py).

A LibvirtHost is a context, not a connection (that is connection.py): the connection, the
clock, the domain cache and the settings the port modules act with. A port method hands `run`
what to do with the live connection: an action that returns its own expected failures as
values and lets libvirt's exceptions rise to the edge, which makes them Failures too.
Mutations go through `mutate` or `make`, so that Describe and ListVMs on this replica read
the VM afresh afterwards (read your writes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from returns.converters import flatten
from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.calls import Caught
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection, VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_cache import DomainCache
from pyrigaud.adapters.hypervisors.libvirt.errors import provider_error
from pyrigaud.adapters.hypervisors.libvirt.host_capabilities import domain_type_for
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings, VolumeWriter
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")
Action = Callable[[VirConnect], Result[T, ProviderError]]


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

    def run(self, doing: str, action: Action[T]) -> Result[T, ProviderError]:
        """`action` on the live connection, at the edge: a libvirtError says what was `doing`."""
        with self.edge(doing) as edge:
            return flatten(self.connection.call(action))
        return edge.failure

    def read_through_cache(self, doing: str, action: Action[T]) -> Result[T, ProviderError]:
        """`run` for a read the domain cache may answer: `action` counts its own call into
        libvirt (`count_round_trip`) when it reads libvirt; a cache hit makes none."""
        with self.edge(doing) as edge:
            return flatten(self.connection.call(action, from_cache=True))
        return edge.failure

    def count_round_trip(self) -> None:
        """A `read_through_cache` action read libvirt: one round trip (or more)."""
        self.connection.count_round_trip()

    def run_once(self, doing: str, action: Action[T]) -> Result[T, ProviderError]:
        """`run`, never started over on a reopened connection: for an action that consumes a
        stream of bytes, which a second start would take up part-way."""
        with self.edge(doing) as edge:
            return flatten(self.connection.call(action, once=True))
        return edge.failure

    @staticmethod
    def edge(doing: str) -> Caught:
        """The edge as a `with` block for work `doing` something: any libvirtError as the
        ProviderError of its code, a file's OSError as that file's failure, both saying what was
        `doing`. For work on a connection already in hand, as `attempt`."""
        return Caught(partial(provider_error, doing=doing), files_doing=doing)

    @staticmethod
    def attempt(
        doing: str, action: Callable[[], Result[T, ProviderError]]
    ) -> Result[T, ProviderError]:
        """The edge for work on a connection already in hand (a volume stream being read):
        no call slot taken, no reopening, which would restart a stream part-way. A libvirtError
        or a file's OSError says what was `doing`."""
        with LibvirtHost.edge(doing) as edge:
            return action()
        return edge.failure

    def mutate(self, vm_id: str, doing: str, action: Action[T]) -> Result[T, ProviderError]:
        """`run` a change of the VM `vm_id`; however it ends, the VM is read afresh after."""
        try:
            return self.run(doing, action)
        finally:
            self.domains.forget(vm_id)

    def make(self, doing: str, action: Action[str]) -> Result[CreatedVM, ProviderError]:
        """`run` the making of a VM (Create, Clone) that returns its id; it is read afresh."""
        return self.run(doing, action).map(self._made)

    def _made(self, vm_id: str) -> CreatedVM:
        self.domains.forget(vm_id)
        return CreatedVM(id=vm_id)
