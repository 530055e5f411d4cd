"""Mutual TLS over real gRPC on loopback, with real certificates laid out like a Kubernetes
Secret mount: the start-up rules, handshake refusals, rotation without a restart, the SAN
allow-list and the TLS version gRPC negotiates."""

from __future__ import annotations

import json
import logging
import socket
import ssl
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from pyrigaud.entrypoints.grpc.tls import (
    TlsSettings,
    TransportSecurityError,
    caller_allowed,
    caller_identity,
    parse_allowed_sans,
    server_credentials,
)

from support.pki import (
    MANAGER_CN,
    MANAGER_DNS,
    MANAGER_IP,
    MANAGER_URI,
    Authority,
    Issued,
    Pki,
    mount_secret,
)

TLS_LOGGER = "pyrigaud.entrypoints.grpc.tls"
FILES = ("tls.crt", "tls.key", "ca.crt")
# A channel of its own per call (no connection shared with an earlier channel of the test),
# and never a proxy: the handshake under test is the one with the server on loopback.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_http_proxy", 0)]


@pytest.fixture(scope="module")
def pki() -> Pki:
    ca = Authority("virtrigaud-ca")
    stranger = Authority("unrelated-ca").manager()
    return Pki(ca=ca, server=ca.server(), manager=ca.manager(), stranger=stranger)


# --- a server and a client ----------------------------------------------------------------

METHOD = "/pyrigaud.test.Probe/WhoAmI"


def _probe_handler(allowed_sans: frozenset[str]) -> grpc.GenericRpcHandler:
    """One RPC that gates on the allow-list as the servicer does and reports who called."""

    def who_am_i(_request: bytes, context: grpc.ServicerContext) -> bytes:
        if not caller_allowed(context, allowed_sans):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "client certificate not allowed")
        versions = cast("Sequence[bytes]", context.auth_context().get("ssl_tls_version", []))
        answer = {
            "identity": caller_identity(context),
            "tls_version": versions[0].decode() if versions else None,
        }
        return json.dumps(answer).encode()

    return grpc.method_handlers_generic_handler(
        "pyrigaud.test.Probe", {"WhoAmI": grpc.unary_unary_rpc_method_handler(who_am_i)}
    )


Serve = Callable[[TlsSettings], int]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a real gRPC server on loopback with server_credentials(settings); its port."""
    servers: list[grpc.Server] = []

    def start(settings: TlsSettings) -> int:
        credentials = server_credentials(settings)
        server = grpc.server(ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers([_probe_handler(settings.allowed_sans)])
        if credentials is None:
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            port = server.add_secure_port("127.0.0.1:0", credentials)
        server.start()
        servers.append(server)
        return port

    yield start
    for server in servers:
        server.stop(0)


def tls_settings(
    tls_dir: Path,
    *,
    tls_enabled: bool = False,
    insecure: bool = False,
    allowed_sans: frozenset[str] = frozenset(),
) -> TlsSettings:
    return TlsSettings(
        tls_dir=tls_dir,
        tls_enabled=tls_enabled,
        insecure_allowed=insecure,
        allowed_sans=allowed_sans,
    )


def open_channel(port: int, trust: Authority | None, client: Issued | None) -> grpc.Channel:
    """A channel to 127.0.0.1 (the server certificate's IP SAN); plaintext when trust is None."""
    target = f"127.0.0.1:{port}"
    if trust is None:
        return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=trust.pem,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )
    return grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS)


def who_am_i(channel: grpc.Channel) -> dict[str, str | None]:
    reply: bytes = channel.unary_unary(METHOD)(b"", timeout=5)  # type: ignore[arg-type]
    answer: dict[str, str | None] = json.loads(reply)
    return answer


def call(port: int, trust: Authority | None, client: Issued | None) -> dict[str, str | None]:
    """One RPC on a new connection: what the server makes of this client."""
    with open_channel(port, trust, client) as channel:
        return who_am_i(channel)


def refusal(port: int, trust: Authority | None, client: Issued | None) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call(port, trust, client)
    code: grpc.StatusCode = raised.value.code()
    return code


# --- start-up rules -----------------------------------------------------------------------


