"""The Provider service itself under mutual TLS: the SAN allow-list answers PERMISSION_DENIED."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.tls import TlsSettings, parse_allowed_sans, server_credentials

from support.e2e import RunningProvider, start_provider
from support.pki import MANAGER_DNS, Authority, Issued, mount_secret

ALLOWED = f"{MANAGER_DNS},spiffe://example.test/other"


@pytest.fixture(scope="module")
def ca() -> Authority:
    return Authority("provider-ca")


def tls_channel(ca: Authority, client: Issued) -> object:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.pem, private_key=client.key_pem, certificate_chain=client.cert_pem
    )
    return lambda address: grpc.secure_channel(
        address, credentials, options=[("grpc.ssl_target_name_override", "localhost")]
    )


def start(tmp_path: Path, ca: Authority, client: Issued) -> RunningProvider:
    mount_secret(tmp_path / "tls", ca.secret(ca.server()))
    settings = TlsSettings(
        tls_dir=tmp_path / "tls",
        tls_enabled=True,
        insecure_allowed=False,
        allowed_sans=parse_allowed_sans(ALLOWED),
    )
    return start_provider(
        {"VIRTRIGAUD_PROVIDER_ALLOWED_SANS": ALLOWED},
        credentials=server_credentials(settings),
        channel=tls_channel(ca, client),  # type: ignore[arg-type]
    )


@pytest.fixture
def manager_client(tmp_path: Path, ca: Authority) -> Iterator[RunningProvider]:
    running = start(tmp_path, ca, ca.manager())
    yield running
    running.channel.close()
    running.application.stop(0)


def test_an_allowed_client_is_served(manager_client: RunningProvider) -> None:
    assert manager_client.stub.Validate(pb.ValidateRequest(), timeout=5).ok
    assert not manager_client.stub.Describe(pb.DescribeRequest(id="x"), timeout=5).exists


def test_a_client_of_the_ca_outside_the_allow_list_is_permission_denied(
    tmp_path: Path, ca: Authority
) -> None:
    running = start(tmp_path, ca, ca.issue("someone-else", dns=["intruder.example.test"]))
    try:
        with pytest.raises(grpc.RpcError) as raised:
            running.stub.Describe(pb.DescribeRequest(id="x"), timeout=5)
        assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert running.fake.vms == {}
    finally:
        running.channel.close()
        running.application.stop(0)
