"""Real certificates for the TLS tests: a CA that issues server and client certificates, and
a Secret mount laid out the way kubelet writes one."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MANAGER_CN = "virtrigaud-manager"
MANAGER_DNS = "virtrigaud-manager.virtrigaud-system.svc"
MANAGER_URI = "spiffe://cluster.local/ns/virtrigaud-system/sa/virtrigaud-manager"
MANAGER_IP = "10.0.0.7"  # only a name inside a certificate; nothing is sent there


# --- certificates -------------------------------------------------------------------------


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key: object) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


class Authority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, name: str) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            _builder(self._name, self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        cn: str | None,
        *,
        dns: Sequence[str] = (),
        uris: Sequence[str] = (),
        ips: Sequence[str] = (),
        server: bool = False,
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = _builder(subject, self._name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        names: list[x509.GeneralName] = [
            *(x509.DNSName(name) for name in dns),
            *(x509.UniformResourceIdentifier(uri) for uri in uris),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips),
        ]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def server(self) -> Issued:
        return self.issue("pyrigaud", dns=["localhost"], ips=["127.0.0.1"], server=True)

    def manager(self) -> Issued:
        return self.issue(MANAGER_CN, dns=[MANAGER_DNS], uris=[MANAGER_URI], ips=[MANAGER_IP])

    def secret(self, server: Issued) -> dict[str, bytes]:
        """The TLS Secret's keys for a server certificate of this CA."""
        return {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": self.pem}


@dataclass(frozen=True)
class Pki:
    ca: Authority
    server: Issued
    manager: Issued
    stranger: Issued  # the manager's names, signed by another CA


# --- a Kubernetes Secret mount ------------------------------------------------------------


def mount_secret(tls_dir: Path, files: Mapping[str, bytes]) -> None:
    """Publish one version of a Secret as kubelet's AtomicWriter does: the files in a new
    timestamped directory, ``..data`` swapped onto it by a rename, the top-level names as
    symlinks through ``..data``, then the previous version deleted."""
    tls_dir.mkdir(exist_ok=True)
    data = tls_dir / "..data"
    previous = os.readlink(data) if data.is_symlink() else None
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    version = Path(tempfile.mkdtemp(prefix=stamp, dir=tls_dir))
    for name, content in files.items():
        (version / name).write_bytes(content)
    staging = tls_dir / "..data_tmp"
    os.symlink(version.name, staging)
    os.replace(staging, data)
    for name in files:
        if not (tls_dir / name).is_symlink():
            os.symlink(f"..data/{name}", tls_dir / name)
    if previous is not None:
        for name in set(os.listdir(tls_dir / previous)) - files.keys():
            (tls_dir / name).unlink()
        shutil.rmtree(tls_dir / previous)