def test_mutual_tls_serves_a_client_certificate_of_the_ca_over_tls_1_3(
    tmp_path: Path, pki: Pki, serve: Serve
) -> None:
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server))
    port = serve(tls_settings(tmp_path / "tls"))
    with open_channel(port, pki.ca, pki.manager) as channel:
        grpc.channel_ready_future(channel).result(timeout=5)
        answer = who_am_i(channel)
    assert answer == {"identity": MANAGER_CN, "tls_version": "TLSv1.3"}


@pytest.mark.parametrize("client", ["none", "stranger"])
def test_a_client_without_a_certificate_of_the_ca_is_refused_at_the_handshake(
    tmp_path: Path, pki: Pki, serve: Serve, client: str
) -> None:
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server))
    port = serve(tls_settings(tmp_path / "tls"))
    presented = pki.stranger if client == "stranger" else None
    assert refusal(port, pki.ca, presented) is grpc.StatusCode.UNAVAILABLE
    assert call(port, pki.ca, pki.manager)["identity"] == MANAGER_CN  # the server is fine


def test_tls_files_mean_mutual_tls_whatever_the_env_says(
    tmp_path: Path, pki: Pki, serve: Serve
) -> None:
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server))
    port = serve(tls_settings(tmp_path / "tls", insecure=True))
    assert refusal(port, None, None) is grpc.StatusCode.UNAVAILABLE  # no plaintext on the port
    assert call(port, pki.ca, pki.manager)["tls_version"] == "TLSv1.3"


@pytest.mark.parametrize(
    "present", [("tls.crt",), ("tls.crt", "tls.key"), ("ca.crt",), ("tls.key", "ca.crt")]
)
def test_only_some_tls_files_refuse_to_start_even_when_insecure_is_allowed(
    tmp_path: Path, pki: Pki, present: tuple[str, ...]
) -> None:
    files = pki.ca.secret(pki.server)
    mount_secret(tmp_path / "tls", {name: files[name] for name in present})
    with pytest.raises(TransportSecurityError) as raised:
        server_credentials(tls_settings(tmp_path / "tls", insecure=True))
    message = str(raised.value)
    assert str(tmp_path / "tls") in message
    missing = [name for name in FILES if name not in present]
    assert f"missing {', '.join(missing)};" in message


def test_a_dangling_symlink_counts_as_a_missing_file(tmp_path: Path, pki: Pki) -> None:
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server))
    (tmp_path / "tls" / "..data").resolve().joinpath("ca.crt").unlink()
    with pytest.raises(TransportSecurityError, match=r"missing ca\.crt;"):
        server_credentials(tls_settings(tmp_path / "tls"))


def test_no_tls_files_and_insecure_serve_plaintext_with_a_warning(
    tmp_path: Path, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=TLS_LOGGER)
    settings = tls_settings(tmp_path / "absent", insecure=True)
    assert server_credentials(settings) is None
    assert any(
        record.levelno == logging.WARNING and "PLAINTEXT" in record.getMessage()
        for record in caplog.records
    )
    port = serve(settings)
    assert call(port, None, None) == {"identity": None, "tls_version": None}


def test_an_allow_list_on_plaintext_is_warned_about(
    tmp_path: Path, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=TLS_LOGGER)
    port = serve(tls_settings(tmp_path / "absent", insecure=True, allowed_sans=frozenset({"m"})))
    assert "VIRTRIGAUD_PROVIDER_ALLOWED_SANS" in caplog.text
    # No certificate, so nobody is on the list: caller_allowed fails closed.
    assert refusal(port, None, None) is grpc.StatusCode.PERMISSION_DENIED


def test_no_tls_files_without_insecure_refuse_to_start(tmp_path: Path) -> None:
    (tmp_path / "tls").mkdir()
    with pytest.raises(TransportSecurityError) as raised:
        server_credentials(tls_settings(tmp_path / "tls"))
    message = str(raised.value)
    assert str(tmp_path / "tls") in message
    assert "VIRTRIGAUD_PROVIDER_INSECURE=true" in message
    assert "PYRIGAUD_TLS_DIR" in message


