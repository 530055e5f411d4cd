"""Small files on a datastore ("[datastore] dir/file"), such as the record kept beside an
imported disk: read and written whole through vCenter's datastore file access
(`/folder/<path>?dcPath=<datacenter>&dsName=<datastore>`, with the session's cookie and TLS
settings), looked up with the datastore browser, deleted by the FileManager.

Only for small files: a read holds at most `limit` bytes, a write its whole body.
"""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve, retrieve_all
from pyrigaud.adapters.hypervisors.vsphere.tasks import wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter_http import open_request
from pyrigaud.domain.errors import ExpectedError, ProviderError

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


def read_small(instance: Any, datastore_path: str, limit: int = SMALL_FILE_BYTES) -> bytes | None:
    """The file's bytes; None when there is no such file; FAILED_PRECONDITION when it holds
    more than `limit` bytes (never read whole)."""
    file = _resolve(instance, datastore_path)
    status, body = _exchange(instance, file, "GET", b"", limit)
    if status == http.client.NOT_FOUND:
        return None
    _check(status, "reading", file)
    if len(body) > limit:
        raise ExpectedError(
            ProviderError.failed_precondition(
                f"datastore file {file.datastore_path!r} is larger than {limit} bytes"
            )
        )
    return body


def write_small(instance: Any, datastore_path: str, data: bytes) -> None:
    """Create or replace the file with `data`; its folder must exist (NOT_FOUND otherwise)."""
    file = _resolve(instance, datastore_path)
    status, _ = _exchange(instance, file, "PUT", data, 0)
    _check(status, "writing", file)


def exists(instance: Any, datastore_path: str) -> bool:
    """Whether the datastore holds a file or folder at that path (the datastore browser's
    answer, so a folder counts too)."""
    file = _resolve(instance, datastore_path)
    parent, _, name = file.path.rstrip("/").rpartition("/")
    if not name:
        return True  # the datastore's root
    browser = retrieve(instance, [file.datastore], ("browser",))[0]["browser"]
    # A name with wildcard characters matches itself through `?`; the exact test is below.
    spec = vim.host.DatastoreBrowser.SearchSpec(matchPattern=[WILDCARDS.sub("?", name)])
    folder = f"[{file.datastore_name}] {parent}".rstrip()
    try:
        found = wait(instance, browser.SearchDatastore_Task(datastorePath=folder, searchSpec=spec))
    except vim.fault.FileNotFound:
        return False
    return any(entry.path == name for entry in found.file or ())


def delete(instance: Any, datastore_path: str) -> None:
    """Delete the file, or the folder with everything in it; nothing there is fine."""
    file = _resolve(instance, datastore_path)
    manager = instance.content.fileManager
    try:
        wait(
            instance,
            manager.DeleteDatastoreFile_Task(name=file.datastore_path, datacenter=file.datacenter),
        )
    except vim.fault.FileNotFound:
        return


def _resolve(instance: Any, datastore_path: str) -> _File:
    found = DATASTORE_PATH.fullmatch(datastore_path)
    if found is None:
        raise ExpectedError(
            ProviderError.internal(f"{datastore_path!r} is not a datastore path '[ds] dir/file'")
        )
    path = found["path"].lstrip("/")
    if ".." in path.split("/"):
        raise ExpectedError(
            ProviderError.internal(f"{datastore_path!r} leaves its datastore folder ('..')")
        )
    name = found["datastore"]
    rows = [row for row in retrieve_all(instance, vim.Datastore, ("name",)) if row["name"] == name]
    if not rows:
        raise ExpectedError(ProviderError.not_found(f"no datastore named {name!r}"))
    datacenter, datacenter_path = _datacenter(instance, rows[0]["_ref"])
    return _File(name, path, rows[0]["_ref"], datacenter, datacenter_path)


def _datacenter(instance: Any, datastore: Any) -> tuple[Any, str]:
    """The datastore's datacenter and its inventory path (folders above it included, the
    root folder not), which is what `dcPath` names."""
    datacenter, names, entity = None, [], datastore
    while entity is not None:
        row = retrieve(instance, [entity], ("name", "parent"))[0]
        parent = row.get("parent")
        if isinstance(entity, vim.Datacenter):
            datacenter = entity
        if datacenter is not None and parent is not None:  # not the root folder's name
            names.append(str(row["name"]))
        entity = parent
    return datacenter, "/".join(reversed(names))


def _exchange(
    instance: Any, file: _File, method: str, body: bytes, limit: int
) -> tuple[int, bytes]:
    """One request: the status and at most `limit` + 1 bytes of the answer."""
    headers = (
        {"Content-Type": "application/octet-stream", "Content-Length": str(len(body))}
        if method == "PUT"
        else {}
    )
    try:
        connection = open_request(instance._stub, method, file.url, headers)
        try:
            if body:
                connection.send(body)
            response = connection.getresponse()
            return response.status, response.read(limit + 1)
        finally:
            connection.close()
    except (OSError, http.client.HTTPException) as error:
        raise ExpectedError(
            ProviderError.unavailable(f"datastore file {file.datastore_path!r}: {error}")
        ) from error


def _check(status: int, doing: str, file: _File) -> None:
    if 200 <= status < 300:
        return
    problem = f"{doing} datastore file {file.datastore_path!r}: HTTP {status}"
    if status == http.client.NOT_FOUND:
        raise ExpectedError(ProviderError.not_found(problem))
    if status == http.client.FORBIDDEN:
        raise ExpectedError(ProviderError.permission_denied(problem))
    raise ExpectedError(ProviderError.unavailable(problem))
