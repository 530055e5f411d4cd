"""qemu-img run bounded: its refusals name the staged image with qemu's reason, its limits
hold, and a run whose caller is gone is killed at once."""

from __future__ import annotations

import struct
import time
from pathlib import Path

from pyrigaud.adapters.disk_images.qemu_img import QemuImgLimits, run_qemu_img
from pyrigaud.application.cancellation import serving_call
from pyrigaud.domain.errors import ErrorKind

from support import error_of, ok
from support.disk_image import qemu_img


def test_an_image_qemu_refuses_is_bad_input_with_qemus_reason(tmp_path: Path) -> None:
    image = tmp_path / "corrupt.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    header = bytearray(image.read_bytes())
    (l1_offset,) = struct.unpack_from(">Q", header, 40)
    struct.pack_into(">Q", header, 40, l1_offset + 8)  # no longer cluster-aligned
    image.write_bytes(bytes(header))

    refused = error_of(run_qemu_img(["info", "-f", "qcow2", str(image)], doing="judging"))

    assert refused.kind is ErrorKind.INVALID_SPEC
    assert refused.message.startswith("source_url: qemu-img refuses the image: ")
    assert "L1 table" in refused.message


def test_a_run_within_its_limits_answers_qemus_output(tmp_path: Path) -> None:
    image = tmp_path / "fine.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    assert '"format": "qcow2"' in ok(
        run_qemu_img(["info", "--output=json", str(image)], doing="judging")
    )


def test_a_run_past_its_address_space_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "fine.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    tiny = QemuImgLimits(address_space_bytes=16 * 1024**2)
    refused = error_of(run_qemu_img(["info", str(image)], doing="judging", limits=tiny))
    assert refused.kind is ErrorKind.INVALID_SPEC


def test_a_conversion_whose_caller_went_away_is_killed_at_once(tmp_path: Path) -> None:
    source = tmp_path / "big.raw"
    qemu_img("create", "-f", "raw", source, "64G")  # sparse: converting it reads for long
    started = time.monotonic()
    with serving_call(lambda: time.monotonic() - started < 0.5):
        stopped = run_qemu_img(
            ["convert", "-f", "raw", "-O", "raw", "-S", "0", str(source), str(tmp_path / "out")],
            doing="converting",
            limits=QemuImgLimits(cpu_seconds=600, wall_seconds=600),
        )
    assert error_of(stopped).kind is ErrorKind.UNAVAILABLE
    assert time.monotonic() - started < 2.5
