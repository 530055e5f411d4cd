"""`bootstrap(settings, **overrides)`: the whole provider, built from the container and ready to
start, or why it cannot be. `pyrigaud serve` and the tests start providers only through here.

An override replaces the container's provider of that name with a value (`backend=` a test's
backend, `clock=` a manual clock, `server_transport=` a test CA's TLS, `limiter=` ...), before
anything is built, so every piece that depends on it gets it.
"""

from __future__ import annotations

import logging

from dependency_injector import providers
from returns.result import Failure, Result, Success

from pyrigaud.entrypoints.backends import BACKENDS
from pyrigaud.entrypoints.container import Container
from pyrigaud.entrypoints.grpc.tls import TransportSecurityError
from pyrigaud.entrypoints.settings import Settings

logger = logging.getLogger("pyrigaud")


class Application:
    """The running provider: the gRPC server (its health service included), the HTTP health
    and metrics endpoint, and the leftover sweeper, each built once by the container."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.settings = container.settings()
        self._readiness = container.readiness()
        self._server = container.grpc_server()
        self._health = container.health_server()
        self._sweeper = container.sweeper()

    @property
    def grpc_port(self) -> int:
        return self._server.port

    @property
    def health_port(self) -> int:
        return self._health.port

    def start(self) -> None:
        """Serve; ready once both endpoints listen; the first sweep runs off the request path."""
        self._server.start()
        self._health.start()
        self._readiness.set_ready(True)
        self._sweeper.start()
        logger.info(
            "pyrigaud serving",
            extra={
                "backend": self.settings.provider_type,
                "grpc_port": self.grpc_port,
                "health_port": self.health_port,
                "tls": self.container.mutual_tls(),
            },
        )

    def stop(self, grace_seconds: float | None = None) -> None:
        """Not ready first (the manager stops sending), then drain: RPCs in flight get
        `grace_seconds` (the settings' shutdown grace by default)."""
        self._readiness.set_ready(False)
        self._sweeper.stop()
        grace = self.settings.shutdown_grace_seconds if grace_seconds is None else grace_seconds
        self._server.stop(grace)
        self._health.stop()
        logger.info("pyrigaud stopped")


def bootstrap(settings: Settings, **overrides: object) -> Result[Application, str]:
    """The provider for `settings`, its container's providers named in `overrides` replaced by
    the values given; why it cannot start (TLS files, the backend's extra, a port in use)."""
    container = Container(settings=settings)
    for name, value in overrides.items():
        getattr(container, name).override(providers.Object(value))
    try:
        container.server_transport()  # the TLS files first: nothing is dialled without them
        container.ports()
        return Success(Application(container))
    except ImportError as error:
        extra = BACKENDS[settings.provider_type].extra
        extra_free = " or ".join(
            f"PROVIDER_TYPE={name}" for name, plugin in BACKENDS.items() if plugin.extra is None
        )
        return Failure(
            f"the {settings.provider_type} backend needs its extra: pip install "
            f"'pyrigaud[{extra}]' ({error}); or run with {extra_free}"
        )
    except (TransportSecurityError, OSError) as error:
        return Failure(str(error))
