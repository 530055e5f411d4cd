"""The vCenter simulator for the tests: built once (cached), one process per test session."""

from __future__ import annotations

import atexit
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pyVmomi import vim as untyped_vim
from returns.result import Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.vsphere.backend import vsphere_backend
from pyrigaud.adapters.hypervisors.vsphere.device_models import FallbackCounters
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.adapters.hypervisors.vsphere.vcenter import INSTANCE_UUID
from pyrigaud.application.backend import Backend
from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import Clock
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import (
    CreateRequest,
    ImageSource,
    OwnerMark,
    Placement,
    VMClass,
    VMImage,
)

from contract.harness import Harness, staging_root
from support import ManualClock, error_kind
from support.transfer import IMAGE_JUDGE

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "vcsim.sh"
TEMPLATE_VM = "DC0_H0_VM0"  # a VM the default VPX inventory always has
SIMULATOR_DATASTORE = "LocalDS_0"  # the default VPX inventory's datastore


def template_request(
    name: str, *, cpu: int = 2, memory_mib: int = 512, **changes: object
) -> CreateRequest:
    """A Create cloning the inventory's template VM; `changes` set any other field."""
    base = CreateRequest(
        name=name,
        vm_class=VMClass(cpu=cpu, memory_mib=memory_mib),
        image=VMImage(template_name=TEMPLATE_VM),
    )
    return base.model_copy(update=changes)


def backend_over(
    session: VSphereSession,
    clock: Clock | None = None,
    defaults: Placement | None = None,
    on_resync: Callable[[], None] = lambda: None,
    owner: str = "tests/vsphere",
    scratch_dir: str | None = None,
    fallbacks: FallbackCounters | None = None,
) -> Backend:
    """Every port over `session`, as one replica of the provider has them (`on_resync` is told
    each time the inventory cache's update feed broke and reads everything again); the VMs
    imports make carry the `owner` mark until complete; conversions keep their scratch files
    in `scratch_dir` (None: the system's temporary directory); `fallbacks` count the devices
    Create gives a migrated guest for want of its own."""
    return vsphere_backend(
        session,
        defaults=defaults or Placement(),
        clock=clock or SystemClock(),
        on_resync=on_resync,
        owner=owner,
        image_judge=IMAGE_JUDGE,
        scratch_dir=scratch_dir,
        fallbacks=fallbacks,
    )


def create_use_case(
    backend: Backend,
    owner: OwnerMark,
    clock: Clock | None = None,
    policy: LeftoverPolicy | None = None,
) -> CreateVM:
    """Create as the provider serves it: the backend's VMLifecycle under the ownership rule."""
    clock = clock or SystemClock()
    rule = OwnershipRule(
        backend.lifecycle, owner, clock, policy or LeftoverPolicy(owner=owner), KeyedLock()
    )
    return CreateVM(backend.lifecycle, rule)


vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped


@dataclass(frozen=True)
class Simulator:
    endpoint: str  # https://127.0.0.1:PORT/sdk, without credentials
    username: str
    password: str
    held_task: str = ""  # with -held-task: the MoRef of a task that stays running

    def backend(self, clock: Clock | None = None) -> Backend:
        """Every port over a session of its own, as one replica of the provider has them."""
        return backend_over(self.session(), clock)

    def serve_environ(self, **extra: str) -> dict[str, str]:
        """The settings that point `pyrigaud serve` at this simulator."""
        return {
            "PROVIDER_TYPE": "vsphere",
            "PROVIDER_ENDPOINT": self.endpoint,
            "TLS_INSECURE_SKIP_VERIFY": "true",
            "PYRIGAUD_CREDENTIALS": "env",
            "PYRIGAUD_CREDENTIAL_USERNAME": self.username,
            "PYRIGAUD_CREDENTIAL_PASSWORD": self.password,
            **extra,
        }

    def session(self) -> VSphereSession:
        """A session of its own, e.g. to set up what a test needs straight through pyvmomi."""
        return VSphereSession(
            self.endpoint,
            lambda: (self.username, self.password),
            insecure=True,
            clock=SystemClock(),
        )


