"""A byte stream that may fail part-way, in the one shape every transfer uses.

A disk's bytes travel as an iterable of chunks, handed to code that knows only iterables (a
codec, a file's writes, libvirt's stream send, the landing site). An expected failure is a
value, so the stream cannot raise it, and its consumer wants bytes, so the stream cannot
yield it either. `Chunks` reads a source of Results: it yields the bytes, ends at the first
Failure and keeps it; whoever made the stream asks `outcome()` once the iteration is over,
before trusting what was consumed. A stream made from another (`after=`) answers the earlier
one's failure first: a decoder fed a stream cut short fails too ("ends inside a grain"), but
the cut is what happened.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError


class Chunks:
    """The bytes of `results` up to the first Failure, kept for `outcome`."""

    def __init__(
        self, results: Iterable[Result[bytes, ProviderError]], *, after: Iterable[bytes] = ()
    ) -> None:
        self._results = results
        self._source = after if isinstance(after, Chunks) else None
        self._failure: ProviderError | None = None

    def __iter__(self) -> Iterator[bytes]:
        for result in self._results:
            match result:
                case Success(chunk):
                    yield chunk
                case Failure(error):
                    self._failure = error
                    return

    def outcome(self) -> Result[None, ProviderError]:
        """How the stream ended so far: the first failure along it (its source's first), if
        one cut it short. Asked afresh each time: a consumer may stop and read on."""
        earlier = self._source.outcome() if self._source is not None else Success(None)
        return earlier.bind(
            lambda _: Success(None) if self._failure is None else Failure(self._failure)
        )


def chunks_of(raw: Iterable[bytes]) -> Iterator[Result[bytes, ProviderError]]:
    """Bytes that cannot fail, as a source of Results (a run of zeros, a file being copied)."""
    return map(Success, raw)
