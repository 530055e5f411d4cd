"""The libvirt package's one edge: libvirt's exceptions and its files' become Failure values."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import libvirt
import pytest
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.connection import prepare_libvirt_for_process
from pyrigaud.adapters.hypervisors.libvirt.context import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.edge import caught
from pyrigaud.domain.errors import ErrorKind, ProviderError

from support import error_of


@pytest.fixture
def conn() -> Iterator[Any]:
    prepare_libvirt_for_process()  # libvirt prints nothing of its own
    opened = libvirt.open("test:///default")
    yield opened
    opened.close()


def full_disk() -> Result[None, ProviderError]:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_libvirt_error_is_the_failure_of_what_was_being_done(conn: Any) -> None:
    looked_up = LibvirtHost.attempt(
        "look up 'nobody'", lambda: Success(conn.lookupByName("nobody"))
    )
    error = error_of(looked_up)
    assert error.kind is ErrorKind.NOT_FOUND
    assert error.message.startswith("look up 'nobody': ")


def test_a_code_its_describer_does_not_expect_rises_on(conn: Any) -> None:
    with pytest.raises(libvirt.libvirtError):
        caught(lambda: Success(conn.lookupByName("nobody")), lambda _error: None)


def test_a_file_that_cannot_be_written_is_a_failure_naming_why() -> None:
    error = error_of(LibvirtHost.attempt("export disk of 'vm'", full_disk))
    assert error.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert error.message == "export disk of 'vm': No space left on device"


def test_a_file_error_where_no_file_was_expected_is_a_bug_and_rises() -> None:
    with pytest.raises(OSError, match="No space"):
        caught(full_disk, lambda _error: None)
