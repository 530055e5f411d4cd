"""One libvirt domain as the port modules use it: lookup, facts and metadata, power, hot-add.

libvirt's domain object answers in raw calls and error codes; a Guest answers in what pyrigaud
means (its persistent facts, its metadata, whether it runs) and returns the failures a user
can act on as Failure values; libvirt's own exceptions rise to the edge (calls.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import (
    best_effort,
    caught,
    or_none,
    refusal,
)
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_cache import RUNNING_STATES
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DomainFacts, dimm_xml, parse_domain
from pyrigaud.adapters.hypervisors.libvirt.errors import (
    CONNECTION_LOSS_CODES,
    MISSING_CODES,
    REFUSED_VARIANT_CODES,
    error_code,
)
from pyrigaud.adapters.hypervisors.libvirt.metadata import (
    NAMESPACE_PREFIX,
    NAMESPACE_URI,
    VMMetadata,
    metadata_from_text,
)
from pyrigaud.application.ports import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import VMChanges, VMRecord
from pyrigaud.domain.power import PowerState

VirDomain = Any
T = TypeVar("T")

logger = logging.getLogger(__name__)

SHUTDOWN_REQUEST_ATTEMPTS = 2
SHUTDOWN_RETRY_SECONDS = 0.5


def power_of(state: int) -> PowerState:
    return PowerState.ON if state in RUNNING_STATES else PowerState.OFF


@dataclass(frozen=True)
class Waiting:
    """A change a running VM cannot take now: why, and what a power cycle would change."""

    reason: str
    what: str  # "CPUs" or "memory"


def blockers(waiting: list[Waiting]) -> str:
    return "; ".join(f"{item.reason}; power off to change {item.what}" for item in waiting)


class Guest:
    """A persistent domain, whose id is its UUID."""

    def __init__(self, dom: VirDomain) -> None:
        self.dom = dom

    # --- lookups ----------------------------------------------------------------------------

    @classmethod
    def lookup(cls, conn: VirConnect, vm_id: str) -> Guest | None:
        """The domain with UUID `vm_id`; anything that is not a UUID names nothing."""
        try:
            canonical = str(uuid.UUID(vm_id))
        except ValueError:
            return None
        if canonical != vm_id.lower():
            return None
        dom = or_none(
            partial(conn.lookupByUUIDString, canonical),
            MISSING_CODES | {libvirt.VIR_ERR_INVALID_ARG},
        )
        return None if dom is None else cls(dom)

    @classmethod
    def by_id(cls, conn: VirConnect, vm_id: str) -> Result[Guest, ProviderError]:
        guest = cls.lookup(conn, vm_id)
        if guest is None:
            return Failure(ProviderError.vm_not_found(vm_id))
        return Success(guest)

    @classmethod
    def by_name(cls, conn: VirConnect, name: str) -> Guest | None:
        dom = or_none(partial(conn.lookupByName, name))
        return None if dom is None else cls(dom)

    # --- what it is -------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return str(self.dom.UUIDString())

    @property
    def name(self) -> str:
        return str(self.dom.name())

    def inactive_xml(self) -> str:
        return str(self.dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))

    def facts(self) -> DomainFacts:
        """The persistent configuration: what the VM is (and will be after its next boot)."""
        return parse_domain(self.inactive_xml())

    def record(self) -> VMRecord:
        """What a name lookup reports: the owner mark and the building mark, never a verdict."""
        facts = self.facts()
        metadata = facts.metadata
        return VMRecord(
            id=self.id,
            name=facts.name,
            owner=metadata.owner if metadata else None,
            building_since=metadata.building_since if metadata else None,
        )

    def metadata(self) -> VMMetadata | None:
        """Our element as libvirt's metadata API returns it (the XML carries the same)."""
        text = or_none(
            partial(
                self.dom.metadata,
                libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                NAMESPACE_URI,
                libvirt.VIR_DOMAIN_AFFECT_CONFIG,
            )
        )
        return None if text is None else metadata_from_text(str(text))

    def own_metadata(self) -> Result[VMMetadata, ProviderError]:
        metadata = self.metadata()
        if metadata is None:
            return Failure(
                ProviderError.failed_precondition(
                    f"VM {self.name!r} was not made by pyrigaud; it has no place for pyrigaud's "
                    "state"
                )
            )
        return Success(metadata)

    def write_metadata(self, metadata: VMMetadata) -> None:
        """Into the definition, and the running domain's too while it runs; a domain that
        stops between the check and the write (a guest powering off) keeps the definition's."""
        live = libvirt.VIR_DOMAIN_AFFECT_CONFIG | libvirt.VIR_DOMAIN_AFFECT_LIVE
        if not self.dom.isActive():
            self._set_metadata(metadata, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
            return
        stopped = refusal(
            partial(self._set_metadata, metadata, live),
            {libvirt.VIR_ERR_OPERATION_INVALID},
            unless=self.dom.isActive,
        )
        if stopped is not None:
            self._set_metadata(metadata, libvirt.VIR_DOMAIN_AFFECT_CONFIG)

    def _set_metadata(self, metadata: VMMetadata, flags: int) -> None:
        self.dom.setMetadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT,
            metadata.render(),
            NAMESPACE_PREFIX,
            NAMESPACE_URI,
            flags,
        )

    def undefine(self) -> None:
        """Undefine with snapshot metadata (and NVRAM for UEFI, where the driver allows it)."""
        base = libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        with_nvram = base | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
        if (
            self.facts().firmware == "UEFI"
            and refusal(partial(self.dom.undefineFlags, with_nvram), REFUSED_VARIANT_CODES) is None
        ):
            return
        self.dom.undefineFlags(base)

    # --- power ------------------------------------------------------------------------------

    def state(self) -> int:
        return int(self.dom.state()[0])

    def is_running(self) -> bool:
        return self.state() in RUNNING_STATES

    def start(self) -> None:
        """Whatever Off state the domain is in, bring it to running."""
        state = self.state()
        if state in RUNNING_STATES:
            return
        if state == libvirt.VIR_DOMAIN_PAUSED:
            self.dom.resume()
        elif state == libvirt.VIR_DOMAIN_PMSUSPENDED:
            self.dom.pMWakeup(0)
        else:
            if self.dom.isActive():  # crashed but kept: restart it
                self.dom.destroy()
            self.dom.create()

    def stop(self) -> None:
        """Power off at once, if it runs at all."""
        if self.dom.isActive():
            self.dom.destroy()

    def reboot(self) -> None:
        """A running guest reboots (reset where it cannot be asked); any other starts."""
        if not self.is_running():
            self.start()
            return
        if refusal(partial(self.dom.reboot, 0), REFUSED_VARIANT_CODES) is not None:
            self.dom.reset(0)  # no ACPI / agent in the guest: a reset is the fallback

    def ask_to_shut_down(self, clock: Clock) -> None:
        """Ask the guest (agent, else ACPI) to shut down, if it runs.

        QEMU refuses the request while the domain leaves the running state for a moment (e.g.
        just after a snapshot revert): it is asked once more, after a pause on `clock`, and if
        it is refused again the recorded deadline's forced power-off still ends the shutdown.
        """
        for attempt in range(SHUTDOWN_REQUEST_ATTEMPTS):
            if not self.is_running():
                return
            refused = refusal(self.dom.shutdown, {libvirt.VIR_ERR_OPERATION_INVALID})
            if refused is None:
                return
            logger.warning("VM %s refused a shutdown request: %s", self.dom.name(), refused.message)
            if attempt + 1 < SHUTDOWN_REQUEST_ATTEMPTS:
                clock.sleep(SHUTDOWN_RETRY_SECONDS)

    # --- devices ----------------------------------------------------------------------------

    def hot_add(self, changes: VMChanges) -> list[Waiting]:
        """Hot-add within the headroom set at create (vCPUs, memory DIMMs); returns what waits
        for the next boot, and why. Nothing is removed live: shrinking waits too."""
        live = parse_domain(self.dom.XMLDesc(0))
        waiting: list[Waiting] = []
        if changes.cpu is not None and changes.cpu != live.vcpus:
            cpu = changes.cpu
            waiting += _hot_add(
                Waiting(_cpu_blocker(live, cpu), "CPUs"),
                partial(self.dom.setVcpusFlags, cpu, libvirt.VIR_DOMAIN_AFFECT_LIVE),
            )
        if changes.memory_mib is not None and changes.memory_mib != live.memory_mib:
            dimm = dimm_xml(changes.memory_mib - live.memory_mib)
            waiting += _hot_add(
                Waiting(_memory_blocker(live, changes.memory_mib), "memory"),
                partial(self.dom.attachDeviceFlags, dimm, libvirt.VIR_DOMAIN_AFFECT_LIVE),
            )
        return waiting

    def attach_disk(self, xml: str, target: str, flags: int) -> Result[None, ProviderError]:
        """A refusal (no free PCI slot or root port, a bus that cannot hot-plug) names the disk."""
        now = "now" if flags & libvirt.VIR_DOMAIN_AFFECT_LIVE else "in its definition"

        def refused(error: libvirt.libvirtError) -> ProviderError | None:
            if error_code(error) in CONNECTION_LOSS_CODES and not self.dom.connect().isAlive():
                return None  # the connection went: the call is tried again on a new one
            return ProviderError.failed_precondition(
                f"the VM cannot take disk {target} {now} ({error.get_error_message()}); "
                "power it off to add the disk"
            )

        def attached() -> Result[None, ProviderError]:
            self.dom.attachDeviceFlags(xml, flags)
            return Success(None)

        return caught(attached, refused)

    def detach_live(self, xml: str) -> None:
        """Take back a device attached live, as far as the guest lets it (best effort)."""
        best_effort(partial(self.dom.detachDeviceFlags, xml, libvirt.VIR_DOMAIN_AFFECT_LIVE))


