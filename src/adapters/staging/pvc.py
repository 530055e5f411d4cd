"""Staged objects as files on a PVC mounted in the provider's pod.

The manager mounts each migration PVC at `<root>/<pvc>`; `pvc://<pvc>/<path>` is the file
`<root>/<pvc>/<path>`. A writer writes a marked temporary in the same folder, fsyncs it, renames
it over the final name (atomic within one file system) and fsyncs the folder, so a crash leaves
either the old object, the new one, or a temporary for the sweep, never a partial final file.
"""

from __future__ import annotations

import errno
import os
import secrets
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO, TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.rules import StoreContext
from pyrigaud.adapters.staging.streams import CHUNK_BYTES, RunningDigest, TemporaryWriter
from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation, StagedSweep
from pyrigaud.domain.staging_names import sweepable, temporary_name

MIGRATION_STORAGE_ROOT = "/mnt/migration-storage"
FILE_MODE = 0o640
W = TypeVar("W", bound="PvcWriter")


def pvc_store(context: StoreContext) -> PvcStaging:
    """The pvc type's store: every machine can serve it."""
    return PvcStaging(
        root=context.pvc_root,
        owner=context.owner,
        clock=context.clock,
        companion_suffixes=context.companion_suffixes,
    )


@dataclass(frozen=True)
class PvcStaging:
    """Files under `root` (PYRIGAUD_MIGRATION_STORAGE_ROOT), one folder per mounted PVC."""

    root: str = MIGRATION_STORAGE_ROOT
    owner: str = "pyrigaud"
    clock: Clock = field(default_factory=SystemClock)
    chunk_bytes: int = CHUNK_BYTES
    companion_suffixes: tuple[str, ...] = ()  # what the sweep removes once its object is gone

    def open_read(self, location: StagedLocation) -> Result[PvcReader, ProviderError]:
        def opened(path: Path) -> Result[PvcReader, ProviderError]:
            try:
                descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return Failure(ProviderError.not_found(f"no staged object at {location.url}"))
            except OSError as error:
                return Failure(_failure(error, f"cannot open {location.url}"))
            return Success(PvcReader(descriptor, location.url, self.chunk_bytes))

        return self._file(location).bind(opened)

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[PvcWriter, ProviderError]:
        del size_bytes  # a file needs no plan
        return self._temporary(location, PvcWriter)

    def open_file(self, location: StagedLocation) -> Result[PvcFile, ProviderError]:
        """The temporary itself, to be written in place: a PVC is a local file system."""
        return self._temporary(location, PvcFile)

    def _temporary(self, location: StagedLocation, kind: type[W]) -> Result[W, ProviderError]:
        """A `kind` over a new marked temporary beside the location's file, its folders
        made."""
        started = self.clock.now()

        def made_folders(final: Path) -> Result[Path, ProviderError]:
            try:
                final.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                return Failure(_failure(error, f"cannot write {location.url}"))
            # The folders made must still be inside the PVC.
            return Result.do(final for _ in self._file(location))

        def opened(final: Path) -> Result[W, ProviderError]:
            temporary = final.with_name(
                temporary_name(final.name, self.owner, started, secrets.token_hex(4))
            )
            flags = kind.ACCESS | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            try:
                descriptor = os.open(temporary, flags, FILE_MODE)
            except OSError as error:
                return Failure(_failure(error, f"cannot write {location.url}"))
            return Success(kind(descriptor, temporary, final, location.url))

        return self._file(location).bind(made_folders).bind(opened)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        """This provider's abandoned temporaries anywhere on the location's PVC, and the
        companions there whose object is gone (`sweepable`, folder by folder)."""
        deadline = self.clock.now() - older_than_seconds

        def swept(mount: Path) -> Result[int, ProviderError]:
            removed = 0
            for folder, _, names in os.walk(mount):
                stale, orphans = sweepable(names, self.owner, deadline, self.companion_suffixes)
                for name in (*stale, *orphans):
                    try:
                        os.unlink(os.path.join(folder, name))
                        removed += 1
                    except FileNotFoundError:
                        pass  # another replica swept it first
                    except OSError as error:
                        return Failure(_failure(error, f"cannot sweep {location.url}"))
            return Success(removed)

        return self._mount(location).bind(swept)

    def sweep_mounted(self, older_than_seconds: float) -> StagedSweep:
        """`sweep` on every PVC mounted under the root: what a periodic sweep can find with
        no request to name a location. A PVC that cannot be swept is reported and does not
        stop the others."""
        try:
            mounts = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        except FileNotFoundError:
            return StagedSweep()  # no PVC mounted at all
        except OSError as error:
            return StagedSweep(failures=(_failure(error, f"cannot list {self.root}"),))
        removed, failures = 0, []
        for name in mounts:
            location = StagedLocation(
                staging_type=PVC,
                field="sweep",
                url=f"pvc://{name}/",
                container=name,
                key="sweep",
            )
            match self.sweep(location, older_than_seconds):
                case Failure(error):
                    failures.append(error)
                case Success(count):
                    removed += count
        return StagedSweep(removed=removed, failures=tuple(failures))

    def _mount(self, location: StagedLocation) -> Result[Path, ProviderError]:
        mount = Path(self.root, location.container)
        if not mount.is_dir():
            return Failure(
                ProviderError.failed_precondition(
                    f"PVC {location.container!r} is not mounted at {mount}"
                )
            )
        return Success(mount)

    def _file(self, location: StagedLocation) -> Result[Path, ProviderError]:
        """The location's file, refused if a symbolic link takes it out of its PVC."""
        return self._mount(location).bind(partial(self._inside, location))

    def _inside(self, location: StagedLocation, mount: Path) -> Result[Path, ProviderError]:
        real_mount = Path(os.path.realpath(mount))
        target = mount.joinpath(*location.key.split("/"))
        real_target = Path(os.path.realpath(target))
        if not real_mount.is_relative_to(os.path.realpath(self.root)) or not (
            real_target.is_relative_to(real_mount) and real_target != real_mount
        ):
            return Failure(
                ProviderError.invalid_spec(location.field, "leaves its PVC through a symbolic link")
            )
        if real_target.is_dir():
            return Failure(ProviderError.invalid_spec(location.field, "names a folder"))
        return Success(target)


