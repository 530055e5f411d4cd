"""The names of staged objects still being written, so a sweep can tell which are abandoned.

A writer never writes under the final name: it writes `.<name>.<owner>.<start>.<token>.part`
beside it and renames it when complete. The owner mark (percent-encoded, dots too, so it is one
dot-free part) says which provider made it; the start time (Unix seconds) says how old it is.
A sweep removes only its own marks older than any transfer can still be running.

An object may have companions staged beside it, named after it (`<name><suffix>`: a disk's
hardware manifest). A companion whose object is gone, and is not being written either, is left
over: the manager removes a migration's staged disk, never what is staged beside it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from urllib.parse import quote, unquote

SUFFIX = ".part"
MAX_NAME_BYTES = 255  # NAME_MAX of POSIX and NFS file systems
TEMPORARY = re.compile(r"\.(?P<owner>[^./]+)\.(?P<start>[0-9]{1,12})\.(?P<token>[0-9a-f]{8})\.part")
_TRAILING_MARK = re.compile(TEMPORARY.pattern + r"\Z")


def temporary_name(final_name: str, owner: str, started_at: float, token: str) -> str:
    """The name a writer of `final_name` uses until it commits (`token`: 8 hex digits)."""
    return _marked(final_name, f".{_encoded(owner)}.{int(started_at)}.{token}{SUFFIX}")


def _marked(final_name: str, mark: str) -> str:
    """`final_name` hidden and marked, cut short where the mark would not fit in a name."""
    room = MAX_NAME_BYTES - len(mark.encode()) - 1
    visible = final_name.encode()[: max(room, 0)].decode(errors="ignore")
    return f".{visible}{mark}"


def _mark_of(name: str) -> re.Match[str] | None:
    """The temporary mark that ends `name`, if `name` is a temporary (whoever's)."""
    return _TRAILING_MARK.search(name) if name.startswith(".") else None


def temporary_started_at(name: str, owner: str) -> int | None:
    """When the temporary `name` was started, if it is one of `owner`'s; else None."""
    match = _mark_of(name)
    if match is None or unquote(match.group("owner")) != owner:
        return None
    return int(match.group("start"))


def is_temporary_of(name: str, final_name: str) -> bool:
    """Whether `name` is a temporary of `final_name`, whoever's (another replica's write is in
    flight as much as ours)."""
    match = _mark_of(name)
    return match is not None and name == _marked(final_name, match.group())


def sweepable(
    names: Collection[str], owner: str, deadline: float, companion_suffixes: Sequence[str]
) -> tuple[list[str], list[str]]:
    """What a sweep removes of the objects one folder holds (`names`): `owner`'s temporaries
    started at `deadline` or before, and the companions (`<object><suffix>`, for a suffix of
    `companion_suffixes`) whose object is gone once those temporaries are. A companion stays
    while its object exists under its final name or a temporary of it is left (a write in
    flight, which may put the companion first); a name read as a companion of several objects
    (suffixes that end alike) stays while any of them is there."""
    stale = [
        name
        for name in sorted(names)
        if (started := temporary_started_at(name, owner)) is not None and started <= deadline
    ]
    left = set(names).difference(stale)
    in_flight = [name for name in left if _mark_of(name) is not None]

    def gone(staged: str) -> bool:
        return staged not in left and not any(is_temporary_of(name, staged) for name in in_flight)

    orphans = []
    for name in sorted(left):
        if _mark_of(name) is not None:
            continue  # a temporary is never anyone's companion
        staged = [name[: -len(suffix)] for suffix in companion_suffixes if name.endswith(suffix)]
        if staged and all(staged_name and gone(staged_name) for staged_name in staged):
            orphans.append(name)
    return stale, orphans


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
