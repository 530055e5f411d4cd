"""Telling zeros from data, which every disk conversion does for each block it passes: the
blocks that hold data come out whole and in place, the zero ones are left out (or left as holes
in a scratch file) without being copied."""

from __future__ import annotations

import os
import tempfile

import pytest

from pyrigaud.adapters.disk_images.blocks import MAX_CHUNK_BYTES, all_zero, nonzero_blocks
from pyrigaud.adapters.disk_images.scratch import spool_sparse

from support import ok

LENGTHS = [
    0,
    1,
    4096,
    MAX_CHUNK_BYTES - 1,
    MAX_CHUNK_BYTES,
    MAX_CHUNK_BYTES + 1,
    3 * MAX_CHUNK_BYTES - 5,
]


@pytest.mark.parametrize("length", LENGTHS)
def test_zeros_of_any_length_and_kind_are_all_zero(length: int) -> None:
    for data in (bytes(length), bytearray(length), memoryview(bytes(length))):
        assert all_zero(data)


@pytest.mark.parametrize("length", [n for n in LENGTHS if n])
def test_one_byte_anywhere_is_data(length: int) -> None:
    for at in sorted({0, length // 2, length - 1, min(MAX_CHUNK_BYTES, length - 1)}):
        data = bytearray(length)
        data[at] = 1
        assert not all_zero(data), at
        assert not all_zero(memoryview(data)), at


def test_blocks_holding_data_come_out_whole_and_in_place_across_chunk_edges() -> None:
    block = 4096
    disk = bytearray(10 * block + 100)  # the last block is partial: padded with zeros
    disk[block * 2 + 7] = 1
    disk[block * 5 - 1] = 2  # the last byte of block 4
    disk[block * 10 + 99] = 3
    chunks = [bytes(disk[at : at + 3000]) for at in range(0, len(disk), 3000)]

    blocks = ok(nonzero_blocks(chunks, len(disk), block).consumed_by(list))

    padded = bytes(disk) + bytes(block - 100)
    assert [index for index, _ in blocks] == [2, 4, 10]
    for index, data in blocks:
        assert data == padded[index * block : (index + 1) * block]


def test_spooled_zero_chunks_are_holes_and_read_as_zeros() -> None:
    data = os.urandom(1024**2)
    chunks = [bytes(1024**2), data, bytes(8 * 1024**2), bytes(100)]
    with tempfile.TemporaryFile() as file:
        spool_sparse(chunks, file)
        file.seek(0)
        assert file.read() == b"".join(chunks)
        # Only the data chunk took room (a file system may round it up to a block or two).
        assert os.fstat(file.fileno()).st_blocks * 512 < 2 * 1024**2
