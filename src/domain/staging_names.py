"""The names of staged objects still being written, so a sweep can tell which are abandoned.

A writer never writes under the final name: it writes `.<name>.<owner>.<start>.<token>.part`
beside it and renames it when complete. The owner mark (percent-encoded, dots too, so it is one
dot-free part) says which provider made it; the start time (Unix seconds) says how old it is.
A sweep removes only its own marks older than any transfer can still be running.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

SUFFIX = ".part"
MAX_NAME_BYTES = 255  # NAME_MAX of POSIX and NFS file systems
TEMPORARY = re.compile(r"\.(?P<owner>[^./]+)\.(?P<start>[0-9]{1,12})\.(?P<token>[0-9a-f]{8})\.part")


def temporary_name(final_name: str, owner: str, started_at: float, token: str) -> str:
    """The name a writer of `final_name` uses until it commits (`token`: 8 hex digits)."""
    mark = f".{_encoded(owner)}.{int(started_at)}.{token}{SUFFIX}"
    room = MAX_NAME_BYTES - len(mark.encode()) - 1
    visible = final_name.encode()[: max(room, 0)].decode(errors="ignore")
    return f".{visible}{mark}"


def temporary_started_at(name: str, owner: str) -> int | None:
    """When the temporary `name` was started, if it is one of `owner`'s; else None."""
    match = TEMPORARY.search(name)
    if not name.startswith(".") or match is None or match.end() != len(name):
        return None
    if unquote(match.group("owner")) != owner:
        return None
    return int(match.group("start"))


def _encoded(owner: str) -> str:
    return quote(owner, safe="").replace(".", "%2E")


# A transfer's temporary volume in a hypervisor's pool (a flattened export, a staged import):
# `xfer.<owner>.<start>.<token>.<purpose>.<format>`, so the sweep finds its own stale ones.
TRANSFER_VOLUME = re.compile(
    r"xfer\.(?P<owner>[^./]+)\.(?P<start>[0-9]{1,12})\.(?P<token>[0-9a-f]{8})\.[a-z]+\.[a-z0-9]+"
)


def transfer_volume_name(
    owner: str, started_at: float, token: str, purpose: str, disk_format: str
) -> str:
    """The name of a temporary volume `purpose` (export, import, ...) of `disk_format`."""
    return f"xfer.{_encoded(owner)}.{int(started_at)}.{token}.{purpose}.{disk_format}"


def transfer_volume_started_at(name: str, owner: str) -> int | None:
    """When the temporary volume `name` was started, if it is one of `owner`'s; else None."""
    match = TRANSFER_VOLUME.fullmatch(name)
    if match is None or unquote(match.group("owner")) != owner:
        return None
    return int(match.group("start"))
