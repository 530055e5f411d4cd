"""A real guest for the end-to-end tests: the image scripts/guest_image.sh builds, the
markers it prints on its serial console, and commands run in it through its guest agent.

The guest keeps repeating its markers (see the script), so a console opened after boot still
sees them. Commands through the agent run in the guest's initramfs (its RAM), which is what
makes them a witness of memory state.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libvirt
import libvirt_qemu

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "guest_image.sh"
BUILD_SECONDS = 600  # a first build downloads the kernel package
READY = re.compile(r"PYRIGAUD-GUEST-READY uptime=(?P<uptime>[0-9.]+)s")
SEED = re.compile(
    r"PYRIGAUD-SEED (?:user-data-sha256=(?P<user>\w+) meta-data-sha256=(?P<meta>\w+)|none)"
)
POWEROFF = re.compile(r"PYRIGAUD-POWEROFF via=(?P<via>\w+)")
# How long libvirt waits for the agent's answer before "Guest agent not available for now":
# a TCG guest on a loaded two-vCPU host can take more than 10 s to spawn a process.
AGENT_SECONDS = 30


@functools.cache
def guest_image() -> Path:
    """The cached image (built on first use; needs root then); a failed build fails the test."""
    built = subprocess.run(
        [str(SCRIPT)], capture_output=True, text=True, timeout=BUILD_SECONDS, check=False
    )
    if built.returncode != 0:
        raise AssertionError(f"{SCRIPT.name} failed ({built.returncode}): {built.stderr[-4000:]}")
    image = Path(built.stdout.strip().splitlines()[-1])
    assert image.is_file(), f"{SCRIPT.name} printed {image}, which is not a file"
    return image


class Console:
    """A domain's serial console read through libvirt (virDomainOpenConsole), all text kept.

    Needs libvirt's event loop running in this process (support.qemu.open_qemu starts it):
    the stream is non-blocking and the loop moves its bytes."""

    def __init__(self, conn: Any, dom: Any) -> None:
        self._stream = conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        dom.openConsole(None, self._stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
        self._text = ""
        self._closed = False

    @property
    def text(self) -> str:
        self._drain()
        return self._text

    def wait_for(self, pattern: re.Pattern[str], seconds: float, after: int = 0) -> re.Match[str]:
        """The first match at or past offset `after`; fails with the console's tail if none
        shows up in time (a bound on a wait, not a speed check)."""
        deadline = time.monotonic() + seconds
        while True:
            self._drain()
            found = pattern.search(self._text, after)
            if found is not None:
                return found
            if self._closed or time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern.pattern!r} on the console in {seconds} s; "
                    f"it ends with: {self._text[-2000:]!r}"
                )
            time.sleep(0.2)

    def close(self) -> None:
        if not self._closed:
            with contextlib.suppress(libvirt.libvirtError):  # the guest is gone already
                self._stream.finish()
            self._closed = True

    def _drain(self) -> None:
        while not self._closed:
            try:
                data = self._stream.recv(65536)
            except libvirt.libvirtError:
                self._closed = True  # the domain stopped: the stream ends with an error
                return
            if data == -2:  # nothing more for now
                return
            if not data:
                self._closed = True
                return
            self._text += data.decode(errors="replace")


@contextlib.contextmanager
def console(conn: Any, dom: Any) -> Iterator[Console]:
    opened = Console(conn, dom)
    try:
        yield opened
    finally:
        opened.close()


@dataclass(frozen=True)
class Exited:
    code: int
    out: str


def guest_exec(dom: Any, *argv: str) -> Exited:
    """Run a command in the guest through qemu-guest-agent and wait (bounded) for its end."""
    started = _agent(
        dom, "guest-exec", path=argv[0], arg=list(argv[1:]), **{"capture-output": True}
    )
    deadline = time.monotonic() + AGENT_SECONDS
    while True:
        status = _agent(dom, "guest-exec-status", pid=started["pid"])
        if status["exited"]:
            out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
            return Exited(code=int(status.get("exitcode", -1)), out=out)
        assert time.monotonic() < deadline, f"{argv} still running after {AGENT_SECONDS} s"
        time.sleep(0.1)


def guest_spawn(dom: Any, *argv: str) -> None:
    """Start a command in the guest without waiting for it (one that stops the agent)."""
    _agent(dom, "guest-exec", path=argv[0], arg=list(argv[1:]))


def wait_for_agent_gone(dom: Any, seconds: float) -> None:
    """Until libvirt stops reaching the agent (it sees the guest close its port)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            _agent(dom, "guest-ping")
        except libvirt.libvirtError:
            return
        assert time.monotonic() < deadline, f"the guest agent still answers after {seconds} s"
        time.sleep(0.5)


def wait_for_agent(dom: Any, seconds: float) -> None:
    """Until the agent answers (it starts late in boot and resynchronises after a revert)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            _agent(dom, "guest-ping")
            return
        except libvirt.libvirtError as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"the guest agent did not answer in {seconds} s") from error
            time.sleep(0.5)


def _agent(dom: Any, command: str, **arguments: object) -> Any:
    request = json.dumps({"execute": command, **({"arguments": arguments} if arguments else {})})
    return json.loads(libvirt_qemu.qemuAgentCommand(dom, request, AGENT_SECONDS, 0))["return"]


def shutoff_reason(dom: Any) -> int:
    """Why a stopped domain stopped: VIR_DOMAIN_SHUTOFF_SHUTDOWN when the guest did it."""
    state, reason = dom.state(0)
    assert state == libvirt.VIR_DOMAIN_SHUTOFF, f"domain state {state}, not shut off"
    return int(reason)


def pool_volume_names(pool: Any) -> set[str]:
    pool.refresh(0)
    return {str(volume.name()) for volume in pool.listAllVolumes(0)}
