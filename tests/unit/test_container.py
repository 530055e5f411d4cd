"""The composition root picks adapters by configuration alone."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest
from dependency_injector import providers

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.credentials.environment import EnvironmentCredentials
from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    DiskQuery,
    ExportRequest,
    ImageSource,
    ImportRequest,
    PrepareImageRequest,
    SnapshotRequest,
)
from pyrigaud.entrypoints.container import Container
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.servicer import method_handlers
from pyrigaud.entrypoints.settings import SettingsError, load_settings

from support import ManualClock, error_kind, error_of
from support.transfer import staged


def adapter_package(backend: Backend) -> str:
    """The backend package every port of `backend` comes from."""
    packages = {
        type(port).__module__.split(".")[3] for port in vars(backend).values() if port is not None
    }
    assert len(packages) == 1, packages
    return packages.pop()


def test_the_backend_is_chosen_by_provider_type() -> None:
    assert (
        adapter_package(
            Container(settings=load_settings({}, staging_types=STAGING_TYPES)).backend()
        )
        == "libvirt"
    )
    fake = Container(
        settings=load_settings({"PROVIDER_TYPE": "fake"}, staging_types=STAGING_TYPES)
    ).backend()
    assert adapter_package(fake) == "fake"


def test_every_hypervisor_shows_its_counters_at_zero_from_start_up() -> None:
    """Whichever counters a hypervisor takes: panels show zero rather than no data."""
    for provider_type in ("libvirt", "fake"):
        container = Container(
            settings=load_settings({"PROVIDER_TYPE": provider_type}, staging_types=STAGING_TYPES)
        )
        container.backend()
        exposed = container.metrics().exposition()[0].decode()
        for counter in ("session_reconnects", "inventory_resyncs", "hypervisor_round_trips"):
            assert f'pyrigaud_{counter}_total{{backend="{provider_type}"}} 0.0' in exposed
        assert (
            f'pyrigaud_hardware_fallbacks_total{{backend="{provider_type}",device="nic"}} 0.0'
            in exposed
        )


def test_the_credentials_source_is_chosen_by_configuration(tmp_path: Path) -> None:
    files = Container(
        settings=load_settings(
            {"PYRIGAUD_CREDENTIALS_DIR": str(tmp_path)}, staging_types=STAGING_TYPES
        )
    ).credentials()
    assert isinstance(files, MountedSecretCredentials)
    env = Container(
        settings=load_settings({"PYRIGAUD_CREDENTIALS": "env"}, staging_types=STAGING_TYPES)
    ).credentials()
    assert isinstance(env, EnvironmentCredentials)


def test_kubernetes_credentials_need_a_secret_name() -> None:
    with pytest.raises(SettingsError, match="PYRIGAUD_CREDENTIALS_SECRET"):
        load_settings({"PYRIGAUD_CREDENTIALS": "kubernetes"}, staging_types=STAGING_TYPES)
    with pytest.raises(SettingsError, match="PYRIGAUD_CREDENTIALS"):
        load_settings({"PYRIGAUD_CREDENTIALS": "vault"}, staging_types=STAGING_TYPES)


def test_the_mutation_rate_limit_is_configured_from_settings() -> None:
    limiter = Container(
        settings=load_settings(
            {"PYRIGAUD_RATE_QPS": "5", "PYRIGAUD_RATE_BURST": "1"}, staging_types=STAGING_TYPES
        )
    ).limiter()
    with limiter.slot(None) as first:
        assert first
    with limiter.slot(0.0) as second:  # no time left for the next token
        assert not second
        assert "rate limit of 5" in second.refusal


def test_a_backend_without_a_port_answers_unsupported_for_its_rpcs() -> None:
    full = fake_backend(FakeHypervisor(ManualClock()))
    without = dataclasses.replace(
        full, snapshots=None, cloning=None, images=None, disk_transfer=None
    )
    container = Container(
        settings=load_settings({"PROVIDER_TYPE": "fake"}, staging_types=STAGING_TYPES)
    )
    container.backend.override(providers.Object(without))
    use = container.use_cases()
    refused = (
        use.create_snapshot(SnapshotRequest(vm_id="v", name="s")),
        use.delete_snapshot("v", "s"),
        use.revert_snapshot("v", "s"),
        use.clone_vm(CloneRequest(source_vm_id="v", target_name="c")),
        use.prepare_image(PrepareImageRequest(source=ImageSource(path="/i"), target_name="i")),
        use.export_disk(ExportRequest(vm_id="v", destination=staged("pvc://p/x"))),
        use.import_disk(ImportRequest(source=staged("pvc://p/x"))),
        use.get_disk_info(DiskQuery(vm_id="v")),
    )
    assert [error_kind(result) for result in refused] == [ErrorKind.UNSUPPORTED] * len(refused)
    assert "snapshots" in error_of(refused[0]).message


def test_every_rpc_of_the_proto_has_a_spec() -> None:
    container = Container(
        settings=load_settings({"PROVIDER_TYPE": "fake"}, staging_types=STAGING_TYPES)
    )
    served = set(method_handlers(container.rpcs()))
    assert served == set(pb.DESCRIPTOR.services_by_name["Provider"].methods_by_name)


def test_each_rpc_is_served_by_the_handler_named_for_it() -> None:
    rpcs = Container(
        settings=load_settings({"PROVIDER_TYPE": "fake"}, staging_types=STAGING_TYPES)
    ).rpcs()
    for rpc in rpcs:
        assert rpc.handle.__name__ == re.sub(r"(?<=[a-z])(?=[A-Z])", "_", rpc.name).lower()
    assert len(rpcs) == len(pb.DESCRIPTOR.services_by_name["Provider"].methods)


def test_plaintext_is_decided_and_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    """Every piece that needs the server's TLS gets the one decision (a provider that made it
    again at each use would warn again each time)."""
    container = Container(
        settings=load_settings(
            {
                "VIRTRIGAUD_PROVIDER_INSECURE": "true",
                "PROVIDER_TYPE": "fake",
                "PYRIGAUD_PORT": "0",
                "PYRIGAUD_HEALTH_PORT": "0",
                "PYRIGAUD_LISTEN_ADDRESS": "127.0.0.1",
            },
            staging_types=STAGING_TYPES,
        )
    )
    with caplog.at_level(logging.WARNING):
        container.grpc_server()
        assert not container.mutual_tls()
        assert not container.mutual_tls()
    warnings = [record for record in caplog.records if "PLAINTEXT" in record.getMessage()]
    assert len(warnings) == 1


def clock_holders(*roots: object) -> dict[str, set[int]]:
    """Every pyrigaud object reachable from `roots` (through attributes and collections) that
    holds a clock, by its class name, with the ids of the clocks it holds."""
    holders: dict[str, set[int]] = {}
    seen: set[int] = set()
    pending = list(roots)
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            pending.extend(item)
        elif type(item).__module__.startswith("pyrigaud.") and hasattr(item, "__dict__"):
            for value in vars(item).values():
                if isinstance(value, SystemClock | ManualClock):
                    holders.setdefault(type(item).__name__, set()).add(id(value))
                else:
                    pending.append(value)
    return holders


@pytest.mark.parametrize(
    ("environ", "readers"),
    [
        ({"PROVIDER_TYPE": "fake"}, {"FakeHypervisor", "FakeFaults"}),
        ({"PROVIDER_TYPE": "libvirt"}, {"LibvirtHost", "DomainCache"}),
        (
            {
                "PROVIDER_TYPE": "vsphere",
                "PROVIDER_ENDPOINT": "https://127.0.0.1:1/sdk",
                "PYRIGAUD_CREDENTIALS": "env",
            },
            {"VSphereSession", "CloneMaker", "ImportMarks"},
        ),
    ],
)
def test_the_containers_clock_is_the_only_clock_every_component_reads(
    environ: dict[str, str], readers: set[str]
) -> None:
    """A clock given to the container reaches every piece that reads time: the hypervisor's
    ports and sessions, the staging stores and their queue of deferred aborts, the mutation
    limits and their rate limit, the use cases that wait or time a transfer."""
    clock = ManualClock()
    environ = {**environ, "PYRIGAUD_RATE_QPS": "5"}
    container = Container(settings=load_settings(environ, staging_types=STAGING_TYPES))
    container.clock.override(providers.Object(clock))
    backend, staging = container.backend(), container.staging()
    holders = clock_holders(backend, staging, container.limiter(), container.use_cases())
    session = vars(backend.health).get("_session")  # vSphere's: its update feed stops with it
    if session is not None:
        session.close()
    everywhere = {"PvcStaging", "DeferredAborts", "MutationLimiter", "TokenBucket"}
    everywhere |= {"TransferContext", "PowerVM", "TaskStatus"}
    assert readers | everywhere <= set(holders)
    assert set().union(*holders.values()) == {id(clock)}
