"""An image fed to the image judge as the import streams it."""

from __future__ import annotations

from pathlib import Path

from returns.result import Result

from pyrigaud.adapters.disk_images.inspection import InspectingJudge
from pyrigaud.adapters.disk_images.qcow2_tables import Qcow2TableCheck
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, JudgedImage
from pyrigaud.domain.errors import ProviderError

from support.disk_image import file_chunks

BOUND = 62 * 1024**4  # bytes of virtual size the judge accepts


def judged(
    path: Path, bound: int = BOUND, chunk: int = 64 * 1024
) -> Result[JudgedImage, ProviderError]:
    """The image at `path` fed as a stream: first look after the judged prefix, then the
    verdict after the last byte (the first refusal wins)."""
    inspection = InspectingJudge(bound).inspect(path.stat().st_size, "source_url")
    fed, first = 0, None
    for piece in file_chunks(path, chunk):
        inspection.feed(piece)
        fed += len(piece)
        if first is None and fed >= JUDGED_PREFIX_BYTES:
            first = inspection.first_look()
    first = first if first is not None else inspection.first_look()
    return first.bind(lambda early: inspection.verdict().map(lambda late: (early, late)[1]))


def table_check_fed(image: bytes, chunk_bytes: int) -> Qcow2TableCheck:
    """A kept qcow2's table check, fed `image` in pieces of `chunk_bytes` as an import would."""
    check = Qcow2TableCheck()
    for start in range(0, len(image), chunk_bytes):
        check.feed(image[start : start + chunk_bytes])
    return check