def test_tls_enabled_without_tls_files_refuses_to_start_even_when_insecure(
    tmp_path: Path,
) -> None:
    with pytest.raises(TransportSecurityError) as raised:
        server_credentials(tls_settings(tmp_path / "absent", tls_enabled=True, insecure=True))
    assert "TLS_ENABLED=true" in str(raised.value)
    assert str(tmp_path / "absent") in str(raised.value)


def _encrypted(key_pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("key of another cert", "tls.crt and tls.key do not load as a pair"),
        ("encrypted key", "tls.key is encrypted"),
        ("garbage ca.crt", "ca.crt does not load as PEM certificates"),
    ],
)
def test_tls_files_that_do_not_load_refuse_to_start_without_leaking_them(
    tmp_path: Path, pki: Pki, breakage: str, reason: str
) -> None:
    broken = {
        "key of another cert": {"tls.key": pki.manager.key_pem},
        "encrypted key": {"tls.key": _encrypted(pki.server.key_pem)},
        "garbage ca.crt": {"ca.crt": b"not a certificate"},
    }[breakage]
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server) | broken)
    with pytest.raises(TransportSecurityError) as raised:
        server_credentials(tls_settings(tmp_path / "tls"))
    assert reason in str(raised.value)
    assert str(tmp_path / "tls") in str(raised.value)
    assert "BEGIN" not in str(raised.value)


# --- rotation -----------------------------------------------------------------------------


def test_rotated_certificates_apply_to_new_connections_without_a_restart(
    tmp_path: Path, pki: Pki, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=TLS_LOGGER)
    tls_dir = tmp_path / "tls"
    mount_secret(tls_dir, pki.ca.secret(pki.server))
    port = serve(tls_settings(tls_dir))
    with open_channel(port, pki.ca, pki.manager) as before_rotation:
        assert who_am_i(before_rotation)["identity"] == MANAGER_CN

        new_ca = Authority("virtrigaud-ca-2")
        mount_secret(tls_dir, new_ca.secret(new_ca.server()))

        assert call(port, new_ca, new_ca.manager())["identity"] == MANAGER_CN
        assert refusal(port, pki.ca, pki.manager) is grpc.StatusCode.UNAVAILABLE
        assert who_am_i(before_rotation)["identity"] == MANAGER_CN  # open connections stay
    assert "changed: new connections use them" in caplog.text


