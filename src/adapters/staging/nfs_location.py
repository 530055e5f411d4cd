"""The nfs staging type's rules: `nfs://<server><export>[/<path>]/<file>[?gid=G&uid=U]`, uid
and gid being the AUTH_SYS identity the file is written and read with (the URL's win over the
options'); no credentials; the sweep's place `<export>[/<path>]/`, where the manager's flat
names of every migration lie. The hypervisor can reach an NFS export itself, so a direct
transfer through it is possible (and carried out as relay here)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar
from urllib.parse import SplitResult, parse_qsl

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.rules import PLACE_NAME, invalid, required_for, text_options
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import (
    StagedHost,
    StagedLocation,
    StagingOptions,
    StagingType,
    relative_key,
)

NFS = StagingType("nfs")
NFS_PORT = 2049
MAX_ID = 4_294_967_295  # uid/gid: the CRD's bounds
NFS_SERVER = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+")
# The options' keys as the manager sends them.
TEXT_OPTIONS = ("server", "export", "path")
IDENTITIES = ("uid", "gid")


class NfsOptions(StagingOptions):
    """`server` is the URL's once a location is parsed; uid/gid the URL's when it names them."""

    server: str = ""
    export: str = ""
    path: str = ""
    uid: int | None = None
    gid: int | None = None

    reached_by_hypervisor: ClassVar[bool] = True

    def host(self) -> StagedHost | None:
        return StagedHost(
            field=fields.storage_option("server"), host=self.server.strip("[]"), port=NFS_PORT
        )


class NfsRules:
    staging_type = NFS
    shape = "nfs://<server><export>/<file>[?gid=G&uid=U]"
    option_keys = (*TEXT_OPTIONS, *IDENTITIES)
    takes_query = True
    takes_credentials = False
    no_place = ""

    def options(self, options: Mapping[str, object]) -> Result[NfsOptions, ProviderError]:
        match text_options(options, TEXT_OPTIONS):
            case Failure() as failed:
                return failed
            case Success(text):
                values: dict[str, object] = dict(text)
        for key in IDENTITIES:
            if options.get(key) is not None:
                match _identifier(fields.storage_option(key), options[key]):
                    case Failure() as failed:
                        return failed
                    case Success(identifier):
                        values[key] = identifier
        export = text.get("export", "")
        if export and not export.startswith("/"):
            return invalid(fields.storage_option("export"), "must start with '/'")
        return Success(NfsOptions.model_validate(values))

    def located(
        self,
        field: str,
        url: str,
        parts: SplitResult,
        options: NfsOptions,
        credentials: Mapping[str, str] | None,
    ) -> Result[StagedLocation, ProviderError]:
        server, path = parts.netloc, parts.path
        if not NFS_SERVER.fullmatch(server):
            return invalid(field, "must name an NFS server (a host name or address, no port)")
        if options.server and options.server != server:
            return invalid(fields.storage_option("server"), f"does not match the server of {field}")
        # Without the option, the file's folder is mounted, as libnfs does with a bare URL.
        export = options.export.rstrip("/") if options.export else path.rsplit("/", 1)[0]
        if not path.startswith(f"{export}/"):
            export_option = fields.storage_option("export")
            return invalid(
                field, f"its path must start with {export_option} followed by a file", export_option
            )

        def located(key: str, uid: int | None, gid: int | None) -> StagedLocation:
            return StagedLocation(
                staging_type=NFS,
                field=field,
                url=url,
                container=export or "/",
                key=key,
                options=options.model_copy(
                    update={
                        "server": server,
                        "uid": options.uid if uid is None else uid,
                        "gid": options.gid if gid is None else gid,
                    }
                ),
            )

        return Result.do(
            located(key, *ids)
            for key in relative_key(field, path.removeprefix(f"{export}/"))
            for ids in _identity(field, parts.query)
        )

    def place_url(self, options: NfsOptions) -> Result[str, ProviderError]:
        for key in ("server", "export"):
            if not getattr(options, key):
                return required_for(fields.storage_option(key), NFS)
        path = options.path.strip("/")
        url = f"nfs://{options.server}{options.export.rstrip('/')}/{path + '/' if path else ''}"
        return Success(url + PLACE_NAME)


def nfs_options(location: StagedLocation) -> NfsOptions:
    """The options NfsRules put on an nfs location (a location of another type reaching the
    NFS store is a bug)."""
    if not isinstance(location.options, NfsOptions):
        raise TypeError(f"not an nfs location: {location.staging_type!r}")
    return location.options


def _identity(field: str, query: str) -> Result[tuple[int | None, int | None], ProviderError]:
    """The URL's uid and gid query values (the only keys it may carry)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        return invalid(field, "its query must be gid=<n>&uid=<n>")
    found: dict[str, int] = {}
    for key, value in pairs:
        if key not in IDENTITIES or key in found:
            return invalid(field, "its query may hold only one uid and one gid")
        match _identifier(f"{field} {key}", value):
            case Failure() as failed:
                return failed
            case Success(identifier):
                found[key] = identifier
    return Success((found.get("uid"), found.get("gid")))


def _identifier(field: str, value: object) -> Result[int, ProviderError]:
    """A uid or gid: an integer (or its decimal text) in 0..4294967295."""
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        return invalid(field, f"must be an integer from 0 to {MAX_ID}")
    return Success(value)
