"""The manager's name for each request field that a backend may refuse, in one place.

Every backend names a bad field the way the manager sent it (`image_json.URL`,
`networks_json[1].NetworkName`), so a user reads the same message whatever the hypervisor.
Create and Clone send Go struct field names (capitalised); ImagePrepare sends camelCase keys.
"""

from __future__ import annotations

# Top-level request fields (the proto's names).
NAME = "name"
TARGET_NAME = "target_name"
CLASS = "class_json"
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
SNAPSHOT_ID = "snapshot_id"
SOURCE_URL = "source_url"
EXPECTED_CHECKSUM = "expected_checksum"
CREDENTIALS = "credentials"
STORAGE_OPTIONS = "storage_options_json"

# Clone's class_json (a CRD spec: camelCase keys, memory as a Kubernetes quantity).
CLONE_CPU = "class_json.cpu"
CLONE_MEMORY = "class_json.memory"

# Create's image_json (Go's contracts.VMImage: every key present, capitalised).
IMAGE = "image_json"
IMAGE_TEMPLATE_NAME = "image_json.TemplateName"
IMAGE_PATH = "image_json.Path"
IMAGE_URL = "image_json.URL"
IMAGE_FORMAT = "image_json.Format"
IMAGE_CHECKSUM = "image_json.Checksum"
IMAGE_CHECKSUM_TYPE = "image_json.ChecksumType"

# Create's placement_json.
PLACEMENT_DATASTORE = "placement_json.Datastore"
PLACEMENT_STORAGE_POD = "placement_json.StoragePod"
PLACEMENT_CLUSTER = "placement_json.Cluster"
PLACEMENT_HOST = "placement_json.Host"
PLACEMENT_FOLDER = "placement_json.Folder"

# ImagePrepare's image_json (camelCase keys) and its storage hint.
PREPARE_TEMPLATE_NAME = "image_json.templateName"
PREPARE_PATH = "image_json.path"
PREPARE_URL = "image_json.url"
PREPARE_FORMAT = "image_json.format"
PREPARE_CHECKSUM = "image_json.checksum"
PREPARE_CHECKSUM_TYPE = "image_json.checksumType"
PREPARE_STORAGE_POOL = "image_json.storagePool"
PREPARE_SOURCE = "image_json.source"
STORAGE_HINT = "storage_hint"


def network_name(index: int) -> str:
    return f"networks_json[{index}].NetworkName"


def disk_type(index: int) -> str:
    return f"disks_json[{index}].Type"


# Create's class_json (Go's contracts.VMClass) and Reconfigure's desired_json.
CLASS_SECURE_BOOT = "class_json.SecurityProfile.SecureBoot"
CLASS_TPM_ENABLED = "class_json.SecurityProfile.TPMEnabled"
CLASS_TPM_VERSION = "class_json.SecurityProfile.TPMVersion"
DESIRED_DISKS = "desired_json.Disks"


def class_extra_config(key: str) -> str:
    return f'class_json.ExtraConfig["{key}"]'


def network_field(index: int, key: str) -> str:
    """A field of Create's networks_json[index], by its Go name (Portgroup, Model, StaticIP)."""
    return f"networks_json[{index}].{key}"


def customize_network(index: int) -> str:
    """Clone's customize_json.networks[index] as a whole."""
    return f"customize_json.networks[{index}]"


def customize_network_field(index: int, key: str) -> str:
    """A field of Clone's customize_json.networks[index], by its key (networkName, ipAddress)."""
    return f"{customize_network(index)}.{key}"


PREPARE_OVA_URL = "image_json.ovaURL"
PREPARE_CONTENT_LIBRARY = "image_json.contentLibrary"
