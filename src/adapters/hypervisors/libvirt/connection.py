"""One persistent libvirt connection per process, shared by threads, reopened when it dies.

libvirt connections are thread-safe for calls; only replacing a dead one takes a lock (the
shared Reopening handle).
The default event loop runs on a daemon thread so that keepalive and close callbacks work.
Remote URIs get their SSH key, known_hosts and password from the credentials port (see
ssh_access); a failed open re-reads the credentials once, in case they were rotated.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import (
    ANY_CODE,
    Refused,
    Refusing,
    answer,
    best_effort,
    caught,
)
from pyrigaud.adapters.hypervisors.libvirt.errors import CONNECTION_LOSS_CODES
from pyrigaud.adapters.hypervisors.libvirt.ssh_access import (
    PASSWORD,
    USERNAME,
    SshAccess,
    display_uri,
)
from pyrigaud.adapters.hypervisors.reopening import Reopening
from pyrigaud.application.ports import Credentials
from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")

# libvirt-python has no type stubs: its objects are Any, and stay inside this package.
VirConnect = Any
Opener = Callable[[str], VirConnect]
CloseHook = Callable[[VirConnect], object]

KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3
# All calls, reads included; the servicer's mutation limit is the tighter bound for writes.
DEFAULT_MAX_CONCURRENT_CALLS = 64
CALL_SLOT_WAIT_SECONDS = 30.0

_ANSWERED_CREDENTIALS = [
    libvirt.VIR_CRED_AUTHNAME,
    libvirt.VIR_CRED_USERNAME,
    libvirt.VIR_CRED_ECHOPROMPT,
    libvirt.VIR_CRED_PASSPHRASE,
    libvirt.VIR_CRED_NOECHOPROMPT,
]
_SECRET_CREDENTIALS = frozenset({libvirt.VIR_CRED_PASSPHRASE, libvirt.VIR_CRED_NOECHOPROMPT})

_process_setup_lock = threading.Lock()
_process_setup_done = False


def prepare_libvirt_for_process() -> None:
    """Silence libvirt's stderr printing and start its event loop, once per process."""
    global _process_setup_done  # noqa: PLW0603 - libvirt's event loop is process-global
    with _process_setup_lock:
        if _process_setup_done:
            return
        libvirt.registerErrorHandler(lambda *_: None, None)
        libvirt.virEventRegisterDefaultImpl()
        thread = threading.Thread(target=_run_event_loop, name="libvirt-events", daemon=True)
        thread.start()
        _process_setup_done = True


def _run_event_loop() -> None:
    while True:
        libvirt.virEventRunDefaultImpl()


class NoCredentials:
    """The credentials of a local connection: none."""

    def current(self) -> Mapping[str, str]:
        return {}

    def refresh(self) -> Mapping[str, str]:
        return {}


