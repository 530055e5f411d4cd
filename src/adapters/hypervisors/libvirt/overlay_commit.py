"""An overlay merged into the image under it by QEMU's block commit, on a running domain.

The newest overlay (the disk's active layer) is an active commit: QEMU copies it down while
the guest writes on, mirrors the writes until both agree (the job is ready), and the disk is
pivoted onto the image. An older overlay (a newer one grew on it) is a plain commit, which
ends by itself; the overlay above it then rests on the image. The job is polled on the clock,
bounded; one that overruns is cancelled and the disk stays on its overlay.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from functools import partial

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import best_effort, caught
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.application.ports import Clock
from pyrigaud.domain.errors import ProviderError

COMMIT_POLL_SECONDS = 0.05
COMMIT_TIMEOUT_SECONDS = 3600  # bounded, yet room for merging a large overlay
# How QEMU answers a pivot asked for before the active commit is ready.
NOT_READY_CODES = frozenset({libvirt.VIR_ERR_BLOCK_COPY_ACTIVE, libvirt.VIR_ERR_OPERATION_INVALID})


def committed(
    guest: Guest, target: str, top: str, base: str, clock: Clock
) -> Result[None, ProviderError]:
    """Overlay `top` of disk `target` merged into `base`, the image under it; an overlay
    the disk no longer reads needs nothing."""
    chain = _chain(guest, target)
    if top not in chain:
        return Success(None)
    dom = guest.dom
    if chain[0] == top:
        dom.blockCommit(target, base, None, 0, libvirt.VIR_DOMAIN_BLOCK_COMMIT_ACTIVE)
    else:
        dom.blockCommit(target, base, top, 0, 0)
    return _waited(guest, target, top, active=chain[0] == top, clock=clock)


def _waited(
    guest: Guest, target: str, top: str, *, active: bool, clock: Clock
) -> Result[None, ProviderError]:
    dom = guest.dom
    deadline = clock.now() + COMMIT_TIMEOUT_SECONDS
    while True:
        info = dom.blockJobInfo(target, 0)
        if not info:
            break  # a plain commit ended (or an active one was cancelled by someone)
        caught_up = active and info.get("cur") == info.get("end")  # ready, or about to be
        if caught_up and _pivoted(guest, target):
            break
        if clock.now() > deadline:
            best_effort(partial(dom.blockJobAbort, target, 0))
            return Failure(
                ProviderError.unavailable(
                    f"merging overlay {top!r} of VM {guest.name!r} took over "
                    f"{COMMIT_TIMEOUT_SECONDS}s; cancelled, the snapshot is kept"
                )
            )
        clock.sleep(COMMIT_POLL_SECONDS)
    if top in _chain(guest, target):
        return Failure(
            ProviderError.failed_precondition(
                f"QEMU did not merge overlay {top!r} of VM {guest.name!r}; the snapshot is kept"
            )
        )
    return Success(None)


def _pivoted(guest: Guest, target: str) -> bool:
    """Whether the disk is now on the image (not while QEMU says the job is not ready)."""

    def not_ready(error: libvirt.libvirtError) -> ProviderError | None:
        if error_code(error) in NOT_READY_CODES:
            return ProviderError.unavailable(error.get_error_message() or "not ready")
        return None

    def pivot() -> Result[bool, ProviderError]:
        guest.dom.blockJobAbort(target, libvirt.VIR_DOMAIN_BLOCK_JOB_ABORT_PIVOT)
        return Success(True)

    return caught(pivot, not_ready).value_or(False)


def _chain(guest: Guest, target: str) -> list[str]:
    """The files disk `target` of the running domain reads, its active layer first."""
    root = ET.fromstring(guest.dom.XMLDesc(0))  # noqa: S314 - libvirt's own output
    for disk in root.iterfind("devices/disk"):
        named = disk.find("target")
        if named is None or named.get("dev") != target:
            continue
        chain: list[str] = []
        layer: ET.Element | None = disk
        while layer is not None and (source := layer.find("source")) is not None:
            chain.append(source.get("file", ""))
            layer = layer.find("backingStore")
        return chain
    return []
