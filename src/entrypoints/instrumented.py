"""Hypervisor call metrics: every port method call counted and timed, by operation.

The container wraps each port of the selected backend here before wiring the use cases, so
every port is instrumented without the adapters or the application knowing Prometheus exists.
The operation label is the port method's name (`describe`, `start_create`, ...).
"""

from __future__ import annotations

import dataclasses
import time
import typing
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from returns.result import Failure, Success

from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import HealthReport
from pyrigaud.entrypoints.metrics import Metrics

_Port = TypeVar("_Port")


def instrument_backend(backend: Backend, metrics: Metrics) -> Backend:
    """`backend` with each port it has wrapped by `instrument`; a missing port stays None.
    The operations of the ports it has are counted (at 0) from the start."""
    ports = {
        field.name: instrument(port, metrics)
        for field in dataclasses.fields(backend)
        if (port := getattr(backend, field.name)) is not None
    }
    metrics.expect_hypervisor_calls(_operations_of(ports))
    return dataclasses.replace(backend, **ports)


def _operations_of(ports: dict[str, object]) -> Iterator[str]:
    """The methods the port protocols of `ports` declare (Backend's field types)."""
    declared = typing.get_type_hints(Backend)
    for name in ports:
        for protocol in typing.get_args(declared[name]) or (declared[name],):
            if protocol is not type(None):
                yield from (
                    member
                    for member in dir(protocol)
                    if not member.startswith("_") and callable(getattr(protocol, member))
                )


def instrument(port: _Port, metrics: Metrics) -> _Port:
    """`port`, with each public method call recorded in `metrics`.

    A `__getattr__` proxy rather than one typed wrapper per port: ports grow, and a proxy
    follows without edits. The proxy is typed as the port it wraps (`cast`) because it answers
    every attribute the port does, so callers keep the port's static type, and mypy checks
    them against it.
    """
    return cast(_Port, _InstrumentedPort(port, metrics))


def _call_outcome(value: object) -> str:
    """ "ok", or what went wrong: the error kind of a Failure, "unavailable" for a bad check."""
    match value:
        case Failure(ProviderError() as error):
            return error.kind.value
        case HealthReport(ok=False):
            return "unavailable"
    return "ok"


class _InstrumentedPort:
    def __init__(self, port: object, metrics: Metrics) -> None:
        self._port = port
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._port, name)
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
            match value:  # a Success, the common case, told without a call (an exact-type hit)
                case Success():
                    outcome = "ok"
                case _:
                    outcome = _call_outcome(value)
            record(operation, outcome, time.perf_counter() - started)
            return value

        timed.__name__ = operation
        timed.__doc__ = method.__doc__
        return timed
