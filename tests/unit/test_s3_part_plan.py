"""S3 part sizes: any object S3 accepts fits in its 10,000 parts."""

from __future__ import annotations

import itertools

from pyrigaud.adapters.staging.s3_upload import MAX_OBJECT_BYTES, MAX_PARTS, PART_BYTES, part_plan

GiB = 1024**3


def test_a_known_size_gets_the_floor_part_until_it_no_longer_fits() -> None:
    assert part_plan(2 * GiB, PART_BYTES).part_bytes(1) == PART_BYTES
    for size in (160 * GiB, 161 * GiB, 1024 * GiB, MAX_OBJECT_BYTES):
        part = part_plan(size, PART_BYTES).part_bytes(1)
        assert part * MAX_PARTS >= size
        assert part % (1024 * 1024) == 0


def test_an_unknown_size_grows_its_parts_to_hold_the_largest_object() -> None:
    plan = part_plan(None, PART_BYTES)
    sizes = [plan.part_bytes(number) for number in range(1, MAX_PARTS + 1)]
    assert sizes[0] == PART_BYTES
    assert sum(sizes) >= MAX_OBJECT_BYTES  # 5 TiB fits in 10,000 parts
    assert sum(itertools.islice(sizes, 1_000 * 5)) > 160 * GiB  # past the fixed-part cap early
    assert max(sizes) <= 5 * GiB
