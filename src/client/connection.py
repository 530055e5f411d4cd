"""A channel to a provider: plaintext, or the manager's mutual TLS from a Secret-shaped dir."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

ENDPOINT_VARIABLE = "PYRIGAUD_ENDPOINT"
TLS_FILES = ("tls.crt", "tls.key", "ca.crt")
# The manager's own per-RPC deadlines (docs/contract.md), in seconds.
DEADLINES = {
    "Validate": 30.0,
    "GetCapabilities": 30.0,
    "Describe": 30.0,
    "TaskStatus": 10.0,
    "Power": 120.0,
    "Delete": 120.0,
    "ListVMs": 120.0,
    "Create": 300.0,
    "Reconfigure": 300.0,
    "HardwareUpgrade": 300.0,
    "Clone": 300.0,
    "SnapshotCreate": 300.0,
    "SnapshotDelete": 300.0,
    "SnapshotRevert": 300.0,
    "ImagePrepare": 300.0,
    "GetDiskInfo": 30.0,
    "ExportDisk": 1800.0,
    "ImportDisk": 1800.0,
}
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # grpc's default receive limit, the manager's too


class EndpointError(Exception):
    """The endpoint or the TLS material is unusable (said before any RPC is sent)."""


@dataclass(frozen=True)
class Target:
    endpoint: str
    tls_dir: Path | None = None
    server_name: str = ""


def resolve_endpoint(flag: str | None) -> str:
    """`--endpoint`, else PYRIGAUD_ENDPOINT; one of them is needed."""
    endpoint = flag or os.environ.get(ENDPOINT_VARIABLE, "")
    if not endpoint:
        raise EndpointError(f"no endpoint: pass --endpoint HOST:PORT or set {ENDPOINT_VARIABLE}")
    return endpoint


def open_channel(target: Target) -> grpc.Channel:
    """Plaintext without a TLS dir; with one, the client certificate the manager presents."""
    options: list[tuple[str, object]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    if target.tls_dir is None:
        return grpc.insecure_channel(target.endpoint, options=options)
    files = {}
    for name in TLS_FILES:
        path = target.tls_dir / name
        try:
            files[name] = path.read_bytes()
        except OSError as error:
            raise EndpointError(f"cannot read {path}: {error.strerror}") from error
    credentials = grpc.ssl_channel_credentials(
        root_certificates=files["ca.crt"],
        private_key=files["tls.key"],
        certificate_chain=files["tls.crt"],
    )
    if target.server_name:
        options.append(("grpc.ssl_target_name_override", target.server_name))
    return grpc.secure_channel(target.endpoint, credentials, options=options)


def stub_for(channel: grpc.Channel) -> pb_grpc.ProviderStub:
    return pb_grpc.ProviderStub(channel)
