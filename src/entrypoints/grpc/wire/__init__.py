"""The manager's wire format -> domain requests: the anti-corruption layer of the gRPC edge.

The manager sends Go-marshalled JSON in string fields; these parsers read it the way Go's
decoder does, check it against the domain's bounds, and return `Result`s whose failures name
the field with its wire name (`field_names`), the name `field_names.for_the_manager` also gives
the domain path of a field the domain or a backend refuses.
"""

from pyrigaud.entrypoints.grpc.wire.clone_requests import parse_clone
from pyrigaud.entrypoints.grpc.wire.storage_requests import (
    disk_query,
    parse_export,
    parse_import,
    parse_prepare_image,
)
from pyrigaud.entrypoints.grpc.wire.vm_requests import (
    parse_create,
    parse_hardware_version,
    parse_power_op,
    parse_reconfigure,
    parse_snapshot,
)

__all__ = [
    "disk_query",
    "parse_clone",
    "parse_create",
    "parse_export",
    "parse_hardware_version",
    "parse_import",
    "parse_power_op",
    "parse_prepare_image",
    "parse_reconfigure",
    "parse_snapshot",
]
