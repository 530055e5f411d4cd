"""The manager's name for each request field, and the one table from domain paths to them.

The wire parsers name a bad field as the manager sent it; the domain and the backends name it
by its domain path (`pyrigaud.domain.fields`), and `for_the_manager` writes those paths the
manager's way when an error goes on the wire, so a user reads the same name whatever the
hypervisor. Create and Reconfigure send Go struct field names (capitalised), Clone's
customization and ImagePrepare's image camelCase keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError

# The requests' fields (the proto's names).
NAME = "name"
TARGET_NAME = "target_name"
CLASS = "class_json"
IMAGE = "image_json"
NETWORKS = "networks_json"
DISKS = "disks_json"
PLACEMENT = "placement_json"
USER_DATA = "user_data"
META_DATA = "meta_data"
TAGS = "tags"
DESIRED = "desired_json"
POWER_OP = "op"
GRACEFUL_TIMEOUT = "graceful_timeout_seconds"
TARGET_VERSION = "target_version"
NAME_HINT = "name_hint"
DESCRIPTION = "description"
CUSTOMIZE = "customize_json"
BACKEND_TYPE = "backend_type"
TRANSFER_MODE = "transfer_mode"
DISK_FORMAT = "format"
DESTINATION_URL = "destination_url"
SOURCE_URL = "source_url"
EXPECTED_CHECKSUM = "expected_checksum"
CREDENTIALS = "credentials"
STORAGE_OPTIONS = "storage_options_json"
STORAGE_HINT = "storage_hint"

# Clone's class_json (a CRD spec: camelCase keys, memory as a Kubernetes quantity).
CLONE_CPU = f"{CLASS}.cpu"
CLONE_MEMORY = f"{CLASS}.memory"

# ImagePrepare's image_json that holds no known source.
PREPARE_SOURCE = f"{IMAGE}.source"

# A NetworkAttachment attribute -> its key in Create's networks_json (Go names) and in Clone's
# customize_json.networks (camelCase; a portgroup is named by its networkName there, and a
# model by the key Clone would carry it under).
_CREATE_NIC_KEYS = {
    "name": "Name",
    "portgroup": "Portgroup",
    "network_name": "NetworkName",
    "bridge": "Bridge",
    "vlan": "VLAN",
    "model": "Model",
    "mac_address": "MacAddress",
    "ip_policy": "IPPolicy",
    "static_ip": "StaticIP",
    "prefix": "Prefix",
    "gateway": "Gateway",
    "dns": "DNS",
    "pci_slot_number": "PCISlotNumber",
}
_CLONE_NIC_KEYS = {
    "name": "name",
    "portgroup": "networkName",
    "network_name": "networkName",
    "model": "model",
    "static_ip": "ipAddress",
    "prefix": "prefix",
    "gateway": "gateway",
    "dns": "dns",
}

# Maps the manager sends whose keys a staging type reads: `<path>.<key>` is `<name>.<key>`, the
# key as it was sent (each type reads its own keys; the table need not know them).
_KEYED: Mapping[str, str] = {
    fields.STORAGE_OPTIONS: STORAGE_OPTIONS,
    fields.STAGING_CREDENTIALS: CREDENTIALS,
}

# Subscripts (`[1]`, `["key"]`) stand as `[]` in the table and are carried over as they are.
_SUBSCRIPT = re.compile(r"\[[^\]]*\]")

_WIRE_NAMES: Mapping[str, str] = {
    fields.TARGET_NAME: TARGET_NAME,
    fields.STORAGE_HINT: STORAGE_HINT,
    fields.SOURCE_URL: SOURCE_URL,
    fields.DESTINATION_URL: DESTINATION_URL,
    fields.TRANSFER_MODE: TRANSFER_MODE,
    fields.STAGING_TYPE: BACKEND_TYPE,
    fields.STORAGE_OPTIONS: STORAGE_OPTIONS,
    fields.STAGING_CREDENTIALS: CREDENTIALS,
    fields.IMAGE: IMAGE,
    fields.IMAGE_TEMPLATE_NAME: f"{IMAGE}.TemplateName",
    fields.IMAGE_PATH: f"{IMAGE}.Path",
    fields.IMAGE_URL: f"{IMAGE}.URL",
    fields.IMAGE_FORMAT: f"{IMAGE}.Format",
    fields.IMAGE_CHECKSUM: f"{IMAGE}.Checksum",
    fields.IMAGE_CHECKSUM_TYPE: f"{IMAGE}.ChecksumType",
    fields.PLACEMENT_DATASTORE: f"{PLACEMENT}.Datastore",
    fields.PLACEMENT_STORAGE_POD: f"{PLACEMENT}.StoragePod",
    fields.PLACEMENT_CLUSTER: f"{PLACEMENT}.Cluster",
    fields.PLACEMENT_HOST: f"{PLACEMENT}.Host",
    fields.PLACEMENT_FOLDER: f"{PLACEMENT}.Folder",
    fields.CLASS_SECURE_BOOT: f"{CLASS}.SecurityProfile.SecureBoot",
    fields.CLASS_TPM_ENABLED: f"{CLASS}.SecurityProfile.TPMEnabled",
    fields.CLASS_TPM_VERSION: f"{CLASS}.SecurityProfile.TPMVersion",
    "vm_class.extra_config[]": f"{CLASS}.ExtraConfig[]",
    fields.DESIRED_DISKS: f"{DESIRED}.Disks",
    # One of them, as Reconfigure's refusals have always named it.
    f"{fields.DESIRED_DISKS}[]": "Disks[]",
    "disks[].type": f"{DISKS}[].Type",
    **{
        f"networks[].{attribute}": f"{NETWORKS}[].{key}"
        for attribute, key in _CREATE_NIC_KEYS.items()
    },
    "customization.networks[]": f"{CUSTOMIZE}.networks[]",
    **{
        f"customization.networks[].{attribute}": f"{CUSTOMIZE}.networks[].{key}"
        for attribute, key in _CLONE_NIC_KEYS.items()
    },
    fields.PREPARE_TEMPLATE_NAME: f"{IMAGE}.templateName",
    fields.PREPARE_PATH: f"{IMAGE}.path",
    fields.PREPARE_URL: f"{IMAGE}.url",
    fields.PREPARE_OVA_URL: f"{IMAGE}.ovaURL",
    fields.PREPARE_FORMAT: f"{IMAGE}.format",
    fields.PREPARE_CHECKSUM: f"{IMAGE}.checksum",
    fields.PREPARE_CHECKSUM_TYPE: f"{IMAGE}.checksumType",
    fields.PREPARE_STORAGE_POOL: f"{IMAGE}.storagePool",
    fields.PREPARE_CONTENT_LIBRARY: f"{IMAGE}.contentLibrary",
}


def wire_name(path: str) -> str | None:
    """The manager's name for the field at domain path `path`, or None when it has none."""
    template = _WIRE_NAMES.get(_SUBSCRIPT.sub("[]", path))
    if template is None:
        head, _, key = path.partition(".")
        return f"{_KEYED[head]}.{key}" if head in _KEYED and key else None
    first, *rest = template.split("[]")
    return first + "".join(map(str.__add__, _SUBSCRIPT.findall(path), rest))


def for_the_manager(error: ProviderError) -> str:
    """The error's message with the domain paths it names written as the manager spells them."""
    message = error.message
    if error.field is not None and message.startswith(f"{error.field}: "):
        message = _named(error.field) + message[len(error.field) :]
    for path in error.mentions:  # as a whole path: `backend` is not renamed in `backends`
        whole = rf"(?<![\w.]){re.escape(path)}(?![\w.\[])"
        message = re.sub(whole, _named(path).replace("\\", "\\\\"), message)
    return message


def _named(path: str) -> str:
    # A path the table lacks (a test keeps every path of domain.fields in it) stays as it is.
    return wire_name(path) or path
