"""Whether the RPC being served still has a caller: a long transfer asks between chunks.

The entrypoint sets the check for the call it serves (gRPC's `context.is_active`, false once
the client cancelled or its deadline passed); a transfer's loop asks `call_active` and stops,
cleaning up on the way out, instead of moving bytes nobody will wait for. Outside an RPC
(tests, the sweep) a call is always active.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError

_call_is_active: ContextVar[Callable[[], bool]] = ContextVar("call_is_active", default=lambda: True)


@contextmanager
def serving_call(is_active: Callable[[], bool]) -> Iterator[None]:
    """Within this block, `call_active` asks `is_active`."""
    token = _call_is_active.set(is_active)
    try:
        yield
    finally:
        _call_is_active.reset(token)


def call_active(doing: str) -> Result[None, ProviderError]:
    """UNAVAILABLE (the caller is gone: nobody reads the code) once the call ended."""
    if _call_is_active.get()():
        return _ACTIVE
    return Failure(
        ProviderError.unavailable(f"{doing} stopped: the client cancelled or its deadline passed")
    )


_ACTIVE: Result[None, ProviderError] = Success(None)