def guest_action(
    vm_id: str, act: Callable[[VirConnect, Guest], Result[T, ProviderError]]
) -> Callable[[VirConnect], Result[T, ProviderError]]:
    """The action on a connection that finds the VM `vm_id` (NOT_FOUND when there is none)
    and does `act` with the connection and it."""

    def action(conn: VirConnect) -> Result[T, ProviderError]:
        return Guest.by_id(conn, vm_id).bind(partial(act, conn))

    return action


def _hot_add(blocked: Waiting, attempt: Callable[[], object]) -> list[Waiting]:
    """`blocked.reason` empty: try it; a hypervisor that refuses makes it wait as well."""
    if blocked.reason:
        return [blocked]
    refused = refusal(attempt, REFUSED_VARIANT_CODES)
    if refused is None:
        return []
    return [Waiting(f"the hypervisor refused: {refused.message}", blocked.what)]


def _cpu_blocker(live: DomainFacts, cpu: int) -> str:
    if cpu < live.vcpus:
        return "CPUs are not removed from a running VM"
    if live.max_vcpus <= live.vcpus:
        return "CPU hot-add disabled"
    if cpu > live.max_vcpus:
        return f"CPU hot-add goes up to {live.max_vcpus}"
    return ""


def _memory_blocker(live: DomainFacts, memory_mib: int) -> str:
    if memory_mib < live.memory_mib:
        return "memory is not removed from a running VM"
    if not live.max_memory_mib:
        return "memory hot-add disabled"
    if memory_mib > live.max_memory_mib:
        return f"memory hot-add goes up to {live.max_memory_mib} MiB"
    if not live.free_memory_slots:
        return "every memory hot-add slot is used"
    return ""
