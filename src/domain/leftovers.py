"""When a half-built VM counts as abandoned (docs/operating.md, "Crash safety").

A Create marks its VM as building before making anything, with its start time. A mark older
than the manager's Create deadline belongs to a Create that can no longer be running, so the VM
is a leftover of a crash; a younger one may be another replica's work in progress.
"""

from __future__ import annotations

from pyrigaud.domain.models import OwnerMark, Value, VMRecord

CREATE_DEADLINE_SECONDS = 300.0  # the manager's client deadline for Create
TRANSFER_DEADLINE_SECONDS = 1800.0  # the manager's client deadline for ExportDisk/ImportDisk


class LeftoverPolicy(Value):
    owner: OwnerMark
    abandoned_after_seconds: float = CREATE_DEADLINE_SECONDS
    # A transfer's temporaries: twice the transfer deadline, a killed call's libvirt copy may
    # still be finishing in libvirtd.
    transfer_abandoned_after_seconds: float = 2 * TRANSFER_DEADLINE_SECONDS

    def is_ours_unfinished(self, record: VMRecord) -> bool:
        return record.owner == self.owner and record.building_since is not None

    def is_abandoned(self, record: VMRecord, now: float) -> bool:
        """Ours, unfinished, and begun longer ago than any Create can still be running."""
        return (
            self.is_ours_unfinished(record)
            and record.building_since is not None
            and now - record.building_since >= self.abandoned_after_seconds
        )
