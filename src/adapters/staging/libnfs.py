"""A small ctypes binding to libnfs's synchronous API (libnfs 4.0 and 5.0: Debian 12 and 13).

Only what staging needs: one NFSv3 mount per session with the AUTH_SYS uid/gid, open/create,
pread/pwrite, fstat, fsync, rename, unlink and a folder listing. Signatures follow
<nfsc/libnfs.h>: every call returns 0 (or a byte count) on success and -errno on failure, with
a text from nfs_get_error. ctypes releases the GIL during each call, so a slow server stalls
only the thread talking to it.

The library is chosen by its soname, from a closed list of releases whose <nfsc/libnfs.h>
declares every function below exactly so: libnfs 5.0 (soname 14) changed only the raw RPC
layer (a server callback's arguments) and added functions, its high-level synchronous API is
4.0's (soname 13). libnfs 6 reordered pread/pwrite/read/write ("API v2": buffer before count
and offset), and a binding that loaded such a library by guess would corrupt memory rather
than fail, so a soname outside the list is never loaded.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

NFS_VERSION = 3  # libnfs 4.0 writes over NFSv3 only
TIMEOUT_MILLISECONDS = 30_000  # per RPC; whole seconds, as libnfs requires


@dataclass(frozen=True)
class LibnfsRelease:
    """A libnfs this binding speaks: the soname it is loaded by, its upstream release and the
    Debian package that ships it (scripts/libnfs-package.sh picks that package by release)."""

    soname: str
    version: str
    debian_package: str

    def __str__(self) -> str:
        return f"{self.soname} (libnfs {self.version}, Debian's {self.debian_package})"


# Newest first: where both are installed, the newer one is loaded.
RELEASES = (
    LibnfsRelease("libnfs.so.14", "5.0", "libnfs14"),  # Debian 13 (trixie)
    LibnfsRelease("libnfs.so.13", "4.0", "libnfs13"),  # Debian 12 (bookworm)
)

Handle = ctypes.c_void_p


class NfsStat64(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "nfs_dev",
            "nfs_ino",
            "nfs_mode",
            "nfs_nlink",
            "nfs_uid",
            "nfs_gid",
            "nfs_rdev",
            "nfs_size",
            "nfs_blksize",
            "nfs_blocks",
            "nfs_atime",
            "nfs_mtime",
            "nfs_ctime",
            "nfs_atime_nsec",
            "nfs_mtime_nsec",
            "nfs_ctime_nsec",
            "nfs_used",
        )
    ]


class NfsDirent(ctypes.Structure):
    """The leading fields of `struct nfsdirent`; only the name is read."""

    _fields_ = [("next", ctypes.c_void_p), ("name", ctypes.c_char_p)]


class NfsError(Exception):
    """A libnfs call failed: `code` is the errno, the message libnfs's own text."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class LibnfsMissingError(Exception):
    """No libnfs this binding speaks is installed (Debian 12: libnfs13, Debian 13: libnfs14)."""


def load_first(
    releases: Sequence[LibnfsRelease], load: Callable[[str], ctypes.CDLL]
) -> tuple[LibnfsRelease, ctypes.CDLL]:
    """The first of `releases` that `load` finds by its soname, and the library loaded."""
    for release in releases:
        try:
            return release, load(release.soname)
        except OSError:
            continue
    known = " or ".join(str(release) for release in releases)
    raise LibnfsMissingError(f"no libnfs this provider speaks is installed: {known}")


@functools.cache
def loaded() -> tuple[LibnfsRelease, ctypes.CDLL]:
    """The installed libnfs, loaded once, with every function used here typed."""
    release, lib = load_first(RELEASES, ctypes.CDLL)
    ctx, fh, path, c_int, u64 = Handle, Handle, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64
    signatures: dict[str, tuple[object, list[object]]] = {
        "nfs_init_context": (ctx, []),
        "nfs_destroy_context": (None, [ctx]),
        "nfs_get_error": (ctypes.c_char_p, [ctx]),
        "nfs_set_uid": (None, [ctx, c_int]),
        "nfs_set_gid": (None, [ctx, c_int]),
        "nfs_set_version": (c_int, [ctx, c_int]),
        "nfs_set_timeout": (None, [ctx, c_int]),
        "nfs_set_autoreconnect": (None, [ctx, c_int]),
        "nfs_mount": (c_int, [ctx, path, path]),
        "nfs_open": (c_int, [ctx, path, c_int, ctypes.POINTER(fh)]),
        "nfs_create": (c_int, [ctx, path, c_int, c_int, ctypes.POINTER(fh)]),
        "nfs_close": (c_int, [ctx, fh]),
        "nfs_pread": (c_int, [ctx, fh, u64, u64, ctypes.c_void_p]),
        "nfs_pwrite": (c_int, [ctx, fh, u64, u64, ctypes.c_char_p]),
        "nfs_fstat64": (c_int, [ctx, fh, ctypes.POINTER(NfsStat64)]),
        "nfs_fsync": (c_int, [ctx, fh]),
        "nfs_rename": (c_int, [ctx, path, path]),
        "nfs_unlink": (c_int, [ctx, path]),
        "nfs_opendir": (c_int, [ctx, path, ctypes.POINTER(Handle)]),
        "nfs_readdir": (ctypes.POINTER(NfsDirent), [ctx, Handle]),
        "nfs_closedir": (None, [ctx, Handle]),
    }
    for name, (result, arguments) in signatures.items():
        function = getattr(lib, name)
        function.restype = result
        function.argtypes = arguments
    return release, lib


