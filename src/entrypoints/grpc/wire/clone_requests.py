"""Clone's payloads -> domain: CRD specs (camelCase keys, memory as a Kubernetes quantity, a
customization with its own network and user-data shapes), unlike the Go structs of Create and
Reconfigure (`vm_requests.py`). Every value is checked against the domain's bounds, and a
failure names the field.
"""

from __future__ import annotations

from functools import partial

from returns.result import Result, Success

from pyrigaud.domain import bounds
from pyrigaud.domain.bounds import describe_value
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    Customization,
    NetworkAttachment,
)
from pyrigaud.domain.quantity import quantity_to_mib
from pyrigaud.entrypoints.grpc.wire import field_names as names
from pyrigaud.entrypoints.grpc.wire.document import (
    Document,
    checked_cloud_init,
    checked_cpu,
    checked_ip,
    checked_memory,
    checked_name,
    each,
    invalid,
    load,
)


def _clone_network(item: Document) -> Result[NetworkAttachment, ProviderError]:
    return Result.do(
        NetworkAttachment(
            name=name,
            network_name=network_name or name,
            static_ip=static_ip,
            prefix=prefix,
            gateway=gateway,
            dns=dns,
        )
        for name in item.text("name", 256)
        for network_name in item.text("networkName", 256)
        for given_ip in _given_ip(item)
        for static_ip in checked_ip(given_ip.strip(), item.field("ipAddress"), allow_prefix=True)
        for prefix in item.integer("prefix", 0, 128)
        for gateway_text in item.text("gateway", 64)
        for gateway in checked_ip(gateway_text.strip(), item.field("gateway"))
        for servers in item.strings("dns", 16, 64)
        for dns in each(servers, partial(_stripped_ip, field=item.field("dns")))
    )


def _given_ip(item: Document) -> Result[str, ProviderError]:
    """ipAddress, else staticIP."""

    def or_static_ip(given: str) -> Result[str, ProviderError]:
        return Success(given) if given else item.text("staticIP", 64)

    return item.text("ipAddress", 64).bind(or_static_ip)


def _stripped_ip(text: str, field: str) -> Result[str, ProviderError]:
    return checked_ip(text.strip(), field)


def _clone_user_data(doc: Document) -> Result[bytes, ProviderError]:
    def inline(user_data_doc: Document | None) -> Result[bytes, ProviderError]:
        if user_data_doc is None:
            return Success(b"")

        def inline_text(cloud_init: Document | None) -> Result[str, ProviderError]:
            if cloud_init is not None:
                return cloud_init.text("inline", bounds.MAX_CLOUD_INIT_BYTES)
            return user_data_doc.text("cloudInitData", bounds.MAX_CLOUD_INIT_BYTES)

        return Result.do(
            checked
            for text in user_data_doc.obj("cloudInit").bind(inline_text)
            for checked in checked_cloud_init(text.encode(), doc.field("userData"))
        )

    return doc.obj("userData").bind(inline)


def _hostname(doc: Document) -> Result[str, ProviderError]:
    def checked(hostname: str) -> Result[str, ProviderError]:
        return checked_name(hostname, doc.field("hostname")) if hostname else Success(hostname)

    return doc.text("hostname", 253).bind(checked)


def _domain(doc: Document) -> Result[str, ProviderError]:
    def checked(domain: str) -> Result[str, ProviderError]:
        if domain and not all(map(bounds.DNS_LABEL_PATTERN.fullmatch, domain.split("."))):
            return invalid(doc.field("domain"), f"{describe_value(domain)} is not a DNS name")
        return Success(domain)

    return doc.text("domain", bounds.MAX_DNS_NAME_LENGTH).bind(checked)


def _time_zone(doc: Document) -> Result[str, ProviderError]:
    def checked(time_zone: str) -> Result[str, ProviderError]:
        if time_zone and not bounds.TIME_ZONE_PATTERN.fullmatch(time_zone):
            return invalid(
                doc.field("timeZone"),
                f"{describe_value(time_zone)} is not a zone name like Europe/Berlin",
            )
        return Success(time_zone)

    return doc.text("timeZone", 128).bind(checked)


def _customization(doc: Document) -> Result[Customization, ProviderError]:
    return Result.do(
        Customization(
            hostname=hostname,
            domain=domain,
            time_zone=time_zone,
            networks=networks,
            user_data=user_data,
        )
        for items in doc.objects("networks", bounds.MAX_NICS)
        for networks in each(items, _clone_network)
        for user_data in _clone_user_data(doc)
        for hostname in _hostname(doc)
        for domain in _domain(doc)
        for time_zone in _time_zone(doc)
    )


def _clone_memory(vm_class: Document) -> Result[int | None, ProviderError]:
    """Memory as a Kubernetes quantity ("8Gi") or a number of bytes, in MiB."""
    memory_raw = vm_class.raw("memory")
    if isinstance(memory_raw, str) and memory_raw.strip():
        mib = quantity_to_mib(memory_raw)
        if mib is None:
            return invalid(
                names.CLONE_MEMORY, f"{describe_value(memory_raw)} is not a quantity like 8Gi"
            )
        return checked_memory(mib, names.CLONE_MEMORY)
    if memory_raw is not None and not isinstance(memory_raw, str):
        return vm_class.integer("memory", 0, 2**63 - 1).bind(_memory_bytes)
    return Success(None)


def _memory_bytes(value: int) -> Result[int | None, ProviderError]:
    """A number of bytes, in whole MiB rounded up; 0 means "as the source"."""
    if not value:
        return Success(None)
    return checked_memory(-(-value // (1024 * 1024)), names.CLONE_MEMORY)


def _clone_cpu(value: int) -> Result[int | None, ProviderError]:
    """0 means "as the source"."""
    return checked_cpu(value, names.CLONE_CPU) if value else Success(None)


def _clone_customization(
    customize: Document, *, given: bool
) -> Result[Customization | None, ProviderError]:
    return _customization(customize) if given else Success(None)


def parse_clone(
    *,
    source_vm_id: str,
    target_name: str,
    linked: bool,
    class_json: str,
    placement_json: str,
    customize_json: str,
) -> Result[CloneRequest, ProviderError]:
    """Clone sends CRD specs: camelCase keys, memory as a Kubernetes quantity ("8Gi")."""
    return Result.do(
        CloneRequest(
            source_vm_id=source_vm_id,
            target_name=checked_target,
            linked=linked,
            cpu=cpu,
            memory_mib=memory,
            placement_policy=placement_policy,
            customization=customization,
        )
        for vm_class in load(class_json, names.CLASS)
        for cpu_value in vm_class.integer("cpu")
        for memory in _clone_memory(vm_class)
        for customize in load(customize_json, names.CUSTOMIZE)
        for checked_target in checked_name(target_name, names.TARGET_NAME)
        for cpu in _clone_cpu(cpu_value)
        for placement in load(placement_json, names.PLACEMENT)
        for placement_policy in placement.text("name", 256)
        for customization in _clone_customization(customize, given=bool(customize_json.strip()))
    )
