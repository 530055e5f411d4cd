"""A stream's failure reaches its consumer as the Result of consuming it: the stream's own
failure, or the one of the stream it was made from first, else what the consumer made of it."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.domain.chunks import Chunks, results_of, successes
from pyrigaud.domain.disk_images import peek_header
from pyrigaud.domain.errors import ProviderError

from support import error_of, ok

CUT = ProviderError.unavailable("the staged object's read was cut")
REFUSED = ProviderError.invalid_spec("source", "the image ends inside a grain")


def cut_after(*values: bytes) -> Chunks[bytes]:
    return Chunks([*(Success(value) for value in values), Failure(CUT)])


def test_a_whole_stream_answers_what_its_consumer_made_of_it() -> None:
    assert ok(Chunks(successes([b"a", b"b"])).consumed_by(b"".join)) == b"ab"


def test_a_stream_cut_short_answers_its_failure_not_what_was_made_of_its_start() -> None:
    given: list[bytes] = []
    assert error_of(cut_after(b"a", b"b").consumed_by(given.extend)) == CUT
    assert given == [b"a", b"b"]


def test_a_stream_made_from_a_cut_one_answers_the_cut_first() -> None:
    source = cut_after(b"abc")

    def decoded() -> Iterator[Result[bytes, ProviderError]]:
        for chunk in source:
            yield Success(chunk.upper())
        yield Failure(REFUSED)  # what a decoder says of input that stops too soon

    assert error_of(Chunks(decoded(), after=source).consumed_by(list)) == CUT


def test_a_stream_read_in_part_then_on_answers_each_read_so_far() -> None:
    """ImportDisk's two reads: the first MiB judged, then the rest landed."""
    first_look = partial(peek_header, count=4)
    header, rest = ok(cut_after(b"head", b"body").consumed_by(first_look))
    assert header == b"head"
    assert error_of(rest.consumed_by(list)) == CUT
    header, rest = ok(Chunks(successes([b"head", b"body"])).consumed_by(first_look))
    assert ok(rest.consumed_by(b"".join)) == b"headbody"


def test_a_consumers_own_answer_stands_unless_the_stream_was_cut_first() -> None:
    told: list[Result[int, ProviderError]] = []

    def landed(chunks: Iterator[bytes]) -> Result[int, ProviderError]:
        return Success(len(b"".join(chunks)))

    def refused(chunks: Iterator[bytes]) -> Result[int, ProviderError]:
        list(chunks)
        return Failure(REFUSED)

    assert ok(Chunks(successes([b"ab"])).answered_by(landed, cut_short=told.append)) == 2
    assert error_of(Chunks(successes([b"ab"])).answered_by(refused)) == REFUSED
    assert told == []
    cut_when_refused: Result[int, ProviderError] = cut_after(b"ab").answered_by(
        refused, cut_short=told.append
    )
    cut_when_landed: Result[int, ProviderError] = cut_after(b"ab").answered_by(
        landed, cut_short=told.append
    )
    assert error_of(cut_when_refused) == error_of(cut_when_landed) == CUT
    assert told == [Failure(REFUSED), Success(2)]  # handed over, to undo what was made


def test_a_reader_chunk_by_chunk_reads_the_failure_last() -> None:
    assert list(results_of(cut_after(b"a"))) == [Success(b"a"), Failure(CUT)]
    assert list(results_of(iter([b"a"]))) == [Success(b"a")]
