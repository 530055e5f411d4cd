"""What the contract suite needs of a backend besides its ports."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from returns.result import Result

from pyrigaud.application.backend import Backend
from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import TaskTracker
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import CreateRequest, ImageSource, OwnerMark, VMClass, VMImage
from pyrigaud.domain.tasks import TaskRef, TaskState

from support import ManualClock, ok
from support.transfer import DiskMoves, disk_moves

SETTLE_READS = 600
SETTLE_PAUSE_SECONDS = 0.1

# The ports a backend may lack (Backend's optional fields), by name.
OPTIONAL_PORTS = ("snapshots", "cloning", "images", "disk_transfer")
STAGING_PVC = "contract-pvc"  # the PVC every harness's staging root has mounted
STAGED_FOLDER = "vmmigrations/contract"


def staging_root(directory: Path) -> Path:
    """`directory` as a PVC root with STAGING_PVC mounted in it (made here)."""
    (directory / STAGING_PVC).mkdir(parents=True, exist_ok=True)
    return directory


@dataclass
class Harness:
    backend: Backend
    clock: ManualClock
    image: VMImage  # an image that exists on the backend, for "create from an image"
    # False where running VMs have no guest OS (blank disks), so nothing can report an address.
    guest_reports_addresses: bool = True
    # False where the backend cannot make a blank root disk (vSphere): requests then use `image`.
    blank_images: bool = True
    # What ImagePrepare makes `image` from; None: a copy of the volume at `image.path`.
    prepare_source: ImageSource | None = None
    # The PVC root (PYRIGAUD_MIGRATION_STORAGE_ROOT) transfers stage under, with STAGING_PVC
    # mounted in it; None where the backend has no disk transfer.
    staging_root: Path | None = None
    # False where the hypervisor cannot hold a disk's bytes (libvirt's test driver): ExportDisk
    # and ImportDisk must then answer UNSUPPORTED.
    moves_bytes: bool = True

    def request(self, name: str, **changes: object) -> CreateRequest:
        image = VMImage() if self.blank_images else self.image
        base = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256), image=image)
        return base.model_copy(update=changes)

    def staged_url(self, name: str) -> str:
        """A pvc:// location on the harness's staging PVC, as the manager names one."""
        assert self.staging_root is not None, "this backend was built without staging"
        return f"pvc://{STAGING_PVC}/{STAGED_FOLDER}/{name}"

    def staged_file(self, name: str) -> Path:
        """Where `staged_url(name)` is a file under the staging root."""
        assert self.staging_root is not None, "this backend was built without staging"
        return self.staging_root / STAGING_PVC / STAGED_FOLDER / name

    def moves(self) -> DiskMoves:
        """ExportDisk and ImportDisk over the backend's disk ports, staging on the PVC root."""
        assert self.staging_root is not None, "this backend was built without staging"
        return disk_moves(self.backend, self.staging_root)

    def ownership(self, owner: OwnerMark) -> OwnershipRule:
        """The application's ownership rule over this backend, as Create and Clone use it."""
        return OwnershipRule(
            self.backend.lifecycle, owner, self.clock, LeftoverPolicy(owner=owner), KeyedLock()
        )


def settle(tracker: TaskTracker, task: TaskRef) -> TaskState:
    """The task's final state, asked for until it is done (bounded)."""
    for _ in range(SETTLE_READS):
        state = tracker.task_state(task.id)
        assert state is not None, f"no adapter answers task {task.id!r}"
        if state.done:
            return state
        time.sleep(SETTLE_PAUSE_SECONDS)
    raise AssertionError(f"task {task.id!r} did not finish")


def made(tracker: TaskTracker, started: Result[CreatedVM, ProviderError]) -> str:
    """The id of the VM a start_create or start_clone began, once its task has succeeded."""
    vm = ok(started)
    if vm.task is not None:
        assert settle(tracker, vm.task) == TaskState.succeeded()
    return vm.id
