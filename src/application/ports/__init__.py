"""The ports: one small Protocol per concern, implemented by adapters."""

from pyrigaud.application.ports.clock import Clock
from pyrigaud.application.ports.cloning import Cloning
from pyrigaud.application.ports.credentials import Credentials
from pyrigaud.application.ports.disk_transfer import DiskTransfer
from pyrigaud.application.ports.health import CapabilitySource, Health
from pyrigaud.application.ports.images import Images
from pyrigaud.application.ports.inventory import Inventory
from pyrigaud.application.ports.power import PowerControl
from pyrigaud.application.ports.snapshots import Snapshots
from pyrigaud.application.ports.staging import (
    StagedFile,
    StagedReader,
    StagedWriter,
    StagingStorage,
)
from pyrigaud.application.ports.tasks import TaskTracker
from pyrigaud.application.ports.vm_lifecycle import VMLifecycle

__all__ = [
    "CapabilitySource",
    "Clock",
    "Cloning",
    "Credentials",
    "DiskTransfer",
    "Health",
    "Images",
    "Inventory",
    "PowerControl",
    "Snapshots",
    "StagedFile",
    "StagedReader",
    "StagedWriter",
    "StagingStorage",
    "TaskTracker",
    "VMLifecycle",
]
