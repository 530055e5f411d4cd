"""What a clause holds while it runs: the stub under the manager's deadlines, the claimed
capabilities, the VMs the run made (so all of them go at the end), and every code seen."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc

from pyrigaud.client.connection import DEADLINES
from pyrigaud.client.payloads import VMSpec, create_fields
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

BUG_CODES = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})
REFUSED_UNCLAIMED = frozenset({grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION})
TASK_POLL_SECONDS = 0.5
BLANK_DISK_SIZE = "1Gi"  # the root disk a VM without an image asks (its class's DiskDefaults)


class ContractBreachError(Exception):
    """The provider broke the clause; the message says how."""


class NotApplicableError(Exception):
    """The clause does not apply (a feature not claimed); the message says why."""


def expect(condition: bool, reason: str) -> None:
    if not condition:
        raise ContractBreachError(reason)


@dataclass(frozen=True)
class Refusal:
    rpc: str
    code: grpc.StatusCode
    message: str

    def __str__(self) -> str:
        return f"{self.rpc} answered {self.code.name}: {self.message}"


class RpcRefusedError(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


@dataclass(frozen=True)
class Staging:
    """Where the disk-transfer clause stages its disk (--staging-*); the credentials are
    sent to the provider and never shown."""

    url: str
    backend: str = "pvc"
    storage_options_json: str = ""
    credentials: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass
class Options:
    prefix: str
    image: dict[str, Any] = field(default_factory=dict)  # --image-json, a VMImage object
    placement: dict[str, Any] = field(default_factory=dict)  # --placement-json
    graceful_timeout_seconds: int = 10
    prepare_image: dict[str, Any] = field(default_factory=dict)  # --prepare-image-json
    staging: Staging | None = None  # --staging-url and its companions


@dataclass
class Session:
    stub: pb_grpc.ProviderStub
    options: Options
    capabilities: pb.GetCapabilitiesResponse | None = None
    vm_id: str = ""  # the run's main VM, once the create clause made it
    created: dict[str, str] = field(default_factory=dict)  # name -> id, for the cleanup
    in_flight: dict[str, Any] = field(default_factory=dict)  # name -> CreateRequest unanswered
    refusals: list[Refusal] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what no RPC removes, told to the operator

    # --- calls ---------------------------------------------------------------------------

    def call(self, rpc: str, request: Any) -> Any:
        """One RPC under the manager's deadline; a refusal raises RpcRefusedError (and is kept)."""
        deadline = DEADLINES[rpc]
        try:
            return getattr(self.stub, rpc)(request, timeout=deadline)
        except grpc.RpcError as error:
            code = error.code()
            refusal = Refusal(rpc, code, error.details() or "")
            self.refusals.append(refusal)
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ContractBreachError(
                    f"{rpc} did not answer within the manager's {deadline:g} s deadline"
                ) from error
            raise RpcRefusedError(refusal) from error

    def answer(self, rpc: str, request: Any, claimed: str = "") -> Any:
        """An RPC that must succeed: a refusal fails the clause, naming the code (and the
        capability that claims the feature, if one does)."""
        try:
            return self.call(rpc, request)
        except RpcRefusedError as refused:
            claim = f" (GetCapabilities claims {claimed})" if claimed else ""
            raise ContractBreachError(f"{refused.refusal}{claim}") from refused

    def refused(self, rpc: str, request: Any, codes: frozenset[grpc.StatusCode], why: str) -> None:
        """An RPC that must be refused with one of `codes` (the contract's `why`)."""
        try:
            self.call(rpc, request)
        except RpcRefusedError as refused:
            expect(
                refused.refusal.code in codes,
                f"{refused.refusal}; expected {'/'.join(sorted(c.name for c in codes))} ({why})",
            )
            return
        names = "/".join(sorted(code.name for code in codes))
        raise ContractBreachError(f"{rpc} answered OK; expected {names} ({why})")

    def wait(self, rpc: str, task: pb.TaskRef) -> None:
        """Poll TaskStatus as the manager does until done, within the RPC's own deadline.
        An absent task or an empty id means the call completed synchronously."""
        if not task.id:
            return
        give_up = time.monotonic() + DEADLINES[rpc]
        while True:
            status = self.answer("TaskStatus", pb.TaskStatusRequest(task=task))
            if status.done:
                expect(not status.error, f"{rpc} task {task.id} failed: {status.error}")
                return
            expect(
                time.monotonic() < give_up,
                f"{rpc} task {task.id} not done within the manager's {DEADLINES[rpc]:g} s",
            )
            time.sleep(TASK_POLL_SECONDS)

    # --- the VMs of the run --------------------------------------------------------------

    def name(self, suffix: str) -> str:
        return f"{self.options.prefix}-{suffix}"

    def create_request(
        self,
        suffix: str,
        cpu: int = 1,
        memory: str = "256Mi",
        image: dict[str, Any] | None = None,
        firmware: str = "",
    ) -> Any:
        extra = self.options.image if image is None else image
        spec = VMSpec(
            name=self.name(suffix),
            cpu=cpu,
            memory=memory,
            firmware=firmware,
            disk_size=disk_size(extra),
            extra=extra,
        )
        fields = create_fields(spec)
        return pb.CreateRequest(
            name=spec.name,
            class_json=fields.class_json,
            image_json=fields.image_json,
            networks_json=fields.networks_json,
            disks_json=fields.disks_json,
            placement_json=json.dumps(self.options.placement) if self.options.placement else "",
        )

    def create(self, suffix: str, image: dict[str, Any] | None = None, firmware: str = "") -> str:
        """Create a VM of the run (remembered for the cleanup before anything can fail);
        `image` replaces --image-json. A `firmware` the host cannot give (FAILED_PRECONDITION)
        makes the clause not applicable."""
        request = self.create_request(suffix, image=image, firmware=firmware)
        self.in_flight[request.name] = request
        try:
            response = self.call("Create", request)
        except RpcRefusedError as refused:
            if firmware and refused.refusal.code is grpc.StatusCode.FAILED_PRECONDITION:
                raise NotApplicableError(f"the host has no {firmware} firmware") from refused
            hint = ""
            if refused.refusal.code is grpc.StatusCode.INVALID_ARGUMENT and not self.options.image:
                hint = " (a backend without blank disks needs --image-json)"
            raise ContractBreachError(f"{refused.refusal}{hint}") from refused
        expect(bool(response.id), "Create answered an empty id")
        self.created[request.name] = response.id
        del self.in_flight[request.name]
        self.wait("Create", response.task)
        return str(response.id)

    def describe(self, vm_id: str) -> pb.DescribeResponse:
        described: pb.DescribeResponse = self.answer("Describe", pb.DescribeRequest(id=vm_id))
        expect(
            not described.exists or described.power_state in ("On", "Off"),
            f"Describe power_state {described.power_state!r} is neither 'On' nor 'Off'",
        )
        return described

    def listed(self, vm_id: str) -> pb.VMInfo | None:
        listed: pb.ListVMsResponse = self.answer("ListVMs", pb.ListVMsRequest())
        return next((vm for vm in listed.vms if vm.id == vm_id), None)

    def listed_named(self, name: str) -> pb.VMInfo | None:
        listed: pb.ListVMsResponse = self.answer("ListVMs", pb.ListVMsRequest())
        return next((vm for vm in listed.vms if vm.name == name), None)

    def power(self, vm_id: str, op: int, graceful_timeout: int = 0) -> None:
        request = pb.PowerRequest(id=vm_id, op=op, graceful_timeout_seconds=graceful_timeout)  # type: ignore[arg-type]
        self.wait("Power", self.answer("Power", request).task)

    def needs_vm(self) -> str:
        expect(bool(self.vm_id), "needs the run's VM, and the create clause did not make one")
        return self.vm_id

    def claims(self, capability: str) -> bool:
        return bool(self.capabilities is not None and getattr(self.capabilities, capability))

    def cleanup(self) -> list[str]:
        """Delete every VM the run made or that bears its prefix; returns what could not go."""
        targets = {vm.name: vm.id for vm in self._listed_with_prefix()}
        targets.update({name: vm_id for name, vm_id in self.created.items() if vm_id})
        problems = []
        for name, request in self.in_flight.items():  # interrupted mid-Create: ask again
            if name not in targets:
                try:
                    targets[name] = self.answer("Create", request).id
                except ContractBreachError as failed:
                    problems.append(f"{name}: {failed}")
        for name, vm_id in sorted(targets.items()):
            try:
                self.wait("Delete", self.answer("Delete", pb.DeleteRequest(id=vm_id)).task)
            except ContractBreachError as failed:
                problems.append(f"{name} ({vm_id}): {failed}")
        problems.extend(f"{vm.name} ({vm.id}) still listed" for vm in self._listed_with_prefix())
        return problems

    def _listed_with_prefix(self) -> list[pb.VMInfo]:
        try:
            listed = self.call("ListVMs", pb.ListVMsRequest())
        except (RpcRefusedError, ContractBreachError):
            return []
        return [vm for vm in listed.vms if vm.name.startswith(self.options.prefix + "-")]


def disk_size(image: dict[str, Any]) -> str:
    """The class asks a root-disk size only for a blank disk: an image has its own size, which
    a smaller class size would ask to shrink."""
    return "" if image else BLANK_DISK_SIZE


def missing_id() -> str:
    """An id no provider has issued (a fresh UUID), the commonest shape of a VM id."""
    return str(uuid.uuid4())


def flat_strings(raw: str) -> bool:
    """provider_raw_json must be a flat JSON object of string values (or empty)."""
    if not raw:
        return True
    try:
        parsed = json.loads(raw)
    except ValueError:
        return False
    return isinstance(parsed, dict) and all(isinstance(value, str) for value in parsed.values())
