"""One fuzz case judged twice: by pyrigaud's image judge (InspectingJudge, fed the image as
an import streams it) and by qemu-img, the oracle, run under the process limits the provider
runs it under (run_qemu_img).

The two disagree when the judge accepts an image that qemu-img refuses (`check` finds it
corrupt, or `convert -O raw` fails), or one whose disk, as pyrigaud's own path would land it,
is not the disk qemu-img reads: a streamOptimized vmdk is decoded by pyrigaud's streaming
decoder (vCenter's exports, and what the judge's full decode reads); a qcow2 or sparse vmdk is
read through qemu's map of it (vSphere's import) and otherwise kept or converted by qemu
itself. A judge stricter than qemu, and a landing that refuses an image, are no disagreement:
the import then fails cleanly, with INVALID_SPEC."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.inspection import InspectingJudge
from pyrigaud.adapters.disk_images.qemu_img import (
    CONVERSION_ADDRESS_SPACE_BYTES,
    QemuImgLimits,
    run_qemu_img,
)
from pyrigaud.adapters.disk_images.qemu_map import MappedDisk, mapped_disk
from pyrigaud.adapters.disk_images.stream_optimized import decode_stream_optimized
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, JudgedImage
from pyrigaud.domain.errors import ProviderError

from fuzz.recipes import Recipe
from fuzz.seeds import SEED_FORMATS, seed_image
from support.disk_image import chunked, file_chunks

# The largest disk the judge accepts here: big enough for every header size the mutations
# make around the seeds' 4 MiB, small enough that qemu-img's raw copy stays cheap.
MAX_VIRTUAL_BYTES = 64 * 1024 * 1024
# Each qemu-img run's bounds: the provider's own (1 GiB of address space and 30 s of CPU
# to judge, 2 GiB to convert), and a wall-clock limit a hundred times what a seed image's run
# takes: a mutant's run past it counts as qemu-img refusing the mutant.
QEMU_IMG_SECONDS = 10.0
_CHECK_LIMITS = QemuImgLimits(wall_seconds=QEMU_IMG_SECONDS)
_CONVERT_LIMITS = QemuImgLimits(
    address_space_bytes=CONVERSION_ADDRESS_SPACE_BYTES,
    file_size_bytes=MAX_VIRTUAL_BYTES + 1024 * 1024,
    wall_seconds=QEMU_IMG_SECONDS,
)
# How the judge and qemu-img may disagree, and each one's short name (regression files').
RAISED = "the judge raised"
UNREADABLE = "the judge accepts what qemu-img cannot read"
CORRUPT = "the judge accepts what qemu-img check finds corrupt"
OTHER_SIZE = "the judge's virtual size is not the disk qemu-img reads"
OTHER_DISK = "the disk pyrigaud lands is not the disk qemu-img reads"
SHORT_NAMES = {
    RAISED: "raised",
    UNREADABLE: "unreadable",
    CORRUPT: "corrupt",
    OTHER_SIZE: "other-size",
    OTHER_DISK: "other-disk",
}


@dataclass(frozen=True)
class Outcome:
    """A case's verdicts: `disagreement` says how the judge and qemu-img differ, or is None."""

    judge: str
    qemu: str
    disagreement: str | None
    judge_accepted: bool


class _NoCaller:
    """The transfer watch of a run no caller stops."""

    def add(self, count: int) -> Result[None, ProviderError]:
        return Success(None)

    def check(self) -> Result[None, ProviderError]:
        return Success(None)


def judged(image: bytes, chunk_bytes: int) -> Result[JudgedImage, ProviderError]:
    """The judge's verdict, fed as an import feeds it: its first look once the first
    JUDGED_PREFIX_BYTES passed (or the whole of a shorter image), then the whole image's."""
    inspection = InspectingJudge(MAX_VIRTUAL_BYTES).inspect(len(image), "source_url")
    fed, first = 0, None
    for piece in chunked(image, chunk_bytes):
        inspection.feed(piece)
        fed += len(piece)
        if first is None and fed >= JUDGED_PREFIX_BYTES:
            first = inspection.first_look()
    first = first if first is not None else inspection.first_look()
    return first.bind(lambda _: inspection.verdict())


def outcome(recipe: Recipe) -> Outcome:
    image = recipe.applied(seed_image(recipe.seed_image))
    try:
        verdict = judged(image, recipe.chunk_bytes)
    except Exception as error:  # a crash of the judge is a disagreement of its own
        return Outcome(f"raised {error!r}", "not asked", RAISED, judge_accepted=False)
    match verdict:
        case Failure(refusal):
            return Outcome(f"refuses: {refusal.message}", "not asked", None, judge_accepted=False)
        case Success(accepted):
            pass
    said = f"accepts a {accepted.format} of {accepted.virtual_size_bytes} bytes"
    if accepted.format == "raw":  # read as raw by everyone: nothing for qemu to disagree on
        return Outcome(said, "not asked", None, judge_accepted=True)
    with tempfile.TemporaryDirectory(prefix="pyrigaud-fuzz-") as folder:
        path = Path(folder) / "image"
        path.write_bytes(image)
        found = _against_qemu(path, accepted, said, Path(folder))
    # qemu-img names the image by its (temporary) path: a regression case keeps the same words.
    return replace(found, qemu=found.qemu.replace(str(path), "image"))