class PvcReader:
    def __init__(self, descriptor: int, url: str, chunk_bytes: int) -> None:
        self._descriptor = descriptor
        self._url = url
        self._chunk_bytes = chunk_bytes
        self._digest = RunningDigest()
        self.size_bytes: int | None = os.fstat(descriptor).st_size

    def read_chunk(self) -> Result[bytes, ProviderError]:
        try:
            chunk = os.read(self._descriptor, self._chunk_bytes)
        except OSError as error:
            return Failure(_failure(error, f"cannot read {self._url}"))
        self._digest.add(chunk)
        return Success(chunk)

    def digest(self) -> StagedDigest:
        return self._digest.value()

    def close(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1


class PvcWriter(TemporaryWriter):
    ACCESS = os.O_WRONLY

    def __init__(self, descriptor: int, temporary: Path, final: Path, url: str) -> None:
        super().__init__(url)
        self._file = self._opened(descriptor)  # closed on commit or abort
        self._temporary = temporary
        self._final = final

    @staticmethod
    def _opened(descriptor: int) -> BinaryIO:
        return open(descriptor, "wb")

    def _write(self, chunk: bytes) -> Result[None, ProviderError]:
        try:
            self._file.write(chunk)
        except OSError as error:
            return Failure(_failure(error, f"cannot write {self.url}"))
        return Success(None)

    def _commit(self) -> Result[None, ProviderError]:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._temporary, self._final)
            folder = os.open(self._final.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError as error:
            return Failure(_failure(error, f"cannot write {self.url}"))
        return Success(None)

    def _abort(self) -> Result[None, ProviderError]:
        self._file.close()
        try:
            self._temporary.unlink(missing_ok=True)
        except OSError as error:
            return Failure(_failure(error, f"cannot remove the partial copy of {self.url}"))
        return Success(None)


class PvcFile(PvcWriter):
    """A temporary the caller writes in place (`file`, at any offset); what it holds at commit
    is read back once and hashed, since it was not written in order."""

    ACCESS = os.O_RDWR

    @staticmethod
    def _opened(descriptor: int) -> BinaryIO:
        return open(descriptor, "r+b")

    @property
    def file(self) -> BinaryIO:
        return self._file

    def _commit(self) -> Result[None, ProviderError]:
        digest = RunningDigest()
        try:
            self._file.flush()
            self._file.seek(0)
            while chunk := self._file.read(CHUNK_BYTES):
                digest.add(chunk)
        except OSError as error:
            return Failure(_failure(error, f"cannot read back {self.url}"))
        self._digest = digest
        return super()._commit()


def _failure(error: OSError, what: str) -> ProviderError:
    """An OSError as this provider's kind: the one place this module's exceptions become
    values."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return ProviderError.resource_exhausted(f"{what}: {reason}")
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ProviderError.failed_precondition(f"{what}: {reason}")
    return ProviderError.unavailable(f"{what}: {reason}")
