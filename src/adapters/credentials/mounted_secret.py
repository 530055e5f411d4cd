"""Credentials from a mounted Secret: a directory holding one file per key (the production path).

Kubernetes writes each version of a Secret volume into a fresh hidden directory
(`..2026_12_02_12_00_00.123456789/`), publishes it by atomically replacing the `..data` symlink,
and removes the old directory; the top-level names are symlinks `key -> ..data/key`. Reading
every file from the directory `..data` points at, then checking that `..data` still points
there, yields one whole version and never a mix of two. A plain directory without `..data` (a
docker bind mount) works too; there a change is noticed from the files' inode, size and mtime.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pyrigaud.adapters.credentials.secret_values import SecretValues

DEFAULT_DIRECTORY = Path("/etc/virtrigaud/credentials")
DATA_LINK = "..data"
# A version swapped (or removed) mid-read is read again; a bound keeps a churning mount from
# holding callers forever.
_READ_ATTEMPTS = 5

_log = logging.getLogger(__name__)

# `..data`'s target, or for a plain directory each file's (name, inode, size, mtime).
_Version = str | tuple[tuple[str, int, int, int], ...]


@dataclass(frozen=True)
class _Snapshot:
    version: _Version | None
    values: SecretValues


class MountedSecretCredentials:
    """Serves the last complete version read; while nothing changed, current() costs one
    readlink (a plain directory: one scandir and a stat per key).

    Empty until the directory has been readable once. When it vanishes or cannot be read, the
    last good set is kept and one warning is logged (keys and paths only, never values).
    """

    def __init__(
        self, directory: Path = DEFAULT_DIRECTORY, on_reload: Callable[[], None] = lambda: None
    ) -> None:
        """`on_reload` is told each time a changed version replaces a set already served."""
        self._directory = directory
        self._on_reload = on_reload
        self._lock = threading.Lock()
        self._snapshot = _Snapshot(None, SecretValues())
        self._readable = True

    def current(self) -> Mapping[str, str]:
        snapshot = self._snapshot
        try:
            if self._version() == snapshot.version:
                return snapshot.values
        except OSError:
            pass  # _reload logs it, once
        with self._lock:
            return self._reload(force=False)

    def refresh(self) -> Mapping[str, str]:
        with self._lock:
            return self._reload(force=True)

    def _reload(self, *, force: bool) -> SecretValues:
        failure: OSError | None = None
        for _ in range(_READ_ATTEMPTS):
            try:
                version = self._version()
                if version == self._snapshot.version and not force:
                    return self._snapshot.values
                values = self._read(version)
                unchanged = self._version() == version
            except OSError as error:
                failure = error
                continue
            if unchanged:
                self._publish(_Snapshot(version, values))
                return values
            failure = None
        return self._keep_last_good(failure)

    def _publish(self, snapshot: _Snapshot) -> None:
        if not self._readable:
            _log.info("credentials directory %s is readable again", self._directory)
        self._readable = True
        if snapshot.values != self._snapshot.values:
            _log.debug(
                "loaded credentials from %s: keys %s",
                self._directory,
                ", ".join(sorted(snapshot.values)),
            )
            if self._snapshot.version is not None:
                self._on_reload()
        self._snapshot = snapshot

    def _keep_last_good(self, failure: OSError | None) -> SecretValues:
        if self._readable:
            reason = (
                "it changed during every read"
                if failure is None
                else failure.strerror or type(failure).__name__
            )
            _log.warning(
                "cannot read credentials directory %s (%s); keeping the last good set (%d keys)",
                self._directory,
                reason,
                len(self._snapshot.values),
            )
        self._readable = False
        return self._snapshot.values

    def _version(self) -> _Version:
        try:
            return os.readlink(self._directory / DATA_LINK)
        except OSError:
            pass  # no `..data` symlink: a plain directory (or none, and scandir raises)
        with os.scandir(self._directory) as entries:
            return tuple(
                sorted(
                    (entry.name, stat.st_ino, stat.st_size, stat.st_mtime_ns)
                    for entry in entries
                    if _is_key(entry)
                    for stat in (entry.stat(),)
                )
            )

    def _read(self, version: _Version) -> SecretValues:
        folder = self._directory / version if isinstance(version, str) else self._directory
        values: dict[str, str] = {}
        with os.scandir(folder) as entries:
            for entry in entries:
                if not _is_key(entry):
                    continue
                try:
                    values[entry.name] = Path(entry.path).read_bytes().decode("utf-8").strip()
                except UnicodeDecodeError:
                    _log.warning("credentials key %s is not UTF-8 text; skipped", entry.name)
        return SecretValues(values)

    def __repr__(self) -> str:
        return f"MountedSecretCredentials(directory={str(self._directory)!r})"


def _is_key(entry: os.DirEntry[str]) -> bool:
    """Hidden names are Kubernetes' bookkeeping (`..data`, version folders), not keys."""
    return not entry.name.startswith(".") and entry.is_file()