def _against_qemu(path: Path, accepted: JudgedImage, said: str, folder: Path) -> Outcome:
    raw = folder / "disk.raw"
    unread = _qemu_convert(path, accepted.format, raw)
    if unread is not None:
        return Outcome(said, unread, UNREADABLE, True)
    corrupt = _qemu_check(path, accepted.format, folder)
    if corrupt is not None:
        return Outcome(said, corrupt, CORRUPT, True)
    qemu = f"reads a disk of {raw.stat().st_size} bytes"
    if raw.stat().st_size != accepted.virtual_size_bytes:
        return Outcome(said, qemu, OTHER_SIZE, True)
    match _landed(path, accepted, folder):
        case Failure(error):  # pyrigaud's landing refuses it: stricter than qemu
            return Outcome(f"{said}; its landing refuses: {error.message}", qemu, None, True)
        case Success(bytes() as disk) if disk != raw.read_bytes():
            return Outcome(said, qemu, OTHER_DISK, True)
    return Outcome(said, qemu, None, True)


def _qemu_check(path: Path, disk_format: str, folder: Path) -> str | None:
    """qemu-img check's refusal, or None: leaked clusters alone (exit status 3) are no
    refusal; qemu reads such an image whole and right. A dirty qcow2 (lazy refcounts, its
    VM stopped before they were written) is checked as qemu opens it for writing: its
    refcounts rebuilt first (`-r all`, on a copy), so only what that repair leaves counts."""
    report = folder / "check.json"
    repair: list[str] = []
    if disk_format == "qcow2" and _dirty(path):
        path = Path(shutil.copyfile(path, folder / "repaired.qcow2"))
        repair = ["-r", "all"]
    with report.open("w+b") as output:
        checked = run_qemu_img(
            ["check", *repair, "--output=json", "-f", disk_format, str(path)],
            doing="checking a fuzzed image",
            watch=None,
            limits=_CHECK_LIMITS,
            output=output,
        )
    match checked:
        case Failure(error):
            return _corruption(report, error)
    return None


def _dirty(path: Path) -> bool:
    """The qcow2's dirty bit (incompatible feature bit 0; version 3 headers only)."""
    with path.open("rb") as image:
        header = image.read(80)
    if len(header) < 80 or struct.unpack_from(">I", header, 4)[0] < 3:
        return False
    return bool(struct.unpack_from(">Q", header, 72)[0] & 1)


def _corruption(report: Path, error: ProviderError) -> str | None:
    """What a failed check found, unless it found leaks alone (or it could not open the
    image: its own reason then)."""
    try:
        found = json.loads(report.read_text())
    except ValueError:
        return f"check: {error.message}"
    if found.get("corruptions", 0) or found.get("check-errors", 0):
        return f"check: {error.message}"
    return None


def _qemu_convert(path: Path, disk_format: str, raw: Path) -> str | None:
    converted = run_qemu_img(
        ["convert", "-f", disk_format, "-O", "raw", str(path), str(raw)],
        doing="reading a fuzzed image whole",
        watch=None,
        limits=_CONVERT_LIMITS,
    )
    match converted:
        case Failure(error):
            return f"convert: {error.message}"
    return None


def _landed(path: Path, accepted: JudgedImage, folder: Path) -> Result[bytes | None, ProviderError]:
    """The disk as pyrigaud's own path reads it; None where qemu-img converts it instead."""
    if accepted.stream_optimized_vmdk:
        return decode_stream_optimized(file_chunks(path)).consumed_by(b"".join)
    with path.open("rb") as image_file:
        mapped = mapped_disk(image_file, accepted, str(folder), _NoCaller())
        match mapped:
            case Success(MappedDisk() as read):
                return read.chunks.consumed_by(b"".join)
    return mapped.map(lambda _: None)


@dataclass(frozen=True)
class Classified:
    """A case's outcome; for a disagreement, its signature (the image format, the structure
    mutated and how the verdicts differ) and the smallest recipe that shows it: a single one
    of the case's mutations when that alone disagrees the same way."""

    outcome: Outcome
    signature: str | None
    recipe: Recipe
    name: str  # a file name for its regression case: format, structure, disagreement


def classified(recipe: Recipe) -> Classified:
    found = outcome(recipe)
    if found.disagreement is None:
        return Classified(found, None, recipe, "")
    smallest, shown = recipe, found
    if len(recipe.mutations) > 1:
        for mutation in recipe.mutations:
            alone = outcome(recipe.alone(mutation))
            if alone.disagreement == found.disagreement:
                smallest, shown = recipe.alone(mutation), alone
                break
    kinds = " + ".join(sorted({mutation.kind for mutation in smallest.mutations}))
    image_format = SEED_FORMATS[recipe.seed_image]
    words = f"{image_format} {kinds} {SHORT_NAMES[found.disagreement]}"
    name = "-".join("".join(c if c.isalnum() else " " for c in words.lower()).split())
    return Classified(shown, f"{image_format}: {kinds}: {found.disagreement}", smallest, name)
