"""Small files on a datastore ("[datastore] dir/file"), such as the record kept beside an
imported disk: read and written whole through vCenter's datastore file access
(`/folder/<path>?dcPath=<datacenter>&dsName=<datastore>`, with the session's cookie and TLS
settings), looked up with the datastore browser, deleted by the FileManager.

Only for small files: a read holds at most `limit` bytes, a write its whole body. What vCenter
answers in words (no such datastore, an HTTP status) is a Failure; what the network raises on
the way stays an exception (naming the file) for the package's edge.
"""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import fault_is, or_none, transferring
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve, retrieve_all
from pyrigaud.adapters.hypervisors.vsphere.session import Connection
from pyrigaud.adapters.hypervisors.vsphere.tasks import ended, wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter_http import opened_request
from pyrigaud.domain.errors import ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

DATASTORE_PATH = re.compile(r"\[(?P<datastore>[^\]]+)\] ?(?P<path>[^\x00-\x1f]*)")
# Characters the datastore browser's match patterns treat as wildcards.
WILDCARDS = re.compile(r"[*?\[\]\\]")
SMALL_FILE_BYTES = 65536


@dataclass(frozen=True)
class _File:
    """A datastore path resolved to what vCenter's APIs need."""

    datastore_name: str
    path: str  # within the datastore, no leading "/"
    datastore: Any
    datacenter: Any
    datacenter_path: str  # inventory path of the datacenter, e.g. "DC0" or "east/DC1"

    @property
    def datastore_path(self) -> str:
        return f"[{self.datastore_name}] {self.path}".rstrip()

    @property
    def url(self) -> str:
        query = urlencode({"dcPath": self.datacenter_path, "dsName": self.datastore_name})
        return f"/folder/{quote(self.path)}?{query}"


def folder_of(datastore_path: str) -> str:
    """The folder holding a file: `[ds] dir` of `[ds] dir/file.vmdk`."""
    return datastore_path.rpartition("/")[0]


def read_small(
    connection: Connection, datastore_path: str, limit: int = SMALL_FILE_BYTES
) -> Result[bytes | None, ProviderError]:
    """The file's bytes; None when there is no such file; FAILED_PRECONDITION when it holds
    more than `limit` bytes (never read whole)."""

    def read(file: _File) -> Result[bytes | None, ProviderError]:
        status, body = _exchange(connection, file, "GET", b"", limit)
        if status == http.client.NOT_FOUND:
            return Success(None)
        if len(body) > limit and _succeeded(status):
            return Failure(
                ProviderError.failed_precondition(
                    f"datastore file {file.datastore_path!r} is larger than {limit} bytes"
                )
            )

        def read_body(_checked_status: None) -> bytes | None:
            return body

        return _checked(status, "reading", file).map(read_body)

    return _resolve(connection, datastore_path).bind(read)


def write_small(
    connection: Connection, datastore_path: str, data: bytes
) -> Result[None, ProviderError]:
    """Create or replace the file with `data`; its folder must exist (NOT_FOUND otherwise)."""

    def write(file: _File) -> Result[None, ProviderError]:
        status, _ = _exchange(connection, file, "PUT", data, 0)
        return _checked(status, "writing", file)

    return _resolve(connection, datastore_path).bind(write)


def exists(connection: Connection, datastore_path: str) -> Result[bool, ProviderError]:
    """Whether the datastore holds a file or folder at that path (the datastore browser's
    answer, so a folder counts too)."""

    def look(file: _File) -> Result[bool, ProviderError]:
        parent, _, name = file.path.rstrip("/").rpartition("/")
        if not name:
            return Success(True)  # the datastore's root
        browser = retrieve(connection, [file.datastore], ("browser",))[0]["browser"]
        # A name with wildcard characters matches itself through `?`; the exact test is below.
        spec = vim.host.DatastoreBrowser.SearchSpec(matchPattern=[WILDCARDS.sub("?", name)])
        folder = f"[{file.datastore_name}] {parent}".rstrip()

        def searched() -> Result[Any, ProviderError]:
            return wait(
                connection, browser.SearchDatastore_Task(datastorePath=folder, searchSpec=spec)
            )

        def named(answer: Any) -> bool:
            return any(entry.path == name for entry in answer.file or ())

        found = or_none(searched, fault_is(vim.fault.FileNotFound))
        if found is None:
            return Success(False)
        return found.map(named)

    return _resolve(connection, datastore_path).bind(look)


