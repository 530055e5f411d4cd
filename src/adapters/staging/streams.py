"""What every staging adapter shares: the running digest and a writer's one-way life.

Each step a store can fail returns a Result: the library's exceptions become a Failure once,
where this package calls the library (`s3_calls.calling`, `nfs_calls.nfs_call`, `pvc._failure`)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedDigest

CHUNK_BYTES = 4 * 1024 * 1024  # what one read returns at most: bounded, few calls per GiB


class RunningDigest:
    """SHA-256 and byte count of the bytes that went by."""

    def __init__(self) -> None:
        self._sha256 = hashlib.sha256()
        self._size = 0

    def add(self, chunk: bytes) -> None:
        self._sha256.update(chunk)
        self._size += len(chunk)

    def value(self) -> StagedDigest:
        return StagedDigest(sha256=self._sha256.hexdigest(), size_bytes=self._size)


class TemporaryWriter(ABC):
    """A writer that is open, then committed or aborted, never both. A failed write or commit
    aborts at once, so no caller can forget to and nothing is left behind. Using one once it is
    finished is a bug of its caller: it raises."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._digest = RunningDigest()
        self._finished = False

    def write(self, chunk: bytes) -> Result[None, ProviderError]:
        if self._finished:
            raise RuntimeError(f"write to {self.url} after it was finished")
        result = self._write(chunk)
        match result:
            case Success(_):
                self._digest.add(chunk)
            case Failure(_):
                self.abort()
        return result

    def commit(self) -> Result[StagedDigest, ProviderError]:
        if self._finished:
            raise RuntimeError(f"commit of {self.url} after it was finished")
        match self._commit():
            case Failure() as failed:
                self.abort()
                return failed
        self._finished = True
        return Success(self._digest.value())

    def abort(self) -> Result[None, ProviderError]:
        if self._finished:
            return Success(None)
        self._finished = True
        return self._abort()

    @abstractmethod
    def _write(self, chunk: bytes) -> Result[None, ProviderError]: ...

    @abstractmethod
    def _commit(self) -> Result[None, ProviderError]: ...

    @abstractmethod
    def _abort(self) -> Result[None, ProviderError]: ...
