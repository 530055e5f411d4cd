"""The client's argument parsers, added to `pyrigaud`'s own, and the one way a command runs:
connect, send, print (table or JSON), optionally wait on the task, exit by error class."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from pyrigaud.client import commands, output
from pyrigaud.client.connection import (
    EndpointError,
    Target,
    open_channel,
    resolve_endpoint,
    stub_for,
)
from pyrigaud.client.payloads import PayloadError
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint", help="HOST:PORT (default: $PYRIGAUD_ENDPOINT)")
    common.add_argument("--tls-dir", type=Path, help="dir with tls.crt, tls.key, ca.crt (mTLS)")
    common.add_argument("--server-name", default="", help="the name the server cert must carry")
    common.add_argument("--output", "-o", choices=("table", "json"), default="table")
    return common


def _waitable() -> argparse.ArgumentParser:
    waitable = argparse.ArgumentParser(add_help=False)
    waitable.add_argument("--wait", action="store_true", help="poll the task until done")
    waitable.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits")
    return waitable


def _vm_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", type=int, help="vCPUs (VMClass cpu)")
    parser.add_argument("--memory", help="memory as a quantity: 512Mi, 2Gi")
    parser.add_argument("--firmware", choices=("BIOS", "UEFI", "EFI"))
    parser.add_argument("--disk-size", help="root disk size (VMClass diskDefaults): 20Gi")
    parser.add_argument("--image-path", help="VMImage path (libvirt)")
    parser.add_argument("--image-url", help="VMImage URL")
    parser.add_argument("--template", help="VMImage template name (vSphere)")
    parser.add_argument("--image-format", help="VMImage format (qcow2, raw, template)")
    parser.add_argument("--network", action="append", help="attach to NAME (repeatable)")
    parser.add_argument("--disk", action="append", help="an extra disk of SIZE (repeatable)")
    parser.add_argument("--user-data", type=Path, help="cloud-init user-data FILE")
    parser.add_argument("--meta-data", type=Path, help="cloud-init meta-data FILE")
    parser.add_argument("--datastore", help="placement: datastore / libvirt pool")
    parser.add_argument("--cluster", help="placement: cluster")
    parser.add_argument("--folder", help="placement: folder")
    parser.add_argument("--host", help="placement: host")
    parser.add_argument("--tag", action="append", help="a tag (repeatable)")


def _transfer_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", default="qcow2", choices=("qcow2", "raw", "vmdk"))
    parser.add_argument("--backend-type", default="pvc", choices=("pvc", "nfs", "s3"))
    parser.add_argument("--credential", action="append", help="KEY=VALUE (repeatable)")
    parser.add_argument("--storage-options", help="storage_options_json")


class _Commands:
    """Adds leaf commands (with the common flags) and command groups under `pyrigaud`."""

    def __init__(self, subparsers: Any) -> None:
        self.subparsers = subparsers
        self.common, self.waitable = _common(), _waitable()

    def leaf(
        self, group: Any, name: str, handler: commands.Handler, helptext: str, *, task: bool = False
    ) -> argparse.ArgumentParser:
        parents = [self.common, self.waitable] if task else [self.common]
        parser: argparse.ArgumentParser = group.add_parser(name, parents=parents, help=helptext)
        parser.set_defaults(client_handler=handler, client_task=task)
        return parser

    def group(self, name: str, helptext: str) -> Any:
        parser = self.subparsers.add_parser(name, help=helptext)
        return parser.add_subparsers(dest=f"{name}_command", required=True)


def add_commands(subparsers: Any) -> None:
    """Add the client's commands under `pyrigaud`'s subparsers."""
    added = _Commands(subparsers)
    for add in (_add_vm, _add_snapshot, _add_clone, _add_image, _add_disk, _add_caps_and_task):
        add(added)


def _add_vm(added: _Commands) -> None:
    vm = added.group("vm", "VMs: list, describe, create, power, reconfigure, delete")
    added.leaf(vm, "list", commands.vm_list, "ListVMs")
    added.leaf(vm, "describe", commands.vm_describe, "Describe a VM").add_argument("id")
    create = added.leaf(vm, "create", commands.vm_create, "Create a VM", task=True)
    create.add_argument("name")
    _vm_flags(create)
    power = added.leaf(
        vm, "power", commands.vm_power, "Power a VM on/off/reboot/shutdown", task=True
    )
    power.add_argument("id")
    power.add_argument("op", choices=tuple(commands.POWER_OPS))
    power.add_argument("--graceful-timeout", type=int, default=60, help="seconds (shutdown)")
    reconfigure = added.leaf(vm, "reconfigure", commands.vm_reconfigure, "Reconfigure", task=True)
    reconfigure.add_argument("id")
    reconfigure.add_argument("--name", help="the VM's name, as the manager sends it")
    _vm_flags(reconfigure)
    added.leaf(vm, "delete", commands.vm_delete, "Delete a VM", task=True).add_argument("id")


def _add_snapshot(added: _Commands) -> None:
    snapshot = added.group("snapshot", "snapshots: create, delete, revert")
    made = added.leaf(snapshot, "create", commands.snapshot_create, "SnapshotCreate", task=True)
    made.add_argument("vm_id")
    made.add_argument("--name", help="name hint")
    made.add_argument("--include-memory", action="store_true")
    made.add_argument("--description")
    for name, handler in (
        ("delete", commands.snapshot_delete),
        ("revert", commands.snapshot_revert),
    ):
        parser = added.leaf(snapshot, name, handler, f"Snapshot{name.title()}", task=True)
        parser.add_argument("vm_id")
        parser.add_argument("snapshot_id")


def _add_clone(added: _Commands) -> None:
    cloned = added.leaf(added.subparsers, "clone", commands.clone, "clone a VM", task=True)
    cloned.add_argument("source")
    cloned.add_argument("target")
    cloned.add_argument("--linked", action="store_true")
    cloned.add_argument("--cpu", type=int)
    cloned.add_argument("--memory", help="a quantity: 8Gi")
    cloned.add_argument("--hostname")
    cloned.add_argument("--domain")
    cloned.add_argument("--time-zone")
    cloned.add_argument("--user-data", type=Path)


def _add_image(added: _Commands) -> None:
    image = added.group("image", "images: prepare")
    prepare = added.leaf(image, "prepare", commands.image_prepare, "ImagePrepare", task=True)
    prepare.add_argument("target")
    prepare.add_argument("--path")
    prepare.add_argument("--url")
    prepare.add_argument("--template")
    prepare.add_argument("--format")
    prepare.add_argument("--checksum", help="sha256 of the image")
    prepare.add_argument("--storage-pool")
    prepare.add_argument("--storage-hint")


def _add_disk(added: _Commands) -> None:
    disk = added.group("disk", "disks: export, import, info")
    export = added.leaf(disk, "export", commands.disk_export, "ExportDisk", task=True)
    export.add_argument("vm_id")
    export.add_argument("--destination", required=True, help="pvc://PVC/PATH, s3://, nfs://")
    export.add_argument("--disk-id")
    export.add_argument("--snapshot")
    export.add_argument("--compress", action="store_true")
    _transfer_flags(export)
    imported = added.leaf(disk, "import", commands.disk_import, "ImportDisk", task=True)
    imported.add_argument("--source", required=True, help="pvc://PVC/PATH, s3://, nfs://")
    imported.add_argument("--target-name")
    imported.add_argument("--storage-hint")
    imported.add_argument("--expected-checksum")
    _transfer_flags(imported)
    info = added.leaf(disk, "info", commands.disk_info, "GetDiskInfo")
    info.add_argument("vm_id")
    info.add_argument("--disk-id")
    info.add_argument("--snapshot")


def _add_caps_and_task(added: _Commands) -> None:
    added.leaf(added.subparsers, "caps", commands.caps, "GetCapabilities")
    task = added.group("task", "tasks: wait")
    waiter = added.leaf(task, "wait", commands.task_wait, "poll TaskStatus until done")
    waiter.add_argument("id")
    waiter.add_argument("--timeout", type=float, default=600.0)


def _task_of(answer: Any) -> pb.TaskRef | None:
    task = getattr(answer, "task", None)
    return task if isinstance(task, pb.TaskRef) and task.id else None


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; the exit code says how it went."""
    try:
        target = Target(resolve_endpoint(args.endpoint), args.tls_dir, args.server_name)
        channel = open_channel(target)
    except EndpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return output.EXIT_USAGE
    with channel:
        stub = stub_for(channel)
        try:
            answer = args.client_handler(stub, args)
            if isinstance(answer, list):
                print(output.render_rows(answer, commands.VM_COLUMNS, args.output))
                return 0
            task = _task_of(answer) if args.client_task and args.wait else None
            status = None
            if task is not None:
                status = commands.wait_for(stub, task.id, args.timeout)
            print(output.render(answer, args.output, status))
        except PayloadError as error:
            print(f"error: {error}", file=sys.stderr)
            return output.EXIT_USAGE
        except grpc.RpcError as error:
            return output.report_error(error)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return output.EXIT_INTERRUPTED
    return _task_exit(answer if status is None else status)


def _task_exit(answer: Message) -> int:
    if isinstance(answer, pb.TaskStatusResponse):
        if answer.done and answer.error:
            print(f"error: task failed: {answer.error}", file=sys.stderr)
            return output.EXIT_TASK_FAILED
        if not answer.done:
            print("error: task still running", file=sys.stderr)
            return output.EXIT_OTHER
    return 0
