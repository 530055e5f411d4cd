"""What every Provider RPC goes through, as layers around each method's handler (outermost
first):

1. `RpcRecord`: the metrics (in-flight gauge, requests by method and code, latency:
   pyrigaud_rpc_*) and one log line per RPC (mutations at info, reads at debug, INTERNAL at
   error), from one clock reading and one status read.
2. `CallerAllowList`: under mutual TLS, only client certificates whose SAN is listed.
3. `MutationLimits`: a mutation waits for a rate token and a slot within its deadline, else
   RESOURCE_EXHAUSTED; reads pass through unwrapped.

`ProviderLayers.wrap` puts a method's behaviour in every layer once, when the server registers
the Provider's handlers: a call pays one Python frame per layer that applies to it, and nothing
else (a gRPC server interceptor would cost a pipeline walk, a metadata decode and a handler
lookup on every RPC). The outcome is read back from the context (`context.code()`), where the
servicer set it from the status table. Health and reflection are not Provider methods and are
not wrapped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from pyrigaud.entrypoints.grpc.limits import MutationLimiter
from pyrigaud.entrypoints.grpc.servicer import AnyRpc
from pyrigaud.entrypoints.grpc.tls import caller_allowed, caller_identity
from pyrigaud.entrypoints.metrics import Metrics

logger = logging.getLogger("pyrigaud.rpc")

_Behaviour = Callable[[Any, grpc.ServicerContext], Any]


def _details(context: grpc.ServicerContext) -> str:
    details: bytes | str | None = context.details()  # type: ignore[attr-defined]
    return details.decode() if isinstance(details, bytes) else details or ""


class _Layer:
    """One concern around the Provider methods it applies to."""

    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        """`behaviour` with this layer's concern around it, or itself when it does not apply
        to `rpc` (then the call pays nothing for it)."""
        raise NotImplementedError


class ProviderLayers:
    """Every layer, outermost first, around a Provider method."""

    def __init__(self, layers: Sequence[_Layer]) -> None:
        self._inner_first = tuple(reversed(layers))

    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        for layer in self._inner_first:
            behaviour = layer.wrap(rpc, behaviour)
        return behaviour


class RpcRecord(_Layer):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        name, level = rpc.name, logging.INFO if rpc.mutation else logging.DEBUG
        began, count = self._metrics.rpc_began, self._metrics.record_rpc
        self._metrics.expect_rpc(name, mutation=rpc.mutation)

        def recorded(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            began()
            try:
                return behaviour(request, context)
            finally:
                seconds = time.perf_counter() - started
                # The status the RPC ends with, None until set: OK (grpcio has `code()`; its
                # type stubs do not). An enum's `.name` is a Python call: not for OK.
                code: grpc.StatusCode | None = context.code()  # type: ignore[attr-defined]
                count(name, "OK" if code is None else code.name, seconds)
                line_level = logging.ERROR if code is grpc.StatusCode.INTERNAL else level
                if logger.isEnabledFor(line_level):
                    _log_rpc(line_level, name, code or grpc.StatusCode.OK, seconds, context)

        return recorded


def _log_rpc(
    level: int, name: str, code: grpc.StatusCode, seconds: float, context: grpc.ServicerContext
) -> None:
    message = _details(context)
    logger.log(
        level,
        "rpc %s %s",
        name,
        code.name,
        extra={
            "rpc_method": name,
            "grpc_code": code.name,
            "duration_ms": round(seconds * 1000, 3),
            "peer": caller_identity(context) or context.peer(),
            **({"error": message} if message else {}),
        },
    )


class CallerAllowList(_Layer):
    """Refuses callers whose certificate SANs are not listed; an empty list allows all."""

    def __init__(self, allowed_sans: frozenset[str]) -> None:
        self._allowed_sans = allowed_sans

    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        if not self._allowed_sans:
            return behaviour
        allowed, empty = self._allowed_sans, rpc.response

        def authorized(request: Any, context: grpc.ServicerContext) -> Any:
            if not caller_allowed(context, allowed):
                context.set_code(grpc.StatusCode.PERMISSION_DENIED)
                context.set_details("client certificate not allowed")
                return empty()
            return behaviour(request, context)

        return authorized


class MutationLimits(_Layer):
    """Mutations hold a limiter slot while they run; reads are not wrapped at all."""

    def __init__(self, limiter: MutationLimiter) -> None:
        self._limiter = limiter

    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        if not rpc.mutation:
            return behaviour
        slot, empty = self._limiter.slot, rpc.response

        def bounded(request: Any, context: grpc.ServicerContext) -> Any:
            with slot(context.time_remaining()) as admission:
                if not admission:
                    context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
                    context.set_details(admission.refusal)
                    return empty()
                return behaviour(request, context)

        return bounded


def provider_layers(
    metrics: Metrics, limiter: MutationLimiter, allowed_sans: frozenset[str]
) -> ProviderLayers:
    """The layers of the Provider service, in order; /metrics also reads the limiter."""
    metrics.watch_inflight_mutations(lambda: limiter.in_flight)
    return ProviderLayers(
        (RpcRecord(metrics), CallerAllowList(allowed_sans), MutationLimits(limiter))
    )
