"""The domain path of each request field a use case or a backend may refuse, in one place.

A path is what the domain's request models call the thing (`image.url` is
`CreateRequest.image.url`, `networks[1].network_name` the second NIC's network), so the domain
and the adapters never speak the manager's vocabulary. `ProviderError` keeps the path as its
`field`; the gRPC edge writes it as the manager sent it (`image_json.URL`,
`networks_json[1].NetworkName`), one table for every backend (`entrypoints/grpc/wire/
field_names.py`). Every request has its own root, so a path names one field of one RPC.
"""

from __future__ import annotations

# Fields of several requests, named alike everywhere.
TARGET_NAME = "target_name"  # Clone, ImagePrepare, ImportDisk
STORAGE_HINT = "storage_hint"  # ImagePrepare, ImportDisk

# ImportDisk and ExportDisk (ImportRequest, ExportRequest).
SOURCE_URL = "source_url"
DESTINATION_URL = "destination_url"
TRANSFER_MODE = "mode"
# Where the disk is staged (a StagedLocation's staging_type, its options and credentials). An
# option or a credential is named by its key in the map the manager sent, as extra_config's are.
STAGING_TYPE = "staging_type"
STORAGE_OPTIONS = "storage_options"
STAGING_CREDENTIALS = "credentials"

# Create's image (CreateRequest.image, a VMImage).
IMAGE = "image"
IMAGE_TEMPLATE_NAME = "image.template_name"
IMAGE_PATH = "image.path"
IMAGE_URL = "image.url"
IMAGE_FORMAT = "image.format"
IMAGE_CHECKSUM = "image.checksum"
IMAGE_CHECKSUM_TYPE = "image.checksum_type"

# Create's placement.
PLACEMENT_DATASTORE = "placement.datastore"
PLACEMENT_STORAGE_POD = "placement.storage_pod"
PLACEMENT_CLUSTER = "placement.cluster"
PLACEMENT_HOST = "placement.host"
PLACEMENT_FOLDER = "placement.folder"

# Create's VM class.
CLASS_SECURE_BOOT = "vm_class.security.secure_boot"
CLASS_TPM_ENABLED = "vm_class.security.tpm_enabled"
CLASS_TPM_VERSION = "vm_class.security.tpm_version"

# Reconfigure's desired changes (a VMChanges).
DESIRED_DISKS = "changes.disks"

# ImagePrepare's source (PrepareImageRequest.source, an ImageSource).
PREPARE_TEMPLATE_NAME = "source.template_name"
PREPARE_PATH = "source.path"
PREPARE_URL = "source.url"
PREPARE_OVA_URL = "source.ova_url"  # `source.url` when it names an OVA package (vSphere)
PREPARE_FORMAT = "source.format"
PREPARE_CHECKSUM = "source.checksum"
PREPARE_CHECKSUM_TYPE = "source.checksum_type"
PREPARE_STORAGE_POOL = "source.storage_pool"
PREPARE_CONTENT_LIBRARY = "source.content_library"


def storage_option(key: str) -> str:
    """A transfer's storage option `key`."""
    return f"{STORAGE_OPTIONS}.{key}"


def staging_credential(key: str) -> str:
    """A transfer's credential `key`."""
    return f"{STAGING_CREDENTIALS}.{key}"


def class_extra_config(key: str) -> str:
    return f'vm_class.extra_config["{key}"]'


def disk_type(index: int) -> str:
    """Create's disks[index].type."""
    return f"disks[{index}].type"


def desired_disk(index: int) -> str:
    """Reconfigure's changes.disks[index]: the disk after the root disk at that position."""
    return f"{DESIRED_DISKS}[{index}]"


def network_name(index: int) -> str:
    """Create's networks[index].network_name."""
    return network_field(index, "network_name")


def network_field(index: int, attribute: str) -> str:
    """An attribute of Create's networks[index] (a NetworkAttachment)."""
    return f"networks[{index}].{attribute}"


def customize_network(index: int) -> str:
    """Clone's customization.networks[index] as a whole."""
    return f"customization.networks[{index}]"


def customize_network_field(index: int, attribute: str) -> str:
    """An attribute of Clone's customization.networks[index] (a NetworkAttachment)."""
    return f"{customize_network(index)}.{attribute}"
