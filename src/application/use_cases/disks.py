"""GetDiskInfo: what a VM's disk is. (Its moves are `export_disk.py` and `import_disk.py`.)"""

from __future__ import annotations

from returns.result import Result

from pyrigaud.application.ports.disk_transfer import DiskFacts
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskDetails, DiskQuery


class GetDiskInfo:
    def __init__(self, disks: DiskFacts) -> None:
        self._disks = disks

    def __call__(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self._disks.disk_details(query)