class LibvirtConnection:
    """Opens lazily (construction never fails), so an unreachable host is an answer, not a crash.

    `opener` replaces libvirt's authenticated open (tests count calls with it);
    `on_reconnect` is told each time a lost connection is opened again, `on_round_trip` each
    call into libvirt's API (one request or more), as `count_round_trip` (metrics).
    Hooks added with `on_close` see each raw connection just before it is closed.
    """

    def __init__(
        self,
        uri: str,
        *,
        credentials: Credentials | None = None,
        verify_host_key: bool = True,
        max_concurrent_calls: int = DEFAULT_MAX_CONCURRENT_CALLS,
        slot_wait_seconds: float = CALL_SLOT_WAIT_SECONDS,
        on_reconnect: Callable[[], None] = lambda: None,
        on_round_trip: Callable[[], None] = lambda: None,
        opener: Opener | None = None,
    ) -> None:
        self.uri = display_uri(uri)
        self._access = SshAccess(uri, verify_host_key=verify_host_key)
        # A local daemon needs no secrets: do not read (or warn about) a Secret for it.
        self._credentials: Credentials = NoCredentials()
        if credentials is not None and urlsplit(uri).hostname:
            self._credentials = credentials
        self._opener = opener
        self._slots = threading.BoundedSemaphore(max_concurrent_calls)
        self._max_concurrent_calls = max_concurrent_calls
        self._slot_wait_seconds = slot_wait_seconds
        self._on_reconnect = on_reconnect
        self.count_round_trip = on_round_trip
        self._handle: Reopening[VirConnect] = Reopening(self._open)
        self._opened_before = False
        self._hooks_lock = threading.Lock()
        self._close_hooks: list[weakref.WeakMethod[CloseHook]] = []

    def call(
        self, action: Callable[[VirConnect], T], *, once: bool = False, from_cache: bool = False
    ) -> Result[T, ProviderError]:
        """Run `action` on the live connection; once more on a fresh one if it died meanwhile,
        unless `once` (an action that consumes a stream cannot start over).

        Each call is counted as a round trip into libvirt, unless `from_cache`: an action that
        may answer from the domain cache counts its own reads of libvirt (`count_round_trip`),
        so that a cache hit makes none.

        At most `max_concurrent_calls` run at once; the others wait for a slot. Busy slots and
        a host that cannot be reached are Failures; what `action` raises rises to the edge.
        """
        if not from_cache:
            self.count_round_trip()
        if not self._slots.acquire(timeout=self._slot_wait_seconds):
            return Failure(
                ProviderError.resource_exhausted(
                    f"all {self._max_concurrent_calls} libvirt call slots for {self.uri} stayed "
                    f"busy for {self._slot_wait_seconds:g}s; retry later"
                )
            )
        try:
            match self._opened(self._handle.current):
                case Failure() as failed:
                    return failed
                case Success(conn):
                    pass

            def not_retried() -> bool:
                return once or _is_alive(conn)

            with Refusing(CONNECTION_LOSS_CODES, unless=not_retried):
                return Success(action(conn))
            # The connection died under the call: once more, on a fresh one.
            return self._opened(partial(self._reopen, conn)).map(action)
        finally:
            self._slots.release()

    def _opened(self, opening: Callable[[], VirConnect]) -> Result[VirConnect, ProviderError]:
        """The connection `opening` gives; a host that cannot be reached, whatever libvirt's
        code, is UNAVAILABLE, not bad input."""

        def opened() -> Result[VirConnect, ProviderError]:
            return Success(opening())

        return Result.do(
            conn for _ in self._access.ready() for conn in caught(opened, self._unreachable)
        )

    def on_close(self, hook: CloseHook) -> None:
        """Call the bound method `hook` with each raw connection before it is let go: just
        before `close()` closes it, and when a dead one is replaced. Event callbacks must be
        deregistered then: libvirt-python forgets them on close, and while they are registered
        libvirt keeps the connection alive. Held weakly, so a backend nobody uses still goes."""
        with self._hooks_lock:
            self._close_hooks.append(weakref.WeakMethod(hook))

    def close(self) -> None:
        conn = self._handle.take()
        self._access.close()
        if conn is not None:
            self._run_close_hooks(conn)
            best_effort(conn.close)  # a dead one has nothing to release

    def _run_close_hooks(self, conn: VirConnect) -> None:
        with self._hooks_lock:
            self._close_hooks = [ref for ref in self._close_hooks if ref() is not None]
            hooks = [hook for ref in self._close_hooks if (hook := ref()) is not None]
        for hook in hooks:
            hook(conn)

    def _reopen(self, dead: VirConnect) -> VirConnect:
        conn, replaced = self._handle.replace(dead)
        if replaced:
            # Calls in flight may still hold it: libvirt-python closes it once they let go,
            # which the callbacks would otherwise prevent.
            self._run_close_hooks(dead)
        return conn

    def _open(self) -> VirConnect:
        """Open with the current credentials, and once more if re-reading them changed them.

        Run by the Reopening under its lock, so never twice at once."""
        prepare_libvirt_for_process()
        values = self._credentials.current()
        rotated: list[Mapping[str, str]] = []

        def unrotated() -> bool:
            """Whether the credentials, read again, are as they were: the refusal stands."""
            rotated.append(self._credentials.refresh())
            return rotated[0] == values

        first = answer(partial(self._open_with, values), ANY_CODE, unless=unrotated)
        conn = self._open_with(rotated[0]) if isinstance(first, Refused) else first
        best_effort(partial(conn.setKeepAlive, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_COUNT))
        if self._opened_before:
            self._on_reconnect()
        self._opened_before = True
        return conn

    def _open_with(self, values: Mapping[str, str]) -> VirConnect:
        uri = self._access.uri_for(values)
        if self._opener is not None:
            return self._opener(uri)
        return libvirt.openAuth(uri, [_ANSWERED_CREDENTIALS, credential_answerer(values), None], 0)

    def _unreachable(self, error: libvirt.libvirtError) -> ProviderError:
        return ProviderError.unavailable(f"cannot connect to {self.uri}: {_one_line(error)}")


def _one_line(error: libvirt.libvirtError) -> str:
    """ssh's stderr, as libvirt passes it on, without its banner frames and line breaks."""
    message = error.get_error_message() or str(error)
    return " ".join(line.strip() for line in message.splitlines() if line.strip().strip("@"))


def credential_answerer(values: Mapping[str, str]) -> Callable[[list[list[Any]], object], int]:
    """libvirt's auth callback: names and passwords from the credentials, nothing else.

    One password per open: asked again, it was refused, and would be refused again. (libvirt's
    libssh transport asks after every refusal until sshd hangs up, then hangs instead of failing.)
    """
    password_given = False

    def answer(requests: list[list[Any]], _opaque: object) -> int:
        nonlocal password_given
        asks_password = any(request[0] in _SECRET_CREDENTIALS for request in requests)
        if asks_password and password_given:
            return -1
        password_given = password_given or asks_password
        for request in requests:  # [type, prompt, challenge, default, result]
            key = PASSWORD if request[0] in _SECRET_CREDENTIALS else USERNAME
            value = values.get(key) or (request[3] if key == USERNAME else "")
            if not value:
                return -1
            request[4] = value
        return 0

    return answer


def _is_alive(conn: VirConnect) -> bool:
    return bool(best_effort(conn.isAlive))
