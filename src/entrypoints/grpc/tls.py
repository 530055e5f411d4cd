"""Mutual TLS for the gRPC server, on the VirtRigaud manager's contract.

The manager mounts a Kubernetes Secret in the TLS directory: tls.crt and tls.key (this
server's chain and key) and ca.crt (the CA of the manager's client certificate). Kubelet
rotates a Secret by swapping the ``..data`` symlink the files point through, so the server
re-reads them before each new connection and rotated certificates apply without a restart;
a set that does not load leaves the previous one in service.

TLS version: upstream requires TLS 1.3, and grpcio's Python API cannot set a minimum. gRPC's
BoringSSL negotiates TLS 1.3 with every client that offers it (the manager's Go client does;
the auth context's ``ssl_tls_version`` then reads ``TLSv1.3``) but still accepts a client
limited to TLS 1.2, with ECDHE + AES-GCM suites only; GRPC_SSL_CIPHER_SUITES cannot close
that gap either (BoringSSL's list names no TLS 1.3 suite; a list of none fails to bind).
tests/e2e/test_tls.py checks what is negotiated.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import grpc

logger = logging.getLogger(__name__)

_FILES = ("tls.crt", "tls.key", "ca.crt")
_IDENTITY_MAX_CHARS = 200
# The auth-context keys gRPC fills from the verified leaf, in the order caller_identity prefers.
_NAME_KEYS = ("x509_common_name", "peer_dns", "peer_uri")


class TransportSecurityError(Exception):
    """Start-up refusal: the TLS files and env disagree."""


@dataclass(frozen=True)
class TlsSettings:
    """The TLS part of the settings: where the Secret is mounted and the env switches."""

    tls_dir: Path
    tls_enabled: bool  # TLS_ENABLED=true
    insecure_allowed: bool  # VIRTRIGAUD_PROVIDER_INSECURE=true
    allowed_sans: frozenset[str]  # parsed VIRTRIGAUD_PROVIDER_ALLOWED_SANS (empty = no check)


def parse_allowed_sans(raw: str) -> frozenset[str]:
    """The comma list as a set: blanks around names and empty entries are dropped."""
    return frozenset(name for name in (part.strip() for part in raw.split(",")) if name)


def server_credentials(settings: TlsSettings) -> grpc.ServerCredentials | None:
    """None means plaintext (only when allowed); raises TransportSecurityError otherwise."""
    tls_dir = settings.tls_dir
    missing = [name for name in _FILES if not (tls_dir / name).exists()]
    if not missing:
        return _mutual_tls(tls_dir)
    if len(missing) < len(_FILES):
        raise TransportSecurityError(
            f"incomplete TLS files in {tls_dir}: missing {', '.join(missing)}; "
            "mutual TLS needs tls.crt, tls.key and ca.crt together"
        )
    if settings.tls_enabled:
        raise TransportSecurityError(
            f"TLS_ENABLED=true but {tls_dir} has none of tls.crt, tls.key, ca.crt: "
            "mount the TLS Secret there or point PYRIGAUD_TLS_DIR at it"
        )
    if not settings.insecure_allowed:
        raise TransportSecurityError(
            f"no TLS files in {tls_dir} (tls.crt, tls.key, ca.crt): mount the TLS Secret there "
            "(or set PYRIGAUD_TLS_DIR), or set VIRTRIGAUD_PROVIDER_INSECURE=true to serve "
            "plaintext"
        )
    logger.warning(
        "SERVING PLAINTEXT gRPC (VIRTRIGAUD_PROVIDER_INSECURE=true, no TLS files in %s): "
        "anyone who reaches the port can call every RPC",
        tls_dir,
    )
    if settings.allowed_sans:
        logger.warning(
            "VIRTRIGAUD_PROVIDER_ALLOWED_SANS is set, but plaintext carries no client "
            "certificate to check it against"
        )
    return None


def caller_identity(context: grpc.ServicerContext) -> str | None:
    """A short printable identity of the mTLS client for log lines: its CN, else its first DNS
    SAN, else its first URI SAN; None on plaintext. The text is the client's: control
    characters are replaced so that it cannot forge log lines."""
    names = _peer_names(context)
    if not names:
        return None
    printable = "".join(char if char.isprintable() else "?" for char in names[0])
    return printable[:_IDENTITY_MAX_CHARS]


def caller_allowed(context: grpc.ServicerContext, allowed_sans: frozenset[str]) -> bool:
    """True when the allow-list is empty or the client's leaf cert has a DNS SAN, URI SAN or
    CN in it. Exact, case-sensitive comparison, as upstream's; False on plaintext."""
    return not allowed_sans or not allowed_sans.isdisjoint(_peer_names(context))


