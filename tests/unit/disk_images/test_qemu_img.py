"""qemu-img run bounded: its refusals name the staged image with qemu's reason, its limits
hold, a run whose caller is gone is killed at once, and one with no room left to write is the
pod's resource, not the image, exhausted."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.disk_images.qemu_img import QemuImgLimits, run_qemu_img
from pyrigaud.application.cancellation import serving_call
from pyrigaud.application.transfer_progress import TransferProgress
from pyrigaud.domain.errors import ErrorKind, ProviderError

from support import CountingWatch, error_of, ok
from support.disk_image import qemu_img
from support.small_filesystem import small_filesystem
from support.transfer import staged


def test_an_image_qemu_refuses_is_bad_input_with_qemus_reason(tmp_path: Path) -> None:
    image = tmp_path / "corrupt.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    header = bytearray(image.read_bytes())
    (l1_offset,) = struct.unpack_from(">Q", header, 40)
    struct.pack_into(">Q", header, 40, l1_offset + 8)  # no longer cluster-aligned
    image.write_bytes(bytes(header))

    refused = error_of(
        run_qemu_img(["info", "-f", "qcow2", str(image)], doing="judging", watch=None)
    )

    assert refused.kind is ErrorKind.INVALID_SPEC
    assert refused.message.startswith("source_url: qemu-img refuses the image: ")
    assert "L1 table" in refused.message


def test_a_run_within_its_limits_answers_qemus_output(tmp_path: Path) -> None:
    image = tmp_path / "fine.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    assert '"format": "qcow2"' in ok(
        run_qemu_img(["info", "--output=json", str(image)], doing="judging", watch=None)
    )


def test_a_run_past_its_address_space_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "fine.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    tiny = QemuImgLimits(address_space_bytes=16 * 1024**2)
    refused = error_of(run_qemu_img(["info", str(image)], doing="judging", watch=None, limits=tiny))
    assert refused.kind is ErrorKind.INVALID_SPEC


def test_a_conversion_whose_transfer_says_stop_is_killed_at_once(tmp_path: Path) -> None:
    """The transfer's watch says stop while qemu-img converts: the answer is the watch's
    UNAVAILABLE, not the limits' (ten minutes away), and qemu-img is gone with it."""
    source = tmp_path / "big.raw"
    out = tmp_path / "out"
    qemu_img("create", "-f", "raw", source, "64G")  # sparse: converting it reads for long
    watch = CountingWatch(stop_at=3)
    stopped = run_qemu_img(
        ["convert", "-f", "raw", "-O", "raw", "-S", "0", str(source), str(out)],
        doing="converting",
        watch=watch,
        limits=QemuImgLimits(cpu_seconds=600, wall_seconds=600),
    )
    assert error_of(stopped) == ProviderError.unavailable("the transfer's caller is gone")
    assert watch.questions == 3
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _converts(pid, out)]


def _converts(pid: str, out: Path) -> bool:
    """Whether process `pid` is a qemu-img writing `out`."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile
        return False
    return str(out).encode() in arguments and any(b"qemu-img" in a for a in arguments)


def test_a_transfer_watch_says_stop_once_the_rpcs_caller_is_gone() -> None:
    """What the use cases hand in: their progress, over the RPC's cancellation scope."""
    progress = TransferProgress("export of VM 'web'", staged("pvc://m/web.qcow2"), SystemClock())
    gone = False
    with serving_call(lambda: not gone):
        assert ok(progress.check()) is None
        gone = True
        stopped = error_of(progress.check())
    assert stopped.kind is ErrorKind.UNAVAILABLE
    assert stopped.message.startswith("export of VM 'web' stopped")


def test_a_conversion_with_no_room_left_is_resource_exhausted_not_the_images_fault(
    tmp_path: Path,
) -> None:
    """The pod's file system running out of room says nothing of the image: whatever the
    caller would call a refusal, it is RESOURCE_EXHAUSTED, with qemu's reason."""
    source = tmp_path / "data.raw"
    source.write_bytes(os.urandom(4 * 1024**2))
    with small_filesystem(1024**2) as small:
        full = error_of(
            run_qemu_img(
                ["convert", "-f", "raw", "-O", "qcow2", str(source), str(small / "out.qcow2")],
                doing="converting",
                watch=None,
                refused=ProviderError.failed_precondition,
            )
        )
    assert full.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert full.message.startswith("converting: no room left: ")
    assert "No space left on device" in full.message
