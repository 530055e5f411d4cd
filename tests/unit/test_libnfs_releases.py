"""Which libnfs the NFS staging binding loads: by soname, from its closed list of releases whose
synchronous API it speaks, and the Debian package scripts/libnfs-package.sh names for each."""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from pyrigaud.adapters.staging.libnfs import (
    RELEASES,
    LibnfsMissingError,
    LibnfsRelease,
    load_first,
    loaded,
)

REPO = Path(__file__).resolve().parents[2]
LIBNFS_PACKAGE = REPO / "scripts" / "libnfs-package.sh"
# Declared by libnfs 5.0's <nfsc/libnfs.h> and exported by its library (the NFS version of a
# mounted share); libnfs 4.0 has no such function.
FIRST_IN_5_0 = "nfs_get_version"


def loader_of(*sonames: str) -> Callable[[str], ctypes.CDLL]:
    """A loader that finds only `sonames` (each the C library itself, a stand-in handle)."""

    def load(soname: str) -> ctypes.CDLL:
        if soname not in sonames:
            raise OSError(f"{soname}: cannot open shared object file")
        return ctypes.CDLL(None)

    return load


def test_the_newest_listed_release_found_is_loaded() -> None:
    release, _ = load_first(RELEASES, loader_of("libnfs.so.13", "libnfs.so.14"))
    assert release == LibnfsRelease("libnfs.so.14", "5.0", "libnfs14")
    release, _ = load_first(RELEASES, loader_of("libnfs.so.13"))
    assert release == LibnfsRelease("libnfs.so.13", "4.0", "libnfs13")


def test_a_libnfs_outside_the_list_is_never_loaded_and_the_error_names_each_package() -> None:
    with pytest.raises(LibnfsMissingError) as raised:
        load_first(RELEASES, loader_of("libnfs.so.16", "libnfs.so"))
    message = str(raised.value)
    for release in RELEASES:
        assert release.soname in message
        assert release.debian_package in message


def test_this_machine_loads_the_libnfs_its_debian_release_installs() -> None:
    release, _ = loaded()
    named = subprocess.run(
        ["sh", str(LIBNFS_PACKAGE)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert named == release.debian_package


def test_the_loaded_soname_is_the_release_its_exported_functions_say() -> None:
    release, lib = loaded()
    assert hasattr(lib, FIRST_IN_5_0) == (release.version == "5.0")


def test_the_typed_functions_set_up_a_context_without_a_server() -> None:
    _, lib = loaded()
    context = lib.nfs_init_context()
    assert context
    try:
        lib.nfs_set_uid(context, 65532)
        lib.nfs_set_gid(context, 65532)
        assert lib.nfs_set_version(context, 3) == 0
        assert lib.nfs_set_version(context, 2) < 0  # libnfs speaks NFSv3 and v4 only
        lib.nfs_set_timeout(context, 30_000)
        lib.nfs_set_autoreconnect(context, 0)
    finally:
        lib.nfs_destroy_context(context)


@pytest.mark.parametrize(
    ("codename", "package"), [("bookworm", "libnfs13"), ("trixie", "libnfs14"), ("forky", None)]
)
def test_the_package_helper_names_a_listed_release_or_refuses(
    codename: str, package: str | None
) -> None:
    answer = subprocess.run(
        ["sh", str(LIBNFS_PACKAGE), codename], capture_output=True, text=True, check=False
    )
    if package is None:
        assert answer.returncode != 0
        assert codename in answer.stderr
    else:
        assert answer.stdout.strip() == package
        assert package in {release.debian_package for release in RELEASES}
