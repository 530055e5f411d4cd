"""The contract, written once: every clause in the order it runs.

pyrigaud's own test suite runs this same list against its servers on every backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyrigaud.client.conformance import read_only, transfers, with_vms
from pyrigaud.client.conformance.session import Session


@dataclass(frozen=True)
class Clause:
    key: str
    title: str  # the contract's words (docs/contract.md)
    check: Callable[[Session], None]
    mutating: bool


def _read(key: str, title: str, check: Callable[[Session], None]) -> Clause:
    return Clause(key, title, check, mutating=False)


def _write(key: str, title: str, check: Callable[[Session], None]) -> Clause:
    return Clause(key, title, check, mutating=True)


CLAUSES: tuple[Clause, ...] = (
    _read("validate", "Validate answers ok=true", read_only.validate),
    _read("capabilities", "GetCapabilities answers, self-consistent", read_only.capabilities),
    _read("list-vms", "ListVMs: On/Off, unique ids, under 4 MiB", read_only.list_vms),
    _read("describe-missing", "Describe of a missing VM: exists=false", read_only.describe_missing),
    _read(
        "missing-not-found", "Other RPCs on a missing VM: NOT_FOUND", read_only.missing_vm_not_found
    ),
    _read("malformed-input", "Bad input: INVALID_ARGUMENT", read_only.malformed_input),
    _read(
        "task-unknown",
        "TaskStatus of an unknown id: done with error",
        read_only.task_status_unknown,
    ),
    _read(
        "unclaimed-import", "Unclaimed import refused honestly", read_only.unclaimed_import_refused
    ),
    _write("create", "Create: an id, the VM exists and is Off", with_vms.create),
    _write("create-idempotent", "Create again by name: same id", with_vms.create_idempotent),
    _write(
        "list-vms-complete", "ListVMs lists it with name, cpu, memory", with_vms.list_vms_complete
    ),
    _write("disk-info", "GetDiskInfo: a path and a size; missing VM NOT_FOUND", with_vms.disk_info),
    _write("power-on", "Power ON (idempotent); UNSPECIFIED invalid", with_vms.power_on),
    _write(
        "describe-running", "Describe: flat provider_raw_json, real ips", with_vms.describe_running
    ),
    _write("reboot", "Power REBOOT: OK or a done task, the VM On", with_vms.reboot),
    _write(
        "graceful-shutdown",
        "SHUTDOWN_GRACEFUL: an answerable task, ends Off",
        with_vms.graceful_shutdown,
    ),
    _write(
        "power-off-idempotent", "OFF / SHUTDOWN on a stopped VM: OK", with_vms.power_off_idempotent
    ),
    _write(
        "hardware-upgrade",
        "HardwareUpgrade works, or is refused honestly",
        with_vms.hardware_upgrade,
    ),
    _write("reconfigure", "Reconfigure applies CPU and memory", with_vms.reconfigure),
    _write("snapshots", "Snapshots work when claimed, refused when not", with_vms.snapshots),
    _write(
        "memory-snapshot", "Memory snapshot of a running VM when claimed", with_vms.memory_snapshot
    ),
    _write(
        "uefi-snapshots",
        "Snapshots of a running UEFI VM when claimed",
        with_vms.uefi_snapshots,
    ),
    _write("clone", "Clone: a target id, the clone exists", with_vms.clone),
    _write("linked-clone", "Linked clone when claimed", with_vms.linked_clone),
    _write(
        "image-prepare",
        "Claimed ImagePrepare: same id twice, Create from it",
        transfers.image_prepare,
    ),
    _write(
        "disk-export-import",
        "Claimed ExportDisk + ImportDisk: checksums match, Create from it",
        transfers.disk_export_import,
    ),
    _write(
        "unclaimed-export", "Unclaimed export refused honestly", with_vms.unclaimed_export_refused
    ),
    _write("delete", "Delete: gone, idempotent, missing VM OK", with_vms.delete),
    _read(
        "no-unknown-internal",
        "No business error as UNKNOWN/INTERNAL",
        with_vms.no_business_error_as_bug,
    ),
)


def selected(read_only_run: bool) -> tuple[Clause, ...]:
    return tuple(clause for clause in CLAUSES if not (read_only_run and clause.mutating))
