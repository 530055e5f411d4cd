"""One pyvmomi session shared by every RPC, re-logged-in once when vCenter expires it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pyVim import connect as untyped_connect
from pyVmomi import vim, vmodl

from pyrigaud.adapters.hypervisors.reopening import Reopening
from pyrigaud.application.ports import Clock, Credentials

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


class Connection:
    """A logged-in service instance whose ServiceContent is read once, at login: pyVmomi
    fetches `instance.content` anew (a round trip) on every access. `clock` is what the waits
    on its Tasks and leases poll by (a test's clock moves on instead of sleeping). Everything
    else is the instance's own."""

    def __init__(self, instance: Any, clock: Clock) -> None:
        self.instance = instance
        self.clock = clock
        self.content = instance.RetrieveContent()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.instance, name)


class VSphereSession:
    """Lazy login shared by every thread; a call that hits NotAuthenticated logs in again (once,
    however many calls noticed) and is retried once."""

    def __init__(
        self,
        endpoint: str,
        credentials: CredentialSource,
        insecure: bool,
        on_relogin: Callable[[], None] = lambda: None,
        on_call: Callable[[], None] = lambda: None,
        *,
        clock: Clock,
    ) -> None:
        """`on_relogin` is told each time an expired session is replaced by a new login,
        `on_call` each call into vCenter (one round trip or more): what a cached answer saves
        is counted there, never guessed. `clock` is what waits on vCenter's Tasks and leases
        poll by."""
        self._clock = clock
        self._on_relogin = on_relogin
        self._on_call = on_call
        parts = urlsplit(endpoint)
        self._host = parts.hostname or ""
        self._port = parts.port or 443
        host = f"[{self._host}]" if ":" in self._host else self._host
        # Where vCenter's web client lives, for console links.
        self.web_origin = f"https://{host}" + (f":{self._port}" if self._port != 443 else "")
        self._path = parts.path or "/sdk"
        self._credentials = credentials
        self._insecure = insecure
        self._connection: Reopening[Connection] = Reopening(self._login)
        self._closing: list[Callable[[], None]] = []

    def call(self, operation: Callable[[Any], T]) -> T:
        """Run `operation(connection)` (a Connection: the service instance with its content
        at hand); pyvmomi faults propagate to the caller."""
        self._on_call()
        connection = self._connection.current()
        try:
            return operation(connection)
        except vim.fault.NotAuthenticated:
            fresh, replaced = self._connection.replace(connection)
            if replaced:
                self._on_relogin()
            return operation(fresh)

    def close(self) -> None:
        for closing in self._closing:
            closing()
        connection = self._connection.take()
        if connection is not None:
            connect.Disconnect(connection.instance)

    def on_close(self, closing: Callable[[], None]) -> None:
        """Have `closing` run when the session closes (what lives as long as it, stops)."""
        self._closing.append(closing)

    def open_private(self) -> Connection:
        """A login of its own, shared with no caller, for a long-poll that would otherwise hold
        the shared session's filters and connection; the caller ends it with `end_private`."""
        return self._login()

    @staticmethod
    def end_private(connection: Connection) -> None:
        connect.Disconnect(connection.instance)

    def _login(self) -> Connection:
        username, password = self._credentials()
        try:
            return Connection(self._smart_connect(username, password), self._clock)
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
