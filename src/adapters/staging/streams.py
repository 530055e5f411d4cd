"""What every staging adapter shares: the running digest and a writer's one-way life."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.staging import StagedDigest

CHUNK_BYTES = 4 * 1024 * 1024  # what one read returns at most: bounded, few calls per GiB
T = TypeVar("T")


def as_result(action: Callable[[], T]) -> Result[T, ProviderError]:
    """Run `action`; an ExpectedError raised inside this room becomes a Failure at its edge."""
    try:
        return Success(action())
    except ExpectedError as error:
        return Failure(error.error)


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
    aborts at once, so no caller can forget to and nothing is left behind."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._digest = RunningDigest()
        self._finished = False

    def write(self, chunk: bytes) -> Result[None, ProviderError]:
        if self._finished:
            return Failure(ProviderError.internal(f"write to {self.url} after it was finished"))
        result = as_result(lambda: self._write(chunk))
        if isinstance(result, Failure):
            self.abort()
        else:
            self._digest.add(chunk)
        return result

    def commit(self) -> Result[StagedDigest, ProviderError]:
        if self._finished:
            return Failure(ProviderError.internal(f"commit of {self.url} after it was finished"))
        result = as_result(self._commit)
        if isinstance(result, Failure):
            self.abort()
            return result
        self._finished = True
        return Success(self._digest.value())

    def abort(self) -> Result[None, ProviderError]:
        if self._finished:
            return Success(None)
        self._finished = True
        return as_result(self._abort)

    @abstractmethod
    def _write(self, chunk: bytes) -> None: ...

    @abstractmethod
    def _commit(self) -> None: ...

    @abstractmethod
    def _abort(self) -> None: ...
