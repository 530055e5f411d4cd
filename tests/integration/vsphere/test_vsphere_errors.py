"""vSphere faults map to the error kinds the manager's circuit breaker needs (docs/contract.md);
a reply this pyVmomi cannot read (a newer vCenter's fault type or property) is UNAVAILABLE."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl
from pyVmomi.SoapAdapter import SoapStubAdapter
from returns.result import Success

from pyrigaud.adapters.hypervisors.vsphere.calls import attempt
from pyrigaud.adapters.hypervisors.vsphere.errors import provider_error
from pyrigaud.adapters.hypervisors.vsphere.session import LoginError
from pyrigaud.domain.errors import ErrorKind

from support import error_of

vim: Any = untyped_vim  # pyVmomi's fault constructors are untyped
vmodl: Any = untyped_vmodl


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (vim.fault.NotFound(), ErrorKind.NOT_FOUND),
        (vmodl.fault.ManagedObjectNotFound(), ErrorKind.NOT_FOUND),
        (vim.fault.InvalidPowerState(), ErrorKind.FAILED_PRECONDITION),
        (vim.fault.DuplicateName(), ErrorKind.ALREADY_EXISTS),
        (vmodl.fault.NotSupported(), ErrorKind.UNSUPPORTED),
        (vmodl.fault.MethodNotFound(), ErrorKind.UNSUPPORTED),
        (vmodl.fault.InvalidArgument(), ErrorKind.INVALID_SPEC),
        (vim.fault.InvalidLogin(), ErrorKind.UNAVAILABLE),
        (ConnectionRefusedError(111, "refused"), ErrorKind.UNAVAILABLE),
        (OSError(errno.ENOSPC, "No space left on device"), ErrorKind.RESOURCE_EXHAUSTED),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), ErrorKind.RESOURCE_EXHAUSTED),
        (LoginError("127.0.0.1:1 is down or is not a VIM server"), ErrorKind.UNAVAILABLE),
        (vmodl.fault.SystemError(), ErrorKind.UNAVAILABLE),
        (vim.fault.FileNotFound(), ErrorKind.FAILED_PRECONDITION),  # a fault the table omits
    ],
)
def test_each_fault_has_its_kind_and_the_message_says_what_was_being_done(
    fault: BaseException, kind: ErrorKind
) -> None:
    error = provider_error(fault, "deleting VM 'vm-1'")
    assert error.kind is kind
    assert error.message.startswith("deleting VM 'vm-1': ")


FAULT_REPLY = """<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<soapenv:Body><soapenv:Fault><faultcode>ServerFaultCode</faultcode>
<faultstring>from a newer server</faultstring>
<detail><{name}Fault xmlns="urn:vim25" xsi:type="{name}">{body}</{name}Fault></detail>
</soapenv:Fault></soapenv:Body></soapenv:Envelope>"""


@contextmanager
def soap_server(reply: str) -> Iterator[int]:
    """A loopback HTTP server answering every SOAP call with `reply` (HTTP 500, as vCenter
    answers a fault); its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = reply.encode()
            self.send_response(500)
            self.send_header("Content-Type", "text/xml; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("BrandNewFutureThing", ""),  # a fault type this pyVmomi does not know
        ("TaskInProgress", "<addedInAFutureRelease>1</addedInAFutureRelease>"),  # a new property
    ],
)
def test_a_fault_pyvmomi_cannot_read_is_unavailable_never_internal(name: str, body: str) -> None:
    with soap_server(FAULT_REPLY.format(name=name, body=body)) as port:
        # A negative port is pyVmomi's way of saying plain http.
        stub = SoapStubAdapter(host="127.0.0.1", port=-port, version="vim.version.version8")
        instance = vim.ServiceInstance("ServiceInstance", stub)
        result = attempt("reading the service content", lambda: Success(instance.RetrieveContent()))
    error = error_of(result)
    assert error.kind is ErrorKind.UNAVAILABLE
    assert error.message.startswith("reading the service content: vCenter answered with what")


def test_a_bug_of_ours_stays_a_bug() -> None:
    """Only what pyVmomi's reader raises is taken for a newer server's reply."""
    nothing: dict[str, int] = {}
    with pytest.raises(KeyError):
        attempt("looking something up", lambda: Success(nothing["missing"]))
