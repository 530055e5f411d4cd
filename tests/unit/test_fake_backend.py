"""What the fake backend itself answers, below the use cases' rules."""

from __future__ import annotations

import dataclasses

import pytest

from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.application.backend import Backend
from pyrigaud.application.use_cases.capabilities import TransferClaims
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    ImageSource,
    OwnerMark,
    Placement,
    PrepareImageRequest,
    VMClass,
    VMImage,
)
from pyrigaud.domain.staging import StagingType

from support import ManualClock, error_kind, error_of, ok

OWNER = OwnerMark(provider="ns/provider")


@pytest.fixture
def backend() -> Backend:
    return fake_backend(FakeHypervisor(ManualClock()))


def request(name: str, **changes: object) -> CreateRequest:
    base = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256))
    return base.model_copy(update=changes)


def test_the_fake_serves_every_port(backend: Backend) -> None:
    missing = [
        port.name for port in dataclasses.fields(backend) if getattr(backend, port.name) is None
    ]
    assert missing == []


def test_a_second_vm_of_one_name_is_refused_whoever_made_the_first(backend: Backend) -> None:
    """The adapter reports the name in use; whether that VM is ours is the ownership rule's."""
    source = ok(backend.lifecycle.start_create(request("source"), OWNER)).id
    ok(backend.lifecycle.start_create(request("once"), OWNER))
    assert error_kind(backend.lifecycle.start_create(request("once"), OWNER)) is (
        ErrorKind.ALREADY_EXISTS
    )
    assert backend.cloning is not None
    clone = backend.cloning.start_clone(
        CloneRequest(source_vm_id=source, target_name="once"), OWNER
    )
    assert error_kind(clone) is ErrorKind.ALREADY_EXISTS


def test_the_fake_has_no_templates(backend: Backend) -> None:
    create = backend.lifecycle.start_create(
        request("from-template", image=VMImage(template_name="ubuntu")), OWNER
    )
    error = error_of(create)
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(fields.IMAGE_TEMPLATE_NAME)
    assert ok(backend.lifecycle.find_by_name("from-template")) is None
    assert backend.images is not None
    prepare = backend.images.prepare_image(
        PrepareImageRequest(source=ImageSource(template_name="ubuntu"), target_name="ubuntu")
    )
    error = error_of(prepare)
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(fields.PREPARE_TEMPLATE_NAME)


def test_the_fake_offers_the_datastores_it_is_given() -> None:
    backend = fake_backend(FakeHypervisor(ManualClock(), datastores=("fast", "slow")))
    ok(backend.lifecycle.start_create(request("on-default"), OWNER))
    ok(
        backend.lifecycle.start_create(
            request("on-slow", placement=Placement(datastore="slow")), OWNER
        )
    )
    elsewhere = request("elsewhere", placement=Placement(datastore="default"))
    error = error_of(backend.lifecycle.start_create(elsewhere, OWNER))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(fields.PLACEMENT_DATASTORE)


def test_the_capabilities_claim_the_staging_types_built_and_relay_only() -> None:
    """No backend claims staging types or modes: the application claims the types whose store
    was built, and relay, over what the backend claims."""
    backend = fake_backend(FakeHypervisor(ManualClock()))
    told = backend.capabilities.capabilities()
    assert told.supported_export_backends == told.supported_transfer_modes == ()
    caps = TransferClaims(backend.capabilities, (StagingType("pvc"),)).capabilities()
    assert caps.supported_export_backends == caps.supported_import_backends == ("pvc",)
    assert caps.supported_transfer_modes == ("relay",)
    assert (
        caps.model_copy(
            update={
                "supported_export_backends": (),
                "supported_import_backends": (),
                "supported_transfer_modes": (),
            }
        )
        == told
    )
