"""Input bounds: every value the manager sends must fit the wire (int32 fields) and sanity.

Anything outside these is an invalid spec naming the field; docs/contract.md lists them.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 128
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

MIN_CPU, MAX_CPU = 1, 1024
MIN_MEMORY_MIB, MAX_MEMORY_MIB = 1, 16 * 1024 * 1024  # 1 MiB .. 16 TiB
MAX_DISK_GIB = 64 * 1024  # 64 TiB
MAX_DISKS = 32
MAX_NICS = 16
MAX_CLOUD_INIT_BYTES = 1024 * 1024  # user-data and meta-data, each
MAX_JSON_PAYLOAD_BYTES = 4 * 1024 * 1024  # one *_json field
MAX_STRING_LENGTH = 64 * 1024  # one string inside a payload
MAX_TAGS, MAX_TAG_LENGTH = 64, 256
MAX_VLAN = 4094
MAX_PCI_SLOT = 255
MAX_HARDWARE_VERSION = 1000
DEFAULT_ROOT_DISK_GIB = 20
# An IANA zone name ("UTC", "Europe/Berlin", "America/Argentina/Salta"): never a path.
TIME_ZONE_PATTERN = re.compile(r"[A-Za-z0-9_+-]{1,32}(/[A-Za-z0-9_+-]{1,32}){0,2}")
DNS_LABEL_PATTERN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_DNS_NAME_LENGTH = 253


def describe_value(value: object, limit: int = 64) -> str:
    """A short, printable rendering of user input for error messages (never the whole payload)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def name_problem(name: str) -> str | None:
    """Why `name` is not an acceptable VM/snapshot/image name, or None when it is."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"must be at most {MAX_NAME_LENGTH} characters"
    if NAME_PATTERN.fullmatch(name) is None:
        return (
            f"{describe_value(name)} must be letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return None
