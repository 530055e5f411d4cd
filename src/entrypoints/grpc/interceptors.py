"""What every Provider RPC goes through, as gRPC server interceptors (outermost first):

1. `RpcMetrics`: in-flight gauge, requests by method and code, latency (pyrigaud_rpc_*).
2. `RpcLog`: one line per RPC; mutations at info, reads at debug, INTERNAL at error.
3. `CallerAllowList`: under mutual TLS, only client certificates whose SAN is listed.
4. `MutationLimits`: a mutation waits for a rate token and a slot within its deadline, else
   RESOURCE_EXHAUSTED; reads pass through unwrapped.

Each interceptor wraps a method's behaviour once and keeps the wrapped handler, so a call pays
one dict lookup in `intercept_service` (which gRPC runs on its polling thread, so nothing here
may block there) and one Python frame per interceptor that applies to it. The outcome is read
back from the context (`context.code()`), where the servicer set it from the status table.
Health and reflection are not Provider methods and pass through untouched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from pyrigaud.entrypoints.grpc.limits import MutationLimiter
from pyrigaud.entrypoints.grpc.servicer import SERVICE, AnyRpc
from pyrigaud.entrypoints.grpc.tls import caller_allowed, caller_identity
from pyrigaud.entrypoints.metrics import Metrics

logger = logging.getLogger("pyrigaud.rpc")

_Behaviour = Callable[[Any, grpc.ServicerContext], Any]
_Continuation = Callable[[grpc.HandlerCallDetails], "grpc.RpcMethodHandler[Any, Any] | None"]


def _code(context: grpc.ServicerContext) -> grpc.StatusCode:
    """The status the RPC ends with (grpcio has `code()`; its type stubs do not)."""
    code: grpc.StatusCode | None = context.code()  # type: ignore[attr-defined]
    return code or grpc.StatusCode.OK


def _details(context: grpc.ServicerContext) -> str:
    details: bytes | str | None = context.details()  # type: ignore[attr-defined]
    return details.decode() if isinstance(details, bytes) else details or ""


class _ProviderMethodInterceptor(grpc.ServerInterceptor):
    """Wraps each Provider method's unary behaviour once (see `wrap`) and keeps the handler."""

    def __init__(self, rpcs: Iterable[AnyRpc]) -> None:
        self._rpcs = {f"/{SERVICE}/{rpc.name}": rpc for rpc in rpcs}
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def intercept_service(
        self, continuation: _Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is not None:
            return handler
        inner = continuation(handler_call_details)
        rpc = self._rpcs.get(method)
        if rpc is None or inner is None or inner.unary_unary is None:
            return inner
        behaviour = self.wrap(rpc, inner.unary_unary)
        if behaviour is not inner.unary_unary:
            inner = grpc.unary_unary_rpc_method_handler(
                behaviour,
                request_deserializer=inner.request_deserializer,
                response_serializer=inner.response_serializer,
            )
        self._handlers[method] = inner
        return inner

    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        """`behaviour` with this interceptor's concern around it, or itself when it does not
        apply to `rpc` (then the call pays nothing for it)."""
        raise NotImplementedError


class RpcMetrics(_ProviderMethodInterceptor):
    def __init__(self, rpcs: Iterable[AnyRpc], metrics: Metrics) -> None:
        super().__init__(rpcs)
        self._metrics = metrics

    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        name, record, inflight = rpc.name, self._metrics.record_rpc, self._metrics.inflight_rpcs

        def counted(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            inflight.inc()
            try:
                response = behaviour(request, context)
            finally:
                inflight.dec()
            record(name, _code(context), time.perf_counter() - started)
            return response

        return counted


class RpcLog(_ProviderMethodInterceptor):
    def wrap(self, rpc: AnyRpc, behaviour: _Behaviour) -> _Behaviour:
        name, level = rpc.name, logging.INFO if rpc.mutation else logging.DEBUG

        def logged(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            response = behaviour(request, context)
            code = _code(context)
            line_level = logging.ERROR if code is grpc.StatusCode.INTERNAL else level
            if logger.isEnabledFor(line_level):
                message = _details(context)
                logger.log(
                    line_level,
                    "rpc %s %s",
                    name,
                    code.name,
                    extra={
                        "rpc_method": name,
                        "grpc_code": code.name,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                        "peer": caller_identity(context) or context.peer(),
                        **({"error": message} if message else {}),
                    },
                )
            return response

        return logged


class CallerAllowList(_ProviderMethodInterceptor):
    """Refuses callers whose certificate SANs are not listed; an empty list allows all."""

    def __init__(self, rpcs: Iterable[AnyRpc], allowed_sans: frozenset[str]) -> None:
        super().__init__(rpcs)
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


class MutationLimits(_ProviderMethodInterceptor):
    """Mutations hold a limiter slot while they run; reads are not wrapped at all."""

    def __init__(self, rpcs: Iterable[AnyRpc], limiter: MutationLimiter) -> None:
        super().__init__(rpcs)
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


def provider_interceptors(
    rpcs: tuple[AnyRpc, ...],
    metrics: Metrics,
    limiter: MutationLimiter,
    allowed_sans: frozenset[str],
) -> tuple[grpc.ServerInterceptor, ...]:
    """The interceptors of the Provider service, in order; /metrics also reads the limiter."""
    metrics.watch_inflight_mutations(lambda: limiter.in_flight)
    return (
        RpcMetrics(rpcs, metrics),
        RpcLog(rpcs),
        CallerAllowList(rpcs, allowed_sans),
        MutationLimits(rpcs, limiter),
    )
