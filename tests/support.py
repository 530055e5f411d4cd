"""Small assertions shared by the test suites."""

from __future__ import annotations

from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ErrorKind, ProviderError

T = TypeVar("T")


def ok(result: Result[T, ProviderError]) -> T:
    """The success value, or a test failure showing the error."""
    assert isinstance(result, Success), result
    return result.unwrap()


def error_kind(result: Result[object, ProviderError]) -> ErrorKind:
    assert isinstance(result, Failure), result
    return result.failure().kind


def error_of(result: Result[object, ProviderError]) -> ProviderError:
    assert isinstance(result, Failure), result
    return result.failure()
