"""libvirt errors -> ProviderError kinds, in one table keyed by libvirt's error code."""

from __future__ import annotations

import re
from collections.abc import Mapping

import libvirt

from pyrigaud.domain.errors import ErrorKind, ProviderError

KIND_BY_CODE: Mapping[int, ErrorKind] = {
    libvirt.VIR_ERR_NO_DOMAIN: ErrorKind.NOT_FOUND,
    libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT: ErrorKind.NOT_FOUND,
    libvirt.VIR_ERR_NO_STORAGE_VOL: ErrorKind.NOT_FOUND,
    libvirt.VIR_ERR_NO_STORAGE_POOL: ErrorKind.NOT_FOUND,
    libvirt.VIR_ERR_NO_NETWORK: ErrorKind.NOT_FOUND,
    libvirt.VIR_ERR_NO_DOMAIN_METADATA: ErrorKind.NOT_FOUND,
    libvirt.VIR_ERR_OPERATION_INVALID: ErrorKind.FAILED_PRECONDITION,
    libvirt.VIR_ERR_OPERATION_FAILED: ErrorKind.FAILED_PRECONDITION,
    libvirt.VIR_ERR_RESOURCE_BUSY: ErrorKind.FAILED_PRECONDITION,
    libvirt.VIR_ERR_OPERATION_ABORTED: ErrorKind.FAILED_PRECONDITION,
    libvirt.VIR_ERR_AGENT_UNRESPONSIVE: ErrorKind.FAILED_PRECONDITION,
    libvirt.VIR_ERR_SNAPSHOT_REVERT_RISKY: ErrorKind.FAILED_PRECONDITION,
    libvirt.VIR_ERR_OPERATION_UNSUPPORTED: ErrorKind.UNSUPPORTED,
    libvirt.VIR_ERR_NO_SUPPORT: ErrorKind.UNSUPPORTED,
    libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED: ErrorKind.UNSUPPORTED,
    libvirt.VIR_ERR_CONFIG_UNSUPPORTED: ErrorKind.UNSUPPORTED,
    libvirt.VIR_ERR_OPERATION_TIMEOUT: ErrorKind.UNAVAILABLE,
    libvirt.VIR_ERR_SYSTEM_ERROR: ErrorKind.UNAVAILABLE,
    libvirt.VIR_ERR_NO_CONNECT: ErrorKind.UNAVAILABLE,
    libvirt.VIR_ERR_INVALID_CONN: ErrorKind.UNAVAILABLE,
    libvirt.VIR_ERR_RPC: ErrorKind.UNAVAILABLE,
    libvirt.VIR_ERR_AUTH_FAILED: ErrorKind.UNAVAILABLE,
    libvirt.VIR_ERR_AUTH_UNAVAILABLE: ErrorKind.UNAVAILABLE,
    libvirt.VIR_ERR_INVALID_ARG: ErrorKind.INVALID_SPEC,
    libvirt.VIR_ERR_XML_ERROR: ErrorKind.INVALID_SPEC,
    libvirt.VIR_ERR_XML_DETAIL: ErrorKind.INVALID_SPEC,
    libvirt.VIR_ERR_DOM_EXIST: ErrorKind.ALREADY_EXISTS,
    libvirt.VIR_ERR_STORAGE_VOL_EXIST: ErrorKind.ALREADY_EXISTS,
    libvirt.VIR_ERR_NO_MEMORY: ErrorKind.RESOURCE_EXHAUSTED,
}

# Codes that mean "the thing looked up is not there": callers turn these into None / NOT_FOUND.
MISSING_CODES = frozenset(
    code for code, kind in KIND_BY_CODE.items() if kind is ErrorKind.NOT_FOUND
)

# Codes a dead connection shows up as; whether it *is* dead is then asked of the connection.
CONNECTION_LOSS_CODES = frozenset(
    {
        libvirt.VIR_ERR_SYSTEM_ERROR,
        libvirt.VIR_ERR_INTERNAL_ERROR,
        libvirt.VIR_ERR_INVALID_CONN,
        libvirt.VIR_ERR_NO_CONNECT,
        libvirt.VIR_ERR_RPC,
    }
)


# A driver that cannot do the asked variant of a call answers with one of these.
REFUSED_VARIANT_CODES = frozenset(
    {
        libvirt.VIR_ERR_INVALID_ARG,
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
        libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
        libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
        libvirt.VIR_ERR_OPERATION_INVALID,
    }
)


def error_code(error: libvirt.libvirtError) -> int:
    code = error.get_error_code()
    return int(code) if code is not None else libvirt.VIR_ERR_INTERNAL_ERROR


def is_missing(error: libvirt.libvirtError) -> bool:
    return error_code(error) in MISSING_CODES


# A code the table does not name (libvirt's VIR_ERR_INTERNAL_ERROR among them: a child process
# such as the host's qemu-img that failed, a monitor that answered oddly) is libvirt refusing
# the operation as things stand: FAILED_PRECONDITION, with libvirt's reason, so the manager
# neither retries it blindly nor counts it against the provider's circuit breaker.
UNNAMED_CODE_KIND = ErrorKind.FAILED_PRECONDITION


# How libvirt tells that a program it ran on the host failed (virCommandRun), with that
# program's own words after the colon: "Child process (/usr/bin/qemu-img create ... ) unexpected
# exit status 1: qemu-img: <file>: qcow2 header exceeds cluster size".
HOST_QEMU_IMG_FAILED = re.compile(
    r"Child process \(\S*qemu-img [^)]*\) unexpected exit status \d+: (?P<said>.*)", re.DOTALL
)


def provider_error(error: libvirt.libvirtError, doing: str) -> ProviderError:
    """The ProviderError for a libvirt failure while `doing` something (a code the table does
    not name: UNNAMED_CODE_KIND)."""
    message = error.get_error_message() or str(error)
    refused = host_qemu_img_refusal(message)
    if refused is not None:
        return ProviderError.failed_precondition(f"{doing}: {refused}")
    kind = KIND_BY_CODE.get(error_code(error), UNNAMED_CODE_KIND)
    return ProviderError(kind=kind, message=f"{doing}: {message}")


def host_qemu_img_refusal(message: str) -> str | None:
    """The host's qemu-img refusing a disk libvirt had it read (an overlay on a landed image, a
    volume's copy or conversion), told in qemu's words; None for any other message. The disk
    is there but qemu cannot read it (corrupt, unreadable): a state of the disk, not a failure
    of the provider, whatever code libvirt gave it (VIR_ERR_INTERNAL_ERROR)."""
    found = HOST_QEMU_IMG_FAILED.search(message)
    if found is None:
        return None
    lines = (line.strip() for line in found["said"].splitlines())
    said = "; ".join(line.removeprefix("qemu-img: ") for line in lines if line)
    return f"the host's qemu-img cannot read the disk image: {said}"
