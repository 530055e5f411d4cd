"""Real staging servers on loopback for the staging tests: moto's S3 server and nfs-ganesha.

moto checks SigV4 signatures once IAM is on (`INITIAL_NO_AUTH_ACTION_COUNT`): the first three
requests (create a user, its access key and an allow-all policy) pass unsigned, every later one
must be signed with that user's secret, so a wrong secret is refused as S3 refuses it. A role
the user may assume gives session credentials, whose token moto checks too.

nfs-ganesha serves a temporary folder over NFSv3 through its VFS backend, bound to 127.0.0.1
on free ports it registers with rpcbind (NFSv3's MOUNT protocol needs the portmapper); the
grace period is off (`Graceless`), and `Path` equals `Pseudo` as NFSv3 mounts the real path.
nfs-ganesha 6 (Debian 13) refuses to start where it cannot mark itself an I/O flusher, which
needs CAP_SYS_RESOURCE, absent from root in many containers: `allow_set_io_flusher_fail` lets it
go on (nfs-ganesha 4, Debian 12's, warns of the unknown option and ignores it).
Both servers run for the test session and are stopped at its end.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.nfs import NfsStaging
from pyrigaud.adapters.staging.nfs_location import NFS
from pyrigaud.adapters.staging.pvc import PvcStaging
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.adapters.staging.s3 import S3Staging
from pyrigaud.adapters.staging.s3_location import S3, S3Credentials
from pyrigaud.application.ports.staging import StagingStorage
from pyrigaud.domain.models import StagingType
from pyrigaud.domain.staging import StagedLocation

from support import ok
from support.ports import free_port

START_SECONDS = 30
BUCKET = "mig"
STAGING_ROLE = "staging"
ALLOW_ALL = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:*", "iam:*", "sts:*"], "Resource": "*"}],
    }
)
TRUST_ANYONE = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"server exited with {process.returncode}: {log.read_text()[-2000:]}"
            )
        with socket.socket() as probe, suppress(OSError):
            probe.settimeout(0.2)
            probe.connect(("127.0.0.1", port))
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key_id: str
    secret_access_key: str
    bucket: str = BUCKET

    def client(self, endpoint: str | None = None) -> Any:
        return s3_client(endpoint or self.endpoint, self.access_key_id, self.secret_access_key)

    def temporary_credentials(self) -> dict[str, str]:
        """A role's session credentials, in the manager's keys (with `sessionToken`)."""
        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name="us-east-1",
        )
        sts = session.client("sts", endpoint_url=self.endpoint)
        role = f"arn:aws:iam::123456789012:role/{STAGING_ROLE}"
        granted = sts.assume_role(RoleArn=role, RoleSessionName="staging")["Credentials"]
        return {
            "accessKeyID": granted["AccessKeyId"],
            "secretAccessKey": granted["SecretAccessKey"],
            "sessionToken": granted["SessionToken"],
        }


def s3_client(endpoint: str, access_key_id: str, secret: str) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )


@contextmanager
def moto_s3(workdir: Path) -> Iterator[S3Server]:
    """moto's standalone server checking credentials, with one user and the bucket made."""
    port = free_port()
    log = workdir / "moto.log"
    environment = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    try:
        _wait_for_port(port, process, log)
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.session.Session().client(
            "iam",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="stager")
        key = iam.create_access_key(UserName="stager")["AccessKey"]
        iam.put_user_policy(UserName="stager", PolicyName="s3", PolicyDocument=ALLOW_ALL)
        server = S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
        s3_client(endpoint, server.access_key_id, server.secret_access_key).create_bucket(
            Bucket=BUCKET
        )
        signed_iam = boto3.session.Session(
            aws_access_key_id=server.access_key_id,
            aws_secret_access_key=server.secret_access_key,
            region_name="us-east-1",
        ).client("iam", endpoint_url=endpoint)
        signed_iam.create_role(RoleName=STAGING_ROLE, AssumeRolePolicyDocument=TRUST_ANYONE)
        signed_iam.put_role_policy(RoleName=STAGING_ROLE, PolicyName="s3", PolicyDocument=ALLOW_ALL)
        yield server
    finally:
        _stop(process)


@dataclass(frozen=True)
class NfsServer:
    server: str
    export: Path  # served as itself: Path == Pseudo
    # Stop the server, and start it again (same ports, same export) after that many seconds,
    # in the background; the returned thread ends once it serves again.
    outage: Callable[[float], threading.Thread] = field(compare=False, repr=False)


