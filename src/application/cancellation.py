"""Whether the RPC being served still has a caller: a long transfer asks between chunks.

The entrypoint sets the check for the call it serves (gRPC's `context.is_active`, false once
the client cancelled or its deadline passed); an adapter's loop calls `ensure_call_active` and
stops, cleaning up on the way out, instead of moving bytes nobody will wait for. Outside an
RPC (tests, the sweep) a call is always active.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pyrigaud.domain.errors import ExpectedError, ProviderError

_call_is_active: ContextVar[Callable[[], bool]] = ContextVar("call_is_active", default=lambda: True)


@contextmanager
def serving_call(is_active: Callable[[], bool]) -> Iterator[None]:
    """Within this block, `ensure_call_active` asks `is_active`."""
    token = _call_is_active.set(is_active)
    try:
        yield
    finally:
        _call_is_active.reset(token)


def ensure_call_active(doing: str) -> None:
    """Raise UNAVAILABLE (the caller is gone: nobody reads the code) when the call ended."""
    if not _call_is_active.get()():
        raise ExpectedError(
            ProviderError.unavailable(
                f"{doing} stopped: the client cancelled or its deadline passed"
            )
        )