def delete(connection: Connection, datastore_path: str) -> Result[None, ProviderError]:
    """Delete the file, or the folder with everything in it; nothing there is fine."""

    def remove(file: _File) -> Result[None, ProviderError]:
        manager = connection.content.fileManager

        def deleted_now() -> Result[None, ProviderError]:
            return ended(
                connection,
                manager.DeleteDatastoreFile_Task(
                    name=file.datastore_path, datacenter=file.datacenter
                ),
            )

        deleted = or_none(deleted_now, fault_is(vim.fault.FileNotFound))
        return Success(None) if deleted is None else deleted

    return _resolve(connection, datastore_path).bind(remove)


def _resolve(connection: Connection, datastore_path: str) -> Result[_File, ProviderError]:
    found = DATASTORE_PATH.fullmatch(datastore_path)
    if found is None:
        return Failure(
            ProviderError.failed_precondition(
                f"{datastore_path!r} is not a datastore path '[ds] dir/file'"
            )
        )
    path = found["path"].lstrip("/")
    if ".." in path.split("/"):
        return Failure(
            ProviderError.failed_precondition(
                f"{datastore_path!r} leaves its datastore folder ('..')"
            )
        )
    name = found["datastore"]
    rows = [
        row for row in retrieve_all(connection, vim.Datastore, ("name",)) if row["name"] == name
    ]
    if not rows:
        return Failure(ProviderError.not_found(f"no datastore named {name!r}"))
    datacenter, datacenter_path = _datacenter(connection, rows[0]["_ref"])
    return Success(_File(name, path, rows[0]["_ref"], datacenter, datacenter_path))


def _datacenter(connection: Connection, datastore: Any) -> tuple[Any, str]:
    """The datastore's datacenter and its inventory path (folders above it included, the
    root folder not), which is what `dcPath` names."""
    datacenter, names, entity = None, [], datastore
    while entity is not None:
        row = retrieve(connection, [entity], ("name", "parent"))[0]
        parent = row.get("parent")
        if isinstance(entity, vim.Datacenter):
            datacenter = entity
        if datacenter is not None and parent is not None:  # not the root folder's name
            names.append(str(row["name"]))
        entity = parent
    return datacenter, "/".join(reversed(names))


def _exchange(
    connection: Connection, file: _File, method: str, body: bytes, limit: int
) -> tuple[int, bytes]:
    """One request: the status and at most `limit` + 1 bytes of the answer (what the network
    raises, named after the file, is the edge's to map)."""
    headers = (
        {"Content-Type": "application/octet-stream", "Content-Length": str(len(body))}
        if method == "PUT"
        else {}
    )

    with (
        transferring(f"datastore file {file.datastore_path!r}"),
        opened_request(connection._stub, method, file.url, headers) as request,
    ):
        if body:
            request.send(body)
        response = request.getresponse()
        return response.status, response.read(limit + 1)


def _succeeded(status: int) -> bool:
    return 200 <= status < 300


def _checked(status: int, doing: str, file: _File) -> Result[None, ProviderError]:
    if _succeeded(status):
        return Success(None)
    problem = f"{doing} datastore file {file.datastore_path!r}: HTTP {status}"
    if status == http.client.NOT_FOUND:
        return Failure(ProviderError.not_found(problem))
    if status == http.client.FORBIDDEN:
        return Failure(ProviderError.permission_denied(problem))
    return Failure(ProviderError.unavailable(problem))