def library() -> ctypes.CDLL:
    """The loaded libnfs (raises LibnfsMissingError when none this binding speaks is)."""
    return loaded()[1]


class NfsSession:
    """One libnfs context mounted on `server:export`, used by one thread at a time."""

    def __init__(self, server: str, export: str, uid: int | None, gid: int | None) -> None:
        self._lib = library()
        self._context = self._lib.nfs_init_context()
        if not self._context:
            raise NfsError(errno.ENOMEM, "nfs_init_context failed")
        try:
            if uid is not None:
                self._lib.nfs_set_uid(self._context, uid)
            if gid is not None:
                self._lib.nfs_set_gid(self._context, gid)
            self._check(self._lib.nfs_set_version(self._context, NFS_VERSION))
            self._lib.nfs_set_timeout(self._context, TIMEOUT_MILLISECONDS)
            self._lib.nfs_set_autoreconnect(self._context, 0)  # fail, and let the caller retry
            self._check(self._lib.nfs_mount(self._context, server.encode(), export.encode()))
        except BaseException:
            self.close()
            raise

    def open(self, path: str, flags: int) -> Handle:
        handle = Handle()
        self._check(self._lib.nfs_open(self._context, path.encode(), flags, ctypes.byref(handle)))
        return handle

    def create(self, path: str, mode: int, *, exclusive: bool) -> Handle:
        """A new file, refused if `path` exists when `exclusive` (O_EXCL), else emptied."""
        handle = Handle()
        flags = os.O_EXCL if exclusive else 0
        self._check(
            self._lib.nfs_create(self._context, path.encode(), flags, mode, ctypes.byref(handle))
        )
        return handle

    def identity(self, handle: Handle) -> tuple[int, int]:
        """The file's inode number and size: what tells it from another under its name."""
        stat = NfsStat64()
        self._check(self._lib.nfs_fstat64(self._context, handle, ctypes.byref(stat)))
        return int(stat.nfs_ino), int(stat.nfs_size)

    def read_into(self, handle: Handle, offset: int, buffer: ctypes.Array[ctypes.c_char]) -> int:
        count = self._lib.nfs_pread(self._context, handle, offset, len(buffer), buffer)
        return self._check(count)

    def write_all(self, handle: Handle, offset: int, data: bytes) -> None:
        done = 0
        while done < len(data):
            rest = data[done:] if done else data
            done += self._check(
                self._lib.nfs_pwrite(self._context, handle, offset + done, len(rest), rest)
            )

    def fsync(self, handle: Handle) -> None:
        self._check(self._lib.nfs_fsync(self._context, handle))

    def close_file(self, handle: Handle) -> None:
        self._check(self._lib.nfs_close(self._context, handle))

    def rename(self, old: str, new: str) -> None:
        self._check(self._lib.nfs_rename(self._context, old.encode(), new.encode()))

    def unlink(self, path: str) -> None:
        self._check(self._lib.nfs_unlink(self._context, path.encode()))

    def names(self, folder: str) -> Iterator[str]:
        listing = Handle()
        self._check(self._lib.nfs_opendir(self._context, folder.encode(), ctypes.byref(listing)))
        try:
            while entry := self._lib.nfs_readdir(self._context, listing):
                yield entry.contents.name.decode(errors="surrogateescape")
        finally:
            self._lib.nfs_closedir(self._context, listing)

    def close(self) -> None:
        if self._context:
            self._lib.nfs_destroy_context(self._context)  # unmounting is implicit
            self._context = None

    def _check(self, answer: int) -> int:
        if answer >= 0:
            return answer
        text = self._lib.nfs_get_error(self._context) if self._context else None
        raise NfsError(-answer, text.decode(errors="replace") if text else os.strerror(-answer))
