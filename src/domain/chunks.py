"""A stream that may fail part-way, in the one shape every transfer and codec uses.

A disk's bytes travel as an iterator of chunks, handed to code that knows only iterators (a
codec, a file's writes, libvirt's stream send, the landing site). An expected failure is a
value, so the stream cannot raise it, and its consumer wants bytes, so the stream cannot
yield it either. `Chunks` reads a source of Results: it gives the values, ends at the first
Failure and keeps it; whoever made the stream asks `outcome()` once the iteration is over,
before trusting what was consumed. A stream made from another (`after=`) answers the earlier
one's failure first: a decoder fed a stream cut short fails too ("ends inside a grain"), but
the cut is what happened.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")


class Chunks(Generic[T]):
    """The values of `results` up to the first Failure, kept for `outcome`."""

    def __init__(
        self, results: Iterable[Result[T, ProviderError]], *, after: Iterable[object] = ()
    ) -> None:
        self._results = iter(results)
        self._after = after
        self._failure: ProviderError | None = None

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._failure is not None:
            raise StopIteration
        result = next(self._results)
        match result:
            case Failure(error):
                self._failure = error
                raise StopIteration
            case Success(value):
                return value  # type: ignore[no-any-return]  # a Success's value is a T
        raise TypeError(f"a stream gave {result!r}, not a Result")

    def outcome(self) -> Result[None, ProviderError]:
        """How the stream ended so far: the first failure along it (its source's first), if
        one cut it short. Asked afresh each time: a consumer may stop and read on."""
        own: Result[None, ProviderError] = (
            Success(None) if self._failure is None else Failure(self._failure)
        )
        return Result.do(None for _ in outcome_of(self._after) for _ in own)

    def close(self) -> None:
        """Close the source (a generator's own cleanup: an open stream is aborted)."""
        close = getattr(self._results, "close", None)
        if close is not None:
            close()


def outcome_of(stream: Iterable[object]) -> Result[None, ProviderError]:
    """A stream's `outcome`; a plain iterable cannot fail expectedly, so Success."""
    return stream.outcome() if isinstance(stream, Chunks) else Success(None)


def successes(values: Iterable[T]) -> Iterator[Result[T, ProviderError]]:
    """Values that cannot fail (a run of zeros), as a source of Results."""
    for value in values:
        yield Success(value)
