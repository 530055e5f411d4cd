"""Domain paths -> the manager's field names, written once at the gRPC edge."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import NetworkAttachment
from pyrigaud.entrypoints.grpc import wire
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager, wire_name

# The attributes a clone's customization carries (clone_requests._customization), and the ones
# a backend names although Clone has no key for them.
CLONE_NIC_ATTRIBUTES = ("name", "network_name", "static_ip", "prefix", "gateway", "dns")
CLONE_NIC_NAMED_ANYWAY = ("portgroup", "model")

# Each path-making function of domain.fields and every path it can make.
PATHS_MADE_BY: dict[Callable[..., str], list[str]] = {
    fields.class_extra_config: [fields.class_extra_config("virtualHW.version")],
    fields.disk_type: [fields.disk_type(0), fields.disk_type(3)],
    fields.desired_disk: [fields.desired_disk(0), fields.desired_disk(2)],
    fields.network_name: [fields.network_name(1)],
    fields.network_field: [
        fields.network_field(1, attribute) for attribute in NetworkAttachment.model_fields
    ],
    fields.customize_network: [fields.customize_network(2)],
    fields.storage_option: [fields.storage_option("bucket"), fields.storage_option("usePathStyle")],
    fields.staging_credential: [fields.staging_credential("secretAccessKey")],
    fields.customize_network_field: [
        fields.customize_network_field(2, attribute)
        for attribute in CLONE_NIC_ATTRIBUTES + CLONE_NIC_NAMED_ANYWAY
    ],
}


def every_domain_path() -> list[str]:
    constants = [
        value for name, value in vars(fields).items() if name.isupper() and isinstance(value, str)
    ]
    return constants + [path for paths in PATHS_MADE_BY.values() for path in paths]


def test_every_path_making_function_is_sampled() -> None:
    """A new function in domain.fields must say here which paths it makes."""
    functions = {
        function
        for name, function in inspect.getmembers(fields, inspect.isfunction)
        if function.__module__ == fields.__name__ and not name.startswith("_")
    }
    assert functions == set(PATHS_MADE_BY)


@pytest.mark.parametrize("path", every_domain_path())
def test_every_domain_path_has_a_wire_name(path: str) -> None:
    assert wire_name(path) is not None, f"{path} has no name on the wire"


@pytest.mark.parametrize(
    ("path", "name"),
    [
        (fields.IMAGE_URL, "image_json.URL"),
        (fields.PREPARE_URL, "image_json.url"),
        (fields.PREPARE_OVA_URL, "image_json.ovaURL"),
        (fields.PREPARE_CHECKSUM_TYPE, "image_json.checksumType"),
        (fields.network_name(1), "networks_json[1].NetworkName"),
        (fields.network_field(0, "static_ip"), "networks_json[0].StaticIP"),
        (fields.customize_network_field(3, "static_ip"), "customize_json.networks[3].ipAddress"),
        (fields.customize_network(3), "customize_json.networks[3]"),
        (fields.disk_type(12), "disks_json[12].Type"),
        (
            fields.class_extra_config("virtualHW.version"),
            'class_json.ExtraConfig["virtualHW.version"]',
        ),
        (fields.CLASS_SECURE_BOOT, "class_json.SecurityProfile.SecureBoot"),
        (fields.DESIRED_DISKS, "desired_json.Disks"),
        (fields.desired_disk(2), "Disks[2]"),
        (fields.TRANSFER_MODE, "transfer_mode"),
        (fields.SOURCE_URL, "source_url"),
        (fields.STAGING_TYPE, "backend_type"),
        (fields.STORAGE_OPTIONS, "storage_options_json"),
        (fields.storage_option("bucket"), "storage_options_json.bucket"),
        (fields.storage_option("usePathStyle"), "storage_options_json.usePathStyle"),
        (fields.staging_credential("secretAccessKey"), "credentials.secretAccessKey"),
    ],
)
def test_paths_are_named_as_the_manager_sends_them(path: str, name: str) -> None:
    assert wire_name(path) == name


def test_create_and_image_prepare_errors_keep_their_wire_text() -> None:
    """Create sends Go struct names, ImagePrepare camelCase: one domain error each way."""
    create = ProviderError.invalid_spec(fields.IMAGE_CHECKSUM, "the image's sha256 is abc, not def")
    prepare = ProviderError.invalid_spec(fields.PREPARE_FORMAT, "the image is qcow2, not raw")
    assert create.message == "image.checksum: the image's sha256 is abc, not def"
    assert for_the_manager(create) == "image_json.Checksum: the image's sha256 is abc, not def"
    assert for_the_manager(prepare) == "image_json.format: the image is qcow2, not raw"


def test_a_mentioned_path_is_renamed_too_and_only_as_a_whole() -> None:
    blank = ProviderError.invalid_spec(
        fields.IMAGE,
        f"vSphere cannot make a blank root disk; set {fields.IMAGE_TEMPLATE_NAME}",
        mentions=(fields.IMAGE_TEMPLATE_NAME,),
    )
    assert for_the_manager(blank) == (
        "image_json: vSphere cannot make a blank root disk; set image_json.TemplateName"
    )
    mode = ProviderError.invalid_spec(
        fields.TRANSFER_MODE,
        f"backends aside, {fields.STAGING_TYPE} 's3' refuses it",
        mentions=(fields.STAGING_TYPE,),
    )
    assert for_the_manager(mode) == "transfer_mode: backends aside, backend_type 's3' refuses it"


def test_a_field_of_any_kind_and_a_longer_message_keep_the_name() -> None:
    tpm = ProviderError.unsupported("a virtual TPM needs vSphere 6.7", fields.CLASS_TPM_ENABLED)
    assert tpm.kind is ErrorKind.UNSUPPORTED
    assert for_the_manager(tpm) == (
        "class_json.SecurityProfile.TPMEnabled: a virtual TPM needs vSphere 6.7"
    )
    refused = ProviderError.invalid_spec(fields.PREPARE_OVA_URL, "not a vmdk")
    longer = refused.model_copy(update={"message": f"{refused.message} (the package's disk)"})
    assert for_the_manager(longer) == "image_json.ovaURL: not a vmdk (the package's disk)"


def test_what_the_wire_parsers_refuse_is_already_named_for_the_manager() -> None:
    bad = wire.parse_prepare_image(image_json="{", target_name="", storage_hint="")
    error = bad.failure()
    assert error.field is None
    assert for_the_manager(error) == error.message
    assert error.message.startswith("image_json: ")


def test_a_message_without_a_field_is_left_alone() -> None:
    plain = ProviderError.not_found("VM 'image.url' not found")
    assert for_the_manager(plain) == "VM 'image.url' not found"
