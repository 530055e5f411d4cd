"""One pyvmomi session shared by every RPC, re-logged-in once when vCenter expires it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pyVim import connect as untyped_connect
from pyVmomi import vim, vmodl

from pyrigaud.application.ports import Credentials

# pyVim is untyped: call it dynamically.
connect: Any = untyped_connect

T = TypeVar("T")

# Returns (username, password); called again on every re-login so rotated secrets take effect.
CredentialSource = Callable[[], tuple[str, str]]


def credentials_from(source: Credentials) -> CredentialSource:
    """Username and password from the Credentials port, re-read at every login (rotation)."""

    def read() -> tuple[str, str]:
        values = source.refresh()
        missing = [key for key in ("username", "password") if not values.get(key)]
        if missing:
            raise LoginError(f"credentials lack {', '.join(missing)}")
        return values["username"], values["password"]

    return read


class LoginError(ConnectionError):
    """pyVim reports an endpoint that is down or is not vSphere as a bare Exception."""


class VSphereSession:
    """Thread-safe lazy login; a call that hits NotAuthenticated logs in again and retries once."""

    def __init__(
        self,
        endpoint: str,
        credentials: CredentialSource,
        insecure: bool,
        on_relogin: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_relogin` is told each time an expired session is replaced by a new login."""
        self._on_relogin = on_relogin
        parts = urlsplit(endpoint)
        self._host = parts.hostname or ""
        self._port = parts.port or 443
        self._path = parts.path or "/sdk"
        self._credentials = credentials
        self._insecure = insecure
        self._lock = threading.Lock()
        self._instance: Any = None

    def call(self, operation: Callable[[Any], T]) -> T:
        """Run `operation(service_instance)`; pyvmomi faults propagate to the caller."""
        instance = self._connected()
        try:
            return operation(instance)
        except vim.fault.NotAuthenticated:
            return operation(self._relogin(instance))

    def close(self) -> None:
        with self._lock:
            instance, self._instance = self._instance, None
        if instance is not None:
            connect.Disconnect(instance)

    def _connected(self) -> Any:
        with self._lock:
            if self._instance is None:
                self._instance = self._login()
            return self._instance

    def _relogin(self, stale: Any) -> Any:
        with self._lock:
            if self._instance is stale:
                self._instance = self._login()
                self._on_relogin()
            return self._instance

    def _login(self) -> Any:
        username, password = self._credentials()
        try:
            return self._smart_connect(username, password)
        except (vmodl.MethodFault, OSError):
            raise
        except Exception as error:  # pyVim's "is not a VIM server" is a bare Exception
            raise LoginError(str(error)) from error

    def _smart_connect(self, username: str, password: str) -> Any:
        return connect.SmartConnect(
            host=self._host,
            port=self._port,
            path=self._path,
            user=username,
            pwd=password,
            disableSslCertValidation=self._insecure,
            httpConnectionTimeout=30,
        )
