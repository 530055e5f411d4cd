"""The libvirt package's one edge: libvirt's exceptions and its files' become Failure values."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import libvirt
import pytest
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import caught
from pyrigaud.adapters.hypervisors.libvirt.connection import prepare_libvirt_for_process
from pyrigaud.adapters.hypervisors.libvirt.errors import host_qemu_img_refusal
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
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


def test_the_host_qemu_img_refusing_a_disk_is_told_in_qemu_s_words() -> None:
    """libvirt's message when the host's qemu-img fails (an overlay on a landed qcow2 whose
    header qemu refuses): qemu's reason, not libvirt's command line."""
    said = host_qemu_img_refusal(
        "internal error: Child process (/usr/bin/qemu-img create -f qcow2 -b /pool/in.qcow2 "
        "-o backing_fmt=qcow2,compat=1.1 /pool/vm-root.qcow2 1024K) unexpected exit status 1: "
        "qemu-img: /pool/vm-root.qcow2: qcow2 header exceeds cluster size\n"
        "Could not open backing image.\n"
    )
    assert said == (
        "the host's qemu-img cannot read the disk image: /pool/vm-root.qcow2: qcow2 header "
        "exceeds cluster size; Could not open backing image."
    )
    assert host_qemu_img_refusal("internal error: Child process (/usr/bin/dnsmasq) failed") is None