def launcher() -> Path:
    """Build (or reuse) the launcher binary; scripts/vcsim.sh prints its path."""
    built = subprocess.run(
        ["sh", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True, timeout=600
    )
    return Path(built.stdout.strip().splitlines()[-1])


@contextmanager
def running_simulator(*arguments: str) -> Iterator[Simulator]:
    """Start the simulator on a free loopback port, yield its address, stop it afterwards."""
    process = subprocess.Popen(
        [str(launcher()), *arguments], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        url = urlsplit(process.stdout.readline().strip())
        assert url.hostname == "127.0.0.1", f"simulator did not start: {url!r}"
        endpoint = urlunsplit((url.scheme, f"{url.hostname}:{url.port}", url.path, "", ""))
        held_task = process.stdout.readline().strip() if "-held-task" in arguments else ""
        yield Simulator(
            endpoint=endpoint,
            username=url.username or "",
            password=url.password or "",
            held_task=held_task,
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


_shared: list[Simulator] = []


def shared_simulator() -> Simulator:
    """The one simulator of this pytest session, started on first use and stopped at exit."""
    if not _shared:
        context = running_simulator()
        _shared.append(context.__enter__())
        atexit.register(context.__exit__, None, None, None)
    return _shared[0]


PATIENCE_SECONDS = 15.0  # a liveness bound, not a speed target: the benchmark times propagation
T = TypeVar("T")


def eventually(read: Callable[[], T], wanted: Callable[[T], bool]) -> T:
    """`read()` once `wanted` holds of it (polled): what another vCenter client changed reaches
    a replica's inventory cache a moment later. The last value read at the deadline otherwise."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    value = read()
    while not wanted(value) and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()
    return value


def vm_ref(instance: Any, vm_id: str) -> Any:
    """The VM an id of either shape names (instanceUuid or MoRef), for reading it straight."""
    if INSTANCE_UUID.fullmatch(vm_id):
        return instance.content.searchIndex.FindByUuid(uuid=vm_id, vmSearch=True, instanceUuid=True)
    return vim.VirtualMachine(vm_id, instance._stub)


def contract_harness() -> Iterator[Harness]:
    """The contract suite's harness on the shared simulator; a test's VMs are deleted after it."""
    clock = ManualClock()
    with tempfile.TemporaryDirectory(prefix="pyrigaud-vsphere-pvc-") as directory:
        root = staging_root(Path(directory))
        backend = backend_over(
            shared_simulator().session(),
            clock,
            # what PROVIDER_DEFAULT_DATASTORE names: where an import lands without a storage_hint
            defaults=Placement(datastore=SIMULATOR_DATASTORE),
        )
        before = {vm.id for vm in backend.inventory.list_vms().unwrap()}
        yield Harness(
            backend=backend,
            clock=clock,
            image=VMImage(template_name=TEMPLATE_VM),
            guest_reports_addresses=False,  # simulated VMs have no guest unless a test sets one
            blank_images=False,
            # ImagePrepare verifies a template (imports from URLs: test_vsphere_image_import.py).
            prepare_source=ImageSource(origin="vsphere", template_name=TEMPLATE_VM),
            staging_root=root,
        )
        remove_vms_made_since(backend, before)


def remove_vms_made_since(backend: Backend, before: set[str]) -> None:
    """Delete the VMs a test made, so that names can be reused.

    The listing comes from the inventory cache, which may still hold a VM the test removed
    through another session a moment ago: gone already is fine."""
    for vm in backend.inventory.list_vms().unwrap():
        if vm.id not in before:
            deleted = backend.lifecycle.delete(vm.id)
            assert deleted == Success(None) or error_kind(deleted) is ErrorKind.NOT_FOUND
