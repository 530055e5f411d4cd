"""A stream that may fail part-way, in the one shape every transfer and codec uses.

A disk's bytes travel as an iterator of chunks, handed to code that knows only iterators (a
codec, a file's writes, libvirt's stream send, the landing site). An expected failure is a
value, so the stream cannot raise it, and its consumer wants bytes, so the stream cannot
yield it either. `Chunks` reads a source of Results: it gives the values and ends at the first
Failure. The failure reaches whoever consumes the stream as the Result of consuming it, never
beside it: `consumed_by(consume)` runs a consumer that knows only iterators and answers the
stream's failure, else what the consumer returned; `answered_by` does the same for a consumer
that answers a Result of its own. A consumer may read part of a stream (`peek_header`) and the
rest be consumed later: each answers the stream's failure so far. A stream made from another
(`after=`) answers the earlier one's failure first: a decoder fed a stream cut short fails too
("ends inside a grain"), but the cut is what happened. A reader that answers chunk by chunk
reads the stream as Results again (`results_of`), its failure last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")
R = TypeVar("R")


class Chunks(Generic[T]):
    """The values of `results` up to the first Failure, which consuming them answers."""

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

    def consumed_by(self, consume: Callable[[Iterator[T]], R]) -> Result[R, ProviderError]:
        """What `consume` (a codec, a file's writes, `peek_header`) made of the stream, or the
        failure that cut the stream short (its source's first): what it made of a cut stream
        is not to be trusted."""
        made = consume(self)
        return Result.do(made for _ in self._outcome())

    def answered_by(
        self,
        consume: Callable[[Iterator[T]], Result[R, ProviderError]],
        *,
        cut_short: Callable[[Result[R, ProviderError]], object] | None = None,
    ) -> Result[R, ProviderError]:
        """`consume`'s own answer to the stream (a landing site's), unless the stream was cut
        short: then its failure (its source's first), which is what happened, after
        `cut_short` is handed the consumer's answer (to undo what it made of the bytes)."""
        answer = consume(self)
        match self._outcome():
            case Failure() as failed:
                if cut_short is not None:
                    cut_short(answer)
                return failed
        return answer

    def results(self) -> Iterator[Result[T, ProviderError]]:
        """The values as Successes, then the failure that cut the stream short (its source's
        first), if one did: for a reader that answers a Result for each chunk."""
        for value in self:
            yield Success(value)
        match self._outcome():
            case Failure() as failed:
                yield failed

    def close(self) -> None:
        """Close the source (a generator's own cleanup: an open stream is aborted)."""
        close = getattr(self._results, "close", None)
        if close is not None:
            close()

    def _outcome(self) -> Result[None, ProviderError]:
        """How the stream ended so far: the first failure along it (its source's first), if
        one cut it short. Asked afresh each time: a consumer may stop and another read on."""
        own: Result[None, ProviderError] = (
            Success(None) if self._failure is None else Failure(self._failure)
        )
        return Result.do(None for _ in _outcome_of(self._after) for _ in own)


def _outcome_of(stream: Iterable[object]) -> Result[None, ProviderError]:
    """A stream's `_outcome`; a plain iterable cannot fail expectedly, so Success."""
    return stream._outcome() if isinstance(stream, Chunks) else Success(None)


def results_of(stream: Iterable[T]) -> Iterator[Result[T, ProviderError]]:
    """Any stream as Results: a `Chunks`' failure comes last; a plain iterable cannot fail."""
    return stream.results() if isinstance(stream, Chunks) else successes(stream)


def successes(values: Iterable[T]) -> Iterator[Result[T, ProviderError]]:
    """Values that cannot fail (a run of zeros), as a source of Results."""
    for value in values:
        yield Success(value)
