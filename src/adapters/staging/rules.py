"""What one staging type is (its rules and its store's builder), and the checks every type's
URL and options go through.

Each staging type (`pvc_location.py`, `s3_location.py`, `nfs_location.py`) decides what its
URL, storage options and credentials may be, and where the manager stages every migration's
objects (the place a sweep visits); `registry.py` names each type once. Refusals name
domain paths (`pyrigaud.domain.fields`): an option is `storage_options.<key>`, a credential
`credentials.<key>`, keyed as the manager sent them; the gRPC edge writes the manager's names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import SplitResult, urlsplit

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.application.ports.clock import Clock
from pyrigaud.application.ports.staging import StagingStorage
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedLocation, StagingOptions, StagingType

Options = TypeVar("Options", bound=StagingOptions)


class StagingRules(Protocol[Options]):
    """One staging type's rules, over its own options value."""

    @property
    def staging_type(self) -> StagingType:
        """The manager's name for the type, also its URLs' scheme."""
        ...

    @property
    def shape(self) -> str:
        """What the type's URL looks like, for a refusal."""
        ...

    @property
    def option_keys(self) -> tuple[str, ...]:
        """The storage options' keys it reads, as the manager sends them."""
        ...

    @property
    def takes_query(self) -> bool:
        """Whether its URL may carry a query (read by `located`)."""
        ...

    @property
    def takes_credentials(self) -> bool:
        """Whether it needs credentials (a sweep place of the type says where they are)."""
        ...

    def options(self, options: Mapping[str, object]) -> Result[Options, ProviderError]:
        """The options this type reads, checked; the others are ignored, as Go's decoder does."""
        ...

    def located(
        self,
        field: str,
        url: str,
        parts: SplitResult,
        options: Options,
        credentials: Mapping[str, str] | None,
    ) -> Result[StagedLocation, ProviderError]:
        """The location `url` names, once `parse_url` checked what every type checks; None
        `credentials` are read later, at each use (the location is only checked now)."""
        ...

    @property
    def no_place(self) -> str:
        """Why a sweep needs no place of this type named ("": it does, see `place_url`)."""
        ...

    def place_url(self, options: Options) -> Result[str, ProviderError]:
        """The URL of the folder where the manager stages every migration's objects with these
        options, as an object in it (`PLACE_NAME`)."""
        ...


@dataclass(frozen=True)
class StoreContext:
    """What a staging type's store is built with: the provider's owner mark and clock, how long
    a transfer waits out a store that stopped answering, the one queue of deferred aborts,
    where the PVCs are mounted, and the suffixes of the companions staged beside an object
    (`<object><suffix>`), which its sweep removes once their object is gone."""

    owner: str
    clock: Clock
    retry_seconds: float
    aborts: DeferredAborts
    pvc_root: str
    companion_suffixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StagingKind:
    """One staging type: its rules, and its store's builder, which answers None where this
    machine lacks what the store needs (a library, an extra): the type is then not served."""

    rules: StagingRules[Any]
    store: Callable[[StoreContext], StagingStorage | None]


# The options' key naming the type they are for, whatever the type.
DECLARED_TYPE = "backend"

# A place's nominal object, read as "everything in its folder": a sweep looks only at the folder.
PLACE_NAME = "*"


def parse_url(
    field: str,
    url: str,
    rules: StagingRules[Any],
    options: Mapping[str, object],
    credentials: Mapping[str, str] | None,
    *,
    others: Sequence[StagingRules[Any]] = (),
) -> Result[StagedLocation, ProviderError]:
    """The location `url` (the request's `field`) names by `rules`, or the first problem;
    the options are also read by the `others` types' rules (`readable`)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced IPv6 bracket
        return invalid(field, f"must be {rules.shape}")
    staging_type = rules.staging_type
    if parts.scheme.lower() != staging_type:
        return invalid(
            field,
            f"must be a {staging_type}:// URL for {fields.STAGING_TYPE} {staging_type!r}",
            fields.STAGING_TYPE,
        )
    if "@" in parts.netloc:
        return invalid(field, "must not carry credentials")  # never echoed: it may hold some
    if parts.fragment or (parts.query and not rules.takes_query):
        return invalid(field, f"must be {rules.shape}")
    return Result.do(
        location
        for _ in declared_type(options, staging_type)
        for checked in rules.options(options)
        for _ in readable(options, others)
        for location in rules.located(field, url, parts, checked, credentials)
    )


def parse_place(
    rules: StagingRules[Any],
    options: Mapping[str, object],
    credentials: Mapping[str, str] | None,
) -> Result[StagedLocation, ProviderError]:
    """The place where the manager stages every migration's objects with these options (its
    URL up to the migration's own part), as the location of an object in it: what a sweep of
    that place takes."""
    return Result.do(
        location
        for _ in declared_type(options, rules.staging_type)
        for checked in rules.options(options)
        for url in rules.place_url(checked)
        for location in parse_url(fields.STORAGE_OPTIONS, url, rules, options, credentials)
    )


def readable(
    options: Mapping[str, object], readers: Sequence[StagingRules[Any]]
) -> Result[None, ProviderError]:
    """The manager sends one set of storage options whatever the type, so a value the type
    reading its key would refuse is refused whatever the request's type: each reader's rules
    read the options in turn."""
    for reader in readers:
        match reader.options(options):
            case Failure() as failed:
                return failed
    return Success(None)


def declared_type(
    options: Mapping[str, object], staging_type: StagingType
) -> Result[None, ProviderError]:
    """The options' own `backend` key, when set, must name the request's type."""
    declared = options.get(DECLARED_TYPE)
    if isinstance(declared, str) and declared.strip() and declared.strip() != staging_type:
        return invalid(
            fields.storage_option(DECLARED_TYPE),
            f"does not match {fields.STAGING_TYPE} {staging_type!r}",
            fields.STAGING_TYPE,
        )
    return Success(None)


def text_options(
    options: Mapping[str, object], keys: tuple[str, ...]
) -> Result[dict[str, str], ProviderError]:
    """The string options among `keys`, stripped (a missing one is left out); unknown keys
    are ignored, as Go's decoder does."""
    values: dict[str, str] = {}
    for key in keys:
        value = options.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            return invalid(fields.storage_option(key), "must be a string")
        values[key] = value.strip()
    return Success(values)


def required_for(field: str, staging_type: StagingType) -> Failure[ProviderError]:
    """`field` is missing, and `staging_type` needs it."""
    return invalid(
        field, f"required for {fields.STAGING_TYPE} {staging_type!r}", fields.STAGING_TYPE
    )


def invalid(field: str, problem: str, *mentions: str) -> Failure[ProviderError]:
    return Failure(ProviderError.invalid_spec(field, problem, mentions))
