"""What a sweep removes of one staging folder's objects, judged by their names alone: this
provider's stale temporaries, and the companions (a disk's hardware manifest) whose object is
gone and not being written."""

from __future__ import annotations

from pyrigaud.domain.staging_names import is_temporary_of, sweepable, temporary_name

OWNER = "ns/provider"
NOW = 1_800_000_000
MANIFEST = ".hardware.json"


def temporary(final_name: str, owner: str = OWNER, started_at: float = NOW) -> str:
    return temporary_name(final_name, owner, started_at, "0a1b2c3d")


def swept(names: list[str], suffixes: tuple[str, ...] = (MANIFEST,)) -> tuple[list[str], ...]:
    return sweepable(names, OWNER, NOW - 60, suffixes)


def test_a_manifest_whose_disk_is_gone_is_swept_and_one_whose_disk_is_there_stays() -> None:
    names = ["a.qcow2", "a.qcow2.hardware.json", "b.qcow2.hardware.json", "notes.txt"]
    assert swept(names) == ([], ["b.qcow2.hardware.json"])


def test_a_manifest_whose_disk_is_being_written_stays_whoever_writes_it() -> None:
    for writer in (OWNER, "ns/other-replica"):
        names = ["a.qcow2.hardware.json", temporary("a.qcow2", writer)]
        assert swept(names) == ([], [])


def test_a_manifest_whose_disk_is_re_written_stays_and_the_temporary_is_kept() -> None:
    names = ["a.qcow2", "a.qcow2.hardware.json", temporary("a.qcow2")]
    assert swept(names) == ([], [])


def test_a_manifest_goes_with_the_stale_temporary_of_its_dead_export() -> None:
    stale = temporary("a.qcow2", started_at=NOW - 3600)
    assert swept(["a.qcow2.hardware.json", stale]) == ([stale], ["a.qcow2.hardware.json"])


def test_only_the_disk_named_exactly_keeps_its_manifest() -> None:
    names = [
        "a.qcow2.hardware.json",
        "a.qcow",  # a shorter name
        "a.qcow2.bak",  # a longer one
        temporary("a.qcow2.bak"),  # the temporary of another disk
        temporary("a.qcow2.hardware.json"),  # the manifest's own write in flight
    ]
    assert swept(names) == ([], ["a.qcow2.hardware.json"])


def test_a_temporary_is_nobodys_companion_and_other_objects_are_left_alone() -> None:
    names = [temporary("gone.qcow2"), ".hardware.json", "gone.qcow2.json", "plain.raw"]
    assert swept(names) == ([], [])
    assert swept([temporary("gone.qcow2")], suffixes=(".part",)) == ([], [])


def test_with_no_companion_suffix_nothing_but_temporaries_is_swept() -> None:
    stale = temporary("a.qcow2", started_at=NOW - 3600)
    assert swept(["b.qcow2.hardware.json", stale], suffixes=()) == ([stale], [])


def test_a_name_read_as_the_companion_of_several_objects_stays_while_any_is_there() -> None:
    names = ["a.qcow2", "a.qcow2.hardware.json"]
    assert swept(names, suffixes=(".json", MANIFEST)) == ([], [])
    assert swept(names[1:], suffixes=(".json", MANIFEST)) == ([], ["a.qcow2.hardware.json"])


def test_the_temporary_of_a_long_name_cut_short_is_still_its_own() -> None:
    long_name = "x" * 240  # with its manifest suffix still a name a file system takes
    cut = temporary(long_name)
    assert long_name not in cut  # the mark would not fit after the whole name
    assert is_temporary_of(cut, long_name)
    assert not is_temporary_of(cut, "x" * 200)
    assert swept([long_name + MANIFEST, cut]) == ([], [])