def _peer_names(context: grpc.ServicerContext) -> list[str]:
    """CN, DNS SANs, URI SANs of the verified leaf, which gRPC already put in the auth context
    (so nothing is parsed per RPC); empty on plaintext. IP and e-mail SANs are left out, as
    upstream leaves them out; a certificate without a CN has an empty one there."""
    # types-grpcio says Mapping[str, bytes]; gRPC gives a list of values per key.
    auth = cast(Mapping[str, Sequence[bytes]], context.auth_context())
    return [
        value.decode("utf-8", "replace")
        for key in _NAME_KEYS
        for value in auth.get(key, ())
        if value
    ]


@dataclass(frozen=True)
class _CertificateFiles:
    """One generation of the three files; equal when their content is (a rotation is not)."""

    chain: bytes
    key: bytes = field(repr=False)
    ca: bytes
    # Resolved into the generation's own directory, which kubelet never rewrites.
    paths: tuple[Path, ...] = field(compare=False)


class _MidRotationError(Exception):
    """``..data`` moved while the files were resolved: they could mix two generations."""


def _generation(tls_dir: Path) -> str | None:
    """Where kubelet's ``..data`` symlink points; None when the directory is no Secret mount."""
    try:
        return os.readlink(tls_dir / "..data")
    except OSError:
        return None


def _read(tls_dir: Path) -> _CertificateFiles:
    """The three files through their symlinks, all from the same generation."""
    before = _generation(tls_dir)
    paths = tuple((tls_dir / name).resolve(strict=True) for name in _FILES)
    if _generation(tls_dir) != before:
        raise _MidRotationError(f"{tls_dir}/..data changed while it was read")
    chain, key, ca = (path.read_bytes() for path in paths)
    return _CertificateFiles(chain, key, ca, paths)


def _check(files: _CertificateFiles) -> None:
    """Raise unless OpenSSL loads the set: the chain and key parse and match, and every
    certificate of the CA bundle parses (gRPC itself would keep a truncated bundle's head)."""
    chain_path, key_path, ca_path = files.paths
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(chain_path, key_path, password=_refuse_password)
    except ssl.SSLError as error:
        raise ValueError(f"tls.crt and tls.key do not load as a pair: {error}") from error
    try:
        context.load_verify_locations(cafile=ca_path)
    except ssl.SSLError as error:
        raise ValueError(f"ca.crt does not load as PEM certificates: {error}") from error


def _refuse_password() -> bytes:
    """Without a callback OpenSSL would prompt on the terminal for an encrypted key's password."""
    raise ValueError("tls.key is encrypted; gRPC needs an unencrypted private key")


def _configuration(files: _CertificateFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(files.key, files.chain)], root_certificates=files.ca
    )


def _mutual_tls(tls_dir: Path) -> grpc.ServerCredentials:
    try:
        files = _read(tls_dir)
        _check(files)
    except (OSError, ValueError, _MidRotationError) as error:
        raise TransportSecurityError(f"cannot use the TLS files in {tls_dir}: {error}") from error
    logger.info(
        "mutual TLS: clients need a certificate signed by %s; rotated files apply to new "
        "connections",
        tls_dir / "ca.crt",
    )
    # types-grpcio omits that the fetcher may return None ("no change").
    fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], _Reloader(tls_dir, files))
    return grpc.dynamic_ssl_server_credentials(
        _configuration(files), fetcher, require_client_authentication=True
    )


class _Reloader:
    """The fetcher gRPC calls before each new connection's handshake: a new configuration when
    the files changed and load, else None, which keeps the current one."""

    def __init__(self, tls_dir: Path, served: _CertificateFiles) -> None:
        self._tls_dir = tls_dir
        self._served = served
        self._refused: _CertificateFiles | None = None  # checked once, not on every connection
        self._read_problem: str | None = None  # warned once, not on every connection
        self._lock = threading.Lock()  # handshakes can fetch concurrently

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            try:
                files = _read(self._tls_dir)
            except _MidRotationError:
                return None  # the next connection reads the finished generation
            except OSError as error:
                if str(error) != self._read_problem:
                    self._read_problem = str(error)
                    self._keep_current(f"cannot be read ({error})")
                return None
            self._read_problem = None
            if files in (self._served, self._refused):
                return None
            try:
                _check(files)
            except (OSError, ValueError) as error:
                self._refused = files
                self._keep_current(f"changed into a set that does not load ({error})")
                return None
            self._served, self._refused = files, None
            logger.info("TLS files in %s changed: new connections use them", self._tls_dir)
            return _configuration(files)

    def _keep_current(self, problem: str) -> None:
        logger.warning(
            "TLS files in %s %s: new connections keep the current certificates",
            self._tls_dir,
            problem,
        )
