"""The stream both hypervisor adapters hand ExportDisk: an image made whole first is made once,
in the caller's file or in scratch, and what the read holds is released as the read ended."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.scratch import given_or_scratch
from pyrigaud.adapters.hypervisors.disk_streams import ChunkStream, TransferStoppedError
from pyrigaud.domain.chunks import Chunks
from pyrigaud.domain.errors import ProviderError

from support import error_of, ok

IMAGE = b"QFI\xfb" + bytes(range(256)) * 1024


def held() -> tuple[contextlib.ExitStack, list[type[BaseException] | None]]:
    """Holds that record how they were released: None when completed, else what stopped."""
    holds, released = contextlib.ExitStack(), []

    def release(kind: type[BaseException] | None, *_: object) -> None:
        released.append(kind)

    holds.push(release)
    return holds, released


def made_stream(
    holds: contextlib.ExitStack, fails: ProviderError | None = None
) -> tuple[ChunkStream, list[str]]:
    """A stream whose image is made whole first, its tables (the first bytes) written last;
    the list says where each making wrote."""
    made_in: list[str] = []

    def make(given: BinaryIO | None) -> Result[BinaryIO, ProviderError]:
        made_in.append("scratch" if given is None else "the caller's file")
        if fails is not None:
            return Failure(fails)
        file = given_or_scratch(given, None, holds)
        file.seek(4)
        file.write(IMAGE[4:])
        file.seek(0)
        file.write(IMAGE[:4])
        return Success(file)

    return ChunkStream(make, None, holds, read_as_it_is), made_in


def read_as_it_is(read: Callable[[], Result[bytes, ProviderError]]) -> Result[bytes, ProviderError]:
    """An edge where nothing raises."""
    return read()


def read_all(stream: ChunkStream) -> bytes:
    chunks = []
    while chunk := ok(stream.read_chunk()):
        chunks.append(chunk)
    return b"".join(chunks)


def test_an_image_made_in_the_callers_file_leaves_nothing_to_read() -> None:
    holds, released = held()
    stream, made_in = made_stream(holds)
    assert stream.made_whole_first
    with tempfile.TemporaryFile() as staged:
        ok(stream.make(staged))
        staged.seek(0)
        assert staged.read() == IMAGE
    assert ok(stream.read_chunk()) == b""
    stream.close()
    assert made_in == ["the caller's file"]
    assert released == [None]  # completed: a lease is not aborted


def test_an_image_read_without_a_file_is_made_once_in_scratch_at_the_first_read() -> None:
    holds, released = held()
    stream, made_in = made_stream(holds)
    size_before = stream.size_bytes
    assert size_before is None  # not known before it is made
    assert read_all(stream) == IMAGE
    assert stream.size_bytes == len(IMAGE)
    stream.close()
    assert made_in == ["scratch"]
    assert released == [None]


def test_a_failed_making_is_told_and_what_the_read_held_is_released_as_stopped() -> None:
    holds, released = held()
    stream, _ = made_stream(holds, fails=ProviderError.unavailable("the lease was lost"))
    assert error_of(stream.make(None)).message == "the lease was lost"
    stream.close()
    assert released == [TransferStoppedError]


def test_a_stream_cut_short_ends_its_reads_with_its_failure_and_the_read_stops() -> None:
    """A codec's chunks (`Chunks`) end early at their failure: the read after the last chunk
    answers it, and what the read held is released as stopped, not completed."""
    holds, released = held()
    cut = ProviderError.invalid_spec("source", "the vmdk ends inside a grain")
    chunks = Chunks([Success(b"first"), Success(b"second"), Failure(cut)])
    stream = ChunkStream(chunks, None, holds, read_as_it_is)
    assert [ok(stream.read_chunk()), ok(stream.read_chunk())] == [b"first", b"second"]
    assert error_of(stream.read_chunk()) == cut
    stream.close()
    assert released == [TransferStoppedError]
