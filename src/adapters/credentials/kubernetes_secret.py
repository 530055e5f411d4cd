"""Credentials from a Kubernetes Secret read through the API and watched for rotation.

For clusters where the Secret is not mounted (another namespace, or no restart wanted on a
renamed Secret). The service account needs `get` and `watch` on that one Secret; a Role rule
with `resourceNames: [<name>]` grants both, since the watch selects `metadata.name=<name>`.
`data` values are base64-decoded and whitespace-trimmed (`stringData` never comes back from
the API). The official `kubernetes` client is an optional extra: only this module imports it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client, config, watch

from pyrigaud.adapters.credentials.secret_values import SecretValues

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SecretReference:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_secret_reference(
    reference: str,
    default_namespace: str = "",
    namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE,
) -> SecretReference:
    """`name` or `namespace/name`; the namespace defaults to PROVIDER_NAMESPACE, then the pod's."""
    namespace, _, name = reference.strip().rpartition("/")
    if not name or "/" in namespace:
        raise ValueError(
            f"PYRIGAUD_CREDENTIALS_SECRET must be `name` or `namespace/name`, got {reference!r}"
        )
    namespace = namespace or default_namespace.strip() or _pod_namespace(namespace_file)
    if not namespace:
        raise ValueError(
            f"PYRIGAUD_CREDENTIALS_SECRET {reference!r} has no namespace: write `namespace/name`"
            " or set PROVIDER_NAMESPACE"
        )
    return SecretReference(namespace=namespace, name=name)


def _pod_namespace(namespace_file: Path) -> str:
    try:
        return namespace_file.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def connect_core_v1() -> client.CoreV1Api:
    """The in-cluster service account when running in a pod, else the kubeconfig."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.CoreV1Api(client.ApiClient(configuration))


def kubernetes_secret_credentials(
    reference: str, provider_namespace: str, on_reload: Callable[[], None] = lambda: None
) -> KubernetesSecretCredentials:
    """The composition root's way in: settings to a watching adapter."""
    return KubernetesSecretCredentials(
        connect_core_v1(),
        parse_secret_reference(reference, provider_namespace),
        on_reload=on_reload,
    )


class KubernetesSecretCredentials:
    """The last good version of one Secret, kept current by a background watch.

    The first current() reads the Secret and starts the watcher thread; after that current()
    only returns the held set. refresh() reads the Secret again at once. When the API server
    cannot be reached, the last good set is kept, one warning is logged, and the watcher
    reconnects with a doubling pause up to `max_backoff_seconds`.
    """

    def __init__(
        self,
        api: client.CoreV1Api,
        secret: SecretReference,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 10.0,
        initial_backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 30.0,
        on_reload: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_reload` is told each time a changed Secret replaces a set already served."""
        self._api = api
        self._on_reload = on_reload
        self._secret = secret
        self._watch_timeout_seconds = watch_timeout_seconds
        self._request_timeout_seconds = request_timeout_seconds
        self._initial_backoff_seconds = initial_backoff_seconds
        self._max_backoff_seconds = max_backoff_seconds
        self._values = SecretValues()
        self._resource_version: str | None = None
        self._available = True
        self._lock = threading.Lock()  # serialises reads of the Secret and the watcher's start
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._watch: watch.Watch | None = None

    def current(self) -> Mapping[str, str]:
        if self._watcher is None:
            with self._lock:
                if self._watcher is None:
                    self._read_or_keep()
                    self._start_watching()
        return self._values

    def refresh(self) -> Mapping[str, str]:
        with self._lock:
            self._read_or_keep()
            self._start_watching()
        return self._values

    def close(self) -> None:
        """Stop the watcher (it is a daemon thread, so this only matters for a clean exit)."""
        self._stopping.set()
        stream = self._watch
        if stream is not None:
            stream.stop()  # type: ignore[no-untyped-call]
        if self._watcher is not None:
            self._watcher.join(timeout=self._request_timeout_seconds)

    def _read_or_keep(self) -> None:
        try:
            self._read()
        except Exception as error:  # any failure keeps the last good set
            self._keep_last_good(error)

    def _read(self) -> str | None:
        secret = self._api.read_namespaced_secret(
            self._secret.name,
            self._secret.namespace,
            _request_timeout=self._request_timeout_seconds,
        )
        self._accept(secret)
        return self._resource_version

    def _start_watching(self) -> None:
        if self._watcher is None and not self._stopping.is_set():
            self._watcher = threading.Thread(
                target=self._watch_until_closed,
                name=f"credentials-watch-{self._secret}",
                daemon=True,
            )
            self._watcher.start()

    def _watch_until_closed(self) -> None:
        backoff = self._initial_backoff_seconds
        resource_version = self._resource_version
        while not self._stopping.is_set():
            try:
                if resource_version is None:
                    with self._lock:
                        resource_version = self._read()
                resource_version = self._follow(resource_version)
                backoff = self._initial_backoff_seconds
            except Exception as error:  # a dead watcher would freeze rotation
                if self._stopping.is_set():
                    return
                self._keep_last_good(error)
                resource_version = None  # read again: events may have been missed meanwhile
                backoff = min(backoff * 2, self._max_backoff_seconds)
            self._stopping.wait(backoff)

    def _follow(self, resource_version: str | None) -> str | None:
        """Apply watch events until the server ends the stream; the version to resume from."""
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        self._watch = stream
        if self._stopping.is_set():
            return resource_version
        for event in stream.stream(  # type: ignore[no-untyped-call]
            self._api.list_namespaced_secret,
            self._secret.namespace,
            field_selector=f"metadata.name={self._secret.name}",
            resource_version=resource_version,
            timeout_seconds=self._watch_timeout_seconds,
            _request_timeout=(
                self._request_timeout_seconds,
                self._watch_timeout_seconds + self._request_timeout_seconds,
            ),
        ):
            if event["type"] in ("ADDED", "MODIFIED"):
                self._accept(event["object"])
                resource_version = self._resource_version
            elif event["type"] == "DELETED":
                _log.warning(
                    "credentials Secret %s was deleted; keeping the last good set (%d keys)",
                    self._secret,
                    len(self._values),
                )
        return resource_version

    def _accept(self, secret: client.V1Secret) -> None:
        values = SecretValues(_decoded(secret.data or {}))
        if not self._available:
            _log.info("credentials Secret %s is readable again", self._secret)
        self._available = True
        if values != self._values:
            _log.debug(
                "loaded credentials Secret %s: keys %s", self._secret, ", ".join(sorted(values))
            )
            if self._resource_version is not None:
                self._on_reload()
        self._values = values
        self._resource_version = secret.metadata.resource_version if secret.metadata else None

    def _keep_last_good(self, error: Exception) -> None:
        log = _log.warning if self._available else _log.debug
        log(
            "cannot read credentials Secret %s (%s); keeping the last good set (%d keys)",
            self._secret,
            _describe(error),
            len(self._values),
        )
        self._available = False

    def __repr__(self) -> str:
        return f"KubernetesSecretCredentials(secret={str(self._secret)!r})"


def _decoded(data: Mapping[str, bytes | str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for key, encoded in data.items():
        try:
            values[key] = base64.b64decode(encoded, validate=True).decode("utf-8").strip()
        except (binascii.Error, UnicodeDecodeError):
            _log.warning("credentials key %s is not base64 of UTF-8 text; skipped", key)
    return values


def _describe(error: Exception) -> str:
    """The failure without its response body, which could echo request or Secret content."""
    if isinstance(error, client.ApiException):
        return f"HTTP {error.status} {error.reason}"
    return type(error).__name__