def _truncated(pem: bytes) -> bytes:
    return pem[: len(pem) // 2]


@pytest.mark.parametrize(
    "breakage",
    ["half-written tls.crt", "garbage tls.key", "key of another cert", "half-written ca.crt"],
)
def test_a_new_set_that_does_not_load_keeps_the_old_one_in_service(
    tmp_path: Path, pki: Pki, serve: Serve, caplog: pytest.LogCaptureFixture, breakage: str
) -> None:
    caplog.set_level(logging.WARNING, logger=TLS_LOGGER)
    tls_dir = tmp_path / "tls"
    mount_secret(tls_dir, pki.ca.secret(pki.server))
    port = serve(tls_settings(tls_dir))
    new_ca = Authority("virtrigaud-ca-2")
    new_server, new_manager = new_ca.server(), new_ca.manager()
    files = new_ca.secret(new_server)
    broken = {
        "half-written tls.crt": {"tls.crt": _truncated(new_server.cert_pem)},
        "garbage tls.key": {"tls.key": b"\x00garbage"},
        "key of another cert": {"tls.key": new_manager.key_pem},
        "half-written ca.crt": {"ca.crt": new_ca.pem + _truncated(pki.ca.pem)},
    }[breakage]
    mount_secret(tls_dir, files | broken)

    assert call(port, pki.ca, pki.manager)["identity"] == MANAGER_CN
    assert call(port, pki.ca, pki.manager)["identity"] == MANAGER_CN
    assert refusal(port, new_ca, new_manager) is grpc.StatusCode.UNAVAILABLE
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1, "one warning per bad set, not one per connection"
    assert "keep the current certificates" in warnings[0].getMessage()
    assert "BEGIN" not in caplog.text

    mount_secret(tls_dir, files)  # the set is fixed
    assert call(port, new_ca, new_manager)["identity"] == MANAGER_CN


def test_a_file_gone_from_the_new_set_keeps_the_old_one_in_service(
    tmp_path: Path, pki: Pki, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=TLS_LOGGER)
    tls_dir = tmp_path / "tls"
    mount_secret(tls_dir, pki.ca.secret(pki.server))
    port = serve(tls_settings(tls_dir))
    new_ca = Authority("virtrigaud-ca-2")
    files = new_ca.secret(new_ca.server())
    mount_secret(tls_dir, {name: files[name] for name in ("tls.crt", "tls.key")})

    assert call(port, pki.ca, pki.manager)["identity"] == MANAGER_CN
    assert call(port, pki.ca, pki.manager)["identity"] == MANAGER_CN
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "cannot be read" in caplog.text
    mount_secret(tls_dir, files)
    assert call(port, new_ca, new_ca.manager())["identity"] == MANAGER_CN


# --- the SAN allow-list and the caller's identity -----------------------------------------


@pytest.mark.parametrize(
    ("allowed", "admitted"),
    [
        (MANAGER_DNS, True),
        (MANAGER_URI, True),
        (MANAGER_CN, True),
        (f"someone-else, {MANAGER_DNS}", True),
        ("someone-else", False),
        (MANAGER_IP, False),  # IP SANs are not identities here, as upstream
        (MANAGER_DNS.upper(), False),  # exact comparison, as upstream
    ],
)
def test_the_allow_list_admits_a_dns_san_uri_san_or_cn_and_denies_the_rest(
    tmp_path: Path, pki: Pki, serve: Serve, allowed: str, admitted: bool
) -> None:
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server))
    port = serve(tls_settings(tmp_path / "tls", allowed_sans=parse_allowed_sans(allowed)))
    if admitted:
        assert call(port, pki.ca, pki.manager)["identity"] == MANAGER_CN
    else:
        assert refusal(port, pki.ca, pki.manager) is grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("cn", "dns", "uris", "identity"),
    [
        (MANAGER_CN, [MANAGER_DNS], [MANAGER_URI], MANAGER_CN),
        (None, [MANAGER_DNS, "other.example"], [MANAGER_URI], MANAGER_DNS),
        (None, [], [MANAGER_URI], MANAGER_URI),
        ("manager\nlevel=error forged", [], [], "manager?level=error forged"),
    ],
)
def test_caller_identity_is_the_cn_else_the_first_san_and_printable(
    tmp_path: Path,
    pki: Pki,
    serve: Serve,
    cn: str | None,
    dns: list[str],
    uris: list[str],
    identity: str,
) -> None:
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server))
    port = serve(tls_settings(tmp_path / "tls"))
    client = pki.ca.issue(cn, dns=dns, uris=uris)
    assert call(port, pki.ca, client)["identity"] == identity


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("a, b,,c", {"a", "b", "c"}), ("", set()), (" , ", set()), ("spiffe://x/y", {"spiffe://x/y"})],
)
def test_parse_allowed_sans_splits_on_commas_and_drops_blanks(raw: str, parsed: set[str]) -> None:
    assert parse_allowed_sans(raw) == parsed


# --- TLS version --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ciphers", "accepted"),
    [("ECDHE-ECDSA-AES128-GCM-SHA256", True), ("ECDHE-ECDSA-AES128-SHA", False)],
)
def test_a_tls_1_2_client_is_still_accepted_with_an_aead_suite_only(
    tmp_path: Path, pki: Pki, serve: Serve, ciphers: str, accepted: bool
) -> None:
    """grpcio cannot set a minimum TLS version (the module docstring); this pins what the
    server does accept, so the docstring is rewritten when gRPC's behaviour changes."""
    mount_secret(tmp_path / "tls", pki.ca.secret(pki.server))
    port = serve(tls_settings(tmp_path / "tls"))
    (tmp_path / "client.crt").write_bytes(pki.manager.cert_pem)
    (tmp_path / "client.key").write_bytes(pki.manager.key_pem)
    context = ssl.create_default_context(cadata=pki.ca.pem.decode())
    context.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    context.set_alpn_protocols(["h2"])
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers)

    def handshake() -> str | None:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            return tls.version()

    if accepted:
        assert handshake() == "TLSv1.2"
    else:
        with pytest.raises(ssl.SSLError):  # the server closes it: no shared cipher
            handshake()