@contextmanager
def ganesha_nfs(workdir: Path) -> Iterator[NfsServer]:
    """nfs-ganesha exporting a fresh folder on 127.0.0.1 (needs root, as the server does)."""
    export = Path(tempfile.mkdtemp(prefix="pyrigaud-nfs-export-"))
    export.chmod(0o777)
    nfs_port, mount_port = free_port(), free_port()
    config = workdir / "ganesha.conf"
    config.write_text(
        f"""
NFS_CORE_PARAM {{
    Protocols = 3;
    Bind_Addr = 127.0.0.1;
    NFS_Port = {nfs_port};
    MNT_Port = {mount_port};
    Enable_NLM = false;
    Enable_RQUOTA = false;
    allow_set_io_flusher_fail = true;
}}
NFSV4 {{ Graceless = true; }}
EXPORT {{
    Export_Id = 1;
    Path = {export};
    Pseudo = {export};
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = 3;
    Transports = TCP;
    SecType = sys;
    FSAL {{ Name = VFS; }}
}}
"""
    )
    log = workdir / "ganesha.log"
    portmapper = _rpcbind(workdir)
    command = ["ganesha.nfsd", "-F", "-L", str(log), "-f", str(config), "-p", str(workdir / "pid")]
    running: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        running[:] = [process]
        _wait_for_port(nfs_port, process, log)
        _wait_for_port(mount_port, process, log)

    def outage(seconds: float) -> threading.Thread:
        _stop(running[0])

        def come_back() -> None:
            time.sleep(seconds)
            start()

        thread = threading.Thread(target=come_back, daemon=True)
        thread.start()
        return thread

    try:
        try:
            start()
            yield NfsServer(server="127.0.0.1", export=export, outage=outage)
        finally:
            if running:
                _stop(running[0])
    finally:
        if portmapper is not None:
            _stop(portmapper)
        shutil.rmtree(export, ignore_errors=True)


def _rpcbind(workdir: Path) -> subprocess.Popen[bytes] | None:
    """rpcbind started for this session, or None when one already answers on port 111."""
    with socket.socket() as probe, suppress(OSError):
        probe.settimeout(0.5)
        probe.connect(("127.0.0.1", 111))
        return None
    log = workdir / "rpcbind.log"
    process = subprocess.Popen(
        ["rpcbind", "-f"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    _wait_for_port(111, process, log)
    return process


@dataclass
class FlakyProxy:
    """An HTTP proxy on loopback in front of the S3 server that answers 503 to UploadPart
    requests while `failures_left` > 0 (a negative value: always), counting what it refused,
    and cuts the connection half-way through `cuts_left` object downloads."""

    target_port: int
    failures_left: int = 0
    refused: int = 0
    cuts_left: int = 0
    ranges: list[str] = field(default_factory=list)  # the Range header of each download
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def should_cut(self, method: str, path: str) -> bool:
        with self.lock:
            if method != "GET" or "?" in path or self.cuts_left == 0:
                return False
            self.cuts_left -= 1
            return True

    def should_fail(self, path: str) -> bool:
        with self.lock:
            if "partNumber=" not in path or self.failures_left == 0:
                return False
            self.failures_left -= 1 if self.failures_left > 0 else 0
            self.refused += 1
            return True


@contextmanager
def flaky_proxy(target_endpoint: str) -> Iterator[FlakyProxy]:
    proxy = FlakyProxy(target_port=int(target_endpoint.rsplit(":", 1)[1]))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if proxy.should_fail(self.path):
                refusal = b"<Error><Code>SlowDown</Code><Message>try again</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Length", str(len(refusal)))
                self.end_headers()
                self.wfile.write(refusal)
                return
            upstream = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=60)
            try:
                upstream.putrequest(
                    self.command, self.path, skip_host=True, skip_accept_encoding=True
                )
                for name, value in self.headers.items():  # Host too: it is signed
                    upstream.putheader(name, value)
                upstream.endheaders(body)
                answer = upstream.getresponse()
                payload = answer.read()
            finally:
                upstream.close()
            if self.command == "GET" and "?" not in self.path:
                proxy.ranges.append(self.headers.get("Range", ""))
            cut = proxy.should_cut(self.command, self.path)
            self.send_response(answer.status)
            dropped: tuple[str, ...] = ("transfer-encoding", "connection")
            if self.command != "HEAD":  # a HEAD's length is the object's: keep it
                dropped = (*dropped, "content-length")
                self.send_header("Content-Length", str(len(payload)))
            for name, value in answer.getheaders():
                if name.lower() not in dropped:
                    self.send_header(name, value)
            self.end_headers()
            if cut:  # half the body, then the connection drops
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif self.command != "HEAD":
                self.wfile.write(payload)

        def do_GET(self) -> None:
            self._relay()

        def do_HEAD(self) -> None:
            self._relay()

        def do_PUT(self) -> None:
            self._relay()

        def do_POST(self) -> None:
            self._relay()

        def do_DELETE(self) -> None:
            self._relay()

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    proxy.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()


