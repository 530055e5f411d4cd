"""Hypervisor call metrics: every backend method call counted and timed, by operation.

The container hands one backend object (it implements every port) to all use cases; wrapping
that one object here instruments every port without the adapters or the application knowing
Prometheus exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from returns.result import Failure

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import HealthReport
from pyrigaud.entrypoints.metrics import Metrics

_Backend = TypeVar("_Backend")


def instrument(backend: _Backend, metrics: Metrics) -> _Backend:
    """`backend`, with each public method call recorded in `metrics`.

    A `__getattr__` proxy rather than one typed wrapper per port: the backend implements a
    dozen Protocols and grows with them, and a proxy follows without edits. The proxy is
    typed as the backend it wraps (`cast`) because it answers every attribute the backend
    does, so callers keep the backend's static type, and mypy checks them against it.
    """
    return cast(_Backend, _InstrumentedBackend(backend, metrics))


def _call_outcome(value: object) -> str:
    """ "ok", or what went wrong: the error kind of a Failure, "unavailable" for a bad check."""
    if isinstance(value, Failure):
        error: ProviderError = value.failure()
        return error.kind.value
    if isinstance(value, HealthReport) and not value.ok:
        return "unavailable"
    return "ok"


class _InstrumentedBackend:
    def __init__(self, backend: object, metrics: Metrics) -> None:
        self._backend = backend
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._backend, name)
        if name.startswith("_") or not callable(attribute):
            return attribute  # state (e.g. the fake's `faults`) passes through, read live
        timed = self._timed(name, attribute)
        # A bound method never changes: keep the wrapper, so the next lookup is a plain hit.
        self.__dict__[name] = timed
        return timed

    def _timed(self, operation: str, method: Callable[..., object]) -> Callable[..., object]:
        record = self._metrics.record_hypervisor_call

        def timed(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                value = method(*args, **kwargs)
            except Exception:
                record(operation, "exception", time.perf_counter() - started)
                raise
            record(operation, _call_outcome(value), time.perf_counter() - started)
            return value

        timed.__name__ = operation
        timed.__doc__ = method.__doc__
        return timed