# --- One case per backend, for the contract suite ------------------------------------------

MiB = 1024 * 1024
OWNER = "tests/pyrigaud"


def system_time() -> dict[str, Any]:
    """The clock and queue of deferred aborts an S3 or NFS store made outside the container
    runs on: the system's clock, as the container gives it."""
    clock = SystemClock()
    return {"clock": clock, "aborts": DeferredAborts(clock)}


S3_PART_BYTES = 5 * MiB  # S3's smallest part: a few MiB make a multipart upload
CHUNK_BYTES = 256 * 1024


@dataclass
class StagingCase:
    """A backend's adapter, how to name an object on it, and what is really on the storage."""

    backend: StagingType
    storage: StagingStorage
    locate: Callable[[str], StagedLocation]
    stored: Callable[[StagedLocation], bytes | None]  # read past the adapter
    leftovers: Callable[[], list[str]]  # temporaries or uploads in progress
    adapter_for_owner: Callable[[str], StagingStorage]


def s3_options(server: S3Server, endpoint: str | None = None) -> dict[str, object]:
    return {
        "backend": "s3",
        "bucket": server.bucket,
        "endpoint": endpoint or server.endpoint,
        "region": "us-east-1",
        "prefix": "lab",
        "usePathStyle": True,
    }


def s3_credentials(server: S3Server) -> dict[str, str]:
    return {"accessKeyID": server.access_key_id, "secretAccessKey": server.secret_access_key}


def nfs_options(server: NfsServer) -> dict[str, object]:
    return {
        "backend": "nfs",
        "usePathStyle": False,
        "server": server.server,
        "export": str(server.export),
    }


def migration_name(request: pytest.FixtureRequest) -> str:
    """A name unique to the test, as the manager's `<ns>/<migration>` is to a migration."""
    return hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]


def pvc_case(root: Path, migration: str) -> StagingCase:
    (root / "mig-pvc").mkdir(parents=True, exist_ok=True)
    folder = root / "mig-pvc" / "vmmigrations" / "ns" / migration

    def locate(name: str) -> StagedLocation:
        url = f"pvc://mig-pvc/vmmigrations/ns/{migration}/{name}"
        return ok(STAGING_TYPES.parse_location("destination_url", url, PVC, {}, {}))

    def stored(location: StagedLocation) -> bytes | None:
        path = root / location.container / location.key
        return path.read_bytes() if path.is_file() else None

    def leftovers() -> list[str]:
        return sorted(p.name for p in folder.glob(".*")) if folder.is_dir() else []

    def adapter(owner: str) -> PvcStaging:
        return PvcStaging(root=str(root), owner=owner, chunk_bytes=CHUNK_BYTES, clock=SystemClock())

    return StagingCase(PVC, adapter(OWNER), locate, stored, leftovers, adapter)


def s3_case(server: S3Server, migration: str) -> StagingCase:
    client = server.client()

    def locate(name: str) -> StagedLocation:
        url = f"s3://{server.bucket}/lab/vmmigrations/ns/{migration}/{name}"
        return ok(
            STAGING_TYPES.parse_location(
                "destination_url",
                url,
                S3,
                s3_options(server),
                s3_credentials(server),
            )
        )

    def stored(location: StagedLocation) -> bytes | None:
        try:
            body: bytes = client.get_object(Bucket=location.container, Key=location.key)[
                "Body"
            ].read()
            return body
        except client.exceptions.NoSuchKey:
            return None

    def leftovers() -> list[str]:
        """Uploads in progress, and the markers (hidden names) that go with them."""
        folder = f"lab/vmmigrations/ns/{migration}/"
        uploads = client.list_multipart_uploads(Bucket=server.bucket, Prefix=folder)
        objects = client.list_objects_v2(Bucket=server.bucket, Prefix=f"{folder}.")
        return sorted(
            [f"upload {upload['Key']}" for upload in uploads.get("Uploads", [])]
            + [entry["Key"] for entry in objects.get("Contents", [])]
        )

    def adapter(owner: str) -> S3Staging:
        return S3Staging(
            owner=owner, chunk_bytes=CHUNK_BYTES, part_bytes=S3_PART_BYTES, **system_time()
        )

    return StagingCase(S3, adapter(OWNER), locate, stored, leftovers, adapter)


def nfs_case(server: NfsServer, migration: str) -> StagingCase:
    def locate(name: str) -> StagedLocation:
        url = f"nfs://{server.server}{server.export}/vmmigrations-ns-{migration}-{name}"
        return ok(
            STAGING_TYPES.parse_location("destination_url", url, NFS, nfs_options(server), {})
        )

    def stored(location: StagedLocation) -> bytes | None:
        path = server.export / location.key
        return path.read_bytes() if path.is_file() else None

    def leftovers() -> list[str]:
        return sorted(
            name
            for name in os.listdir(server.export)
            if name.startswith(f".vmmigrations-ns-{migration}-")
        )

    def adapter(owner: str) -> NfsStaging:
        return NfsStaging(owner=owner, chunk_bytes=CHUNK_BYTES, **system_time())

    return StagingCase(NFS, adapter(OWNER), locate, stored, leftovers, adapter)


def manager_s3_options(server: S3Server, prefix: str = "") -> tuple[str, dict[str, str]]:
    """The storage_options_json and credentials the manager sends for this S3 server."""
    options: dict[str, object] = {
        "backend": "s3",
        "bucket": server.bucket,
        "endpoint": server.endpoint,
        "region": "us-east-1",
        **({"prefix": prefix} if prefix else {}),
        "usePathStyle": True,
    }
    credentials = {"accessKeyID": server.access_key_id, "secretAccessKey": server.secret_access_key}
    return json.dumps(options, separators=(",", ":")), credentials


def manager_nfs_options(server: NfsServer) -> str:
    """The storage_options_json the manager sends for this NFS server."""
    options = {
        "backend": "nfs",
        "usePathStyle": False,
        "server": server.server,
        "export": str(server.export),
    }
    return json.dumps(options, separators=(",", ":"))


def describe_case(staging: StagingCase, location: StagedLocation) -> str:
    """What a child process needs to open the same adapter on `location` (secrets on
    stdin, never argv)."""
    adapter = staging.storage
    return json.dumps(
        {
            "adapter": type(adapter).__name__,
            "settings": {
                key: getattr(adapter, key)
                for key in ("root", "owner", "chunk_bytes", "part_bytes")
                if hasattr(adapter, key)
            },
            "location": location.model_dump(mode="json", exclude={"options", "credentials"}),
            # The type's own options value, rebuilt as its class in the child.
            "options": [
                type(location.options).__module__,
                type(location.options).__qualname__,
                location.options.model_dump(mode="json"),
            ],
            "credentials": None
            if not isinstance(location.credentials, S3Credentials)
            else {
                "access_key_id": location.credentials.access_key_id,
                "secret_access_key": location.credentials.secret_access_key.get_secret_value(),
            },
        }
    )


def killed_writer(staging: StagingCase, location: StagedLocation) -> None:
    """A process that opened a writer on `location` and wrote 11 MiB, killed with SIGKILL:
    what a provider killed mid-transfer leaves on the storage."""
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(describe_case(staging, location).encode())  # secrets stay off argv
        child.stdin.close()
        assert child.stdout.readline().strip() == b"written", "the writer never got going"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        child.kill()
        child.wait(30)


# The start of a child process's script: the adapter and the location `describe_case` sent.
ADAPTER_AND_LOCATION = """
import importlib, json, sys
from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging import nfs, pvc, s3
from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.s3_location import S3Credentials
from pyrigaud.domain.staging import StagedLocation

described = json.load(sys.stdin)
adapters = {"PvcStaging": pvc.PvcStaging, "S3Staging": s3.S3Staging, "NfsStaging": nfs.NfsStaging}
clock = SystemClock()
on_time = {"clock": clock} if described["adapter"] == "PvcStaging" else {
    "clock": clock, "aborts": DeferredAborts(clock)
}
adapter = adapters[described["adapter"]](**described["settings"], **on_time)
module, name, options = described["options"]
credentials = described["credentials"]
location = StagedLocation.model_validate(
    {
        **described["location"],
        "options": getattr(importlib.import_module(module), name).model_validate(options),
        "credentials": None if credentials is None else S3Credentials(**credentials),
    }
)
"""

CRASHING_WRITER = (
    ADAPTER_AND_LOCATION
    + """
import time
writer = adapter.open_write(location).unwrap()
for _ in range(11):
    writer.write(bytes(1024 * 1024)).unwrap()
print("written", flush=True)
time.sleep(600)
"""
)
