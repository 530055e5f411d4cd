"""A JSON payload read the way Go's decoder reads it into a struct, and the value checks.

The manager marshals Go structs (keys match case-insensitively, unknown keys are ignored,
`null` is accepted for every list and object, a missing key is the zero value). Every read
and check answers a Result whose failure names the field by its wire path (`image_json.URL`,
`networks_json[1].NetworkName`); the parsers compose them (`Result.do`, `bind`), so the first
bad value is the answer.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.domain import bounds
from pyrigaud.domain.bounds import describe_value
from pyrigaud.domain.errors import ErrorKind, ProviderError

_T = TypeVar("_T")
_U = TypeVar("_U")

INT32_MAX = 2**31 - 1


def invalid(field: str, problem: str) -> Failure[ProviderError]:
    """Bad input named by its wire path: already the manager's name, so no domain path."""
    return Failure(ProviderError(kind=ErrorKind.INVALID_SPEC, message=f"{field}: {problem}"))


def each(
    items: Iterable[_T], check: Callable[[_T], Result[_U, ProviderError]]
) -> Result[tuple[_U, ...], ProviderError]:
    """`check` of every item, in order; the first failure is the answer."""
    checked: list[_U] = []
    for item in items:
        match check(item):
            case Failure() as failed:
                return failed
            case Success(value):
                checked.append(value)
    return Success(tuple(checked))


def each_at(
    items: Iterable[_T], field: str, check: Callable[[_T, str], Result[_U, ProviderError]]
) -> Result[tuple[_U, ...], ProviderError]:
    """`check` of every item of the list `field` with its wire path, `field[i]`, in order; the
    first failure is the answer."""

    def at(indexed: tuple[int, _T]) -> Result[_U, ProviderError]:
        index, item = indexed
        return check(item, f"{field}[{index}]")

    return each(enumerate(items), at)


class Document:
    """A JSON object read the way Go's decoder reads it into a struct."""

    def __init__(self, data: Mapping[str, object], path: str) -> None:
        self._path = path
        # Go assigns keys in document order, so among case variants of one key the last wins.
        self._data = {key.casefold(): value for key, value in data.items()}

    def field(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def raw(self, key: str) -> object:
        return self._data.get(key.casefold())

    def text(self, key: str, limit: int = bounds.MAX_STRING_LENGTH) -> Result[str, ProviderError]:
        return as_text(self.raw(key), self.field(key), limit)

    def integer(
        self, key: str, low: int = -INT32_MAX - 1, high: int = INT32_MAX
    ) -> Result[int, ProviderError]:
        return as_int(self.raw(key), self.field(key), low, high)

    def optional_integer(self, key: str, low: int, high: int) -> Result[int | None, ProviderError]:
        value = self.raw(key)
        return Success(None) if value is None else as_int(value, self.field(key), low, high)

    def boolean(self, key: str) -> Result[bool, ProviderError]:
        value = self.raw(key)
        if value is None:
            return Success(False)
        if not isinstance(value, bool):
            return invalid(self.field(key), f"expected true or false, got {describe_value(value)}")
        return Success(value)

    def obj(self, key: str) -> Result[Document | None, ProviderError]:
        return as_document(self.raw(key), self.field(key))

    def objects(self, key: str, most: int) -> Result[tuple[Document, ...], ProviderError]:
        field = self.field(key)
        return Result.do(
            docs
            for items in as_list(self.raw(key), field, most)
            for docs in each_at(items, field, partial(_object_at, empty_path=""))
        )

    def strings(
        self, key: str, most: int, limit: int = bounds.MAX_STRING_LENGTH
    ) -> Result[tuple[str, ...], ProviderError]:
        field = self.field(key)
        return Result.do(
            texts
            for items in as_list(self.raw(key), field, most)
            for texts in each_at(items, field, partial(as_text, limit=limit))
        )

    def string_map(self, key: str) -> Result[dict[str, str], ProviderError]:
        return _string_map(self.raw(key), self.field(key))

    def as_string_map(self, field: str) -> Result[dict[str, str], ProviderError]:
        """This whole object (keys case-folded) as string values, errors naming `field`."""
        return _string_map(self._data, field)


def _string_map(value: object, field: str) -> Result[dict[str, str], ProviderError]:
    if value is None:
        return Success({})
    if not isinstance(value, dict):
        return invalid(field, f"expected an object, got {describe_value(value)}")
    result: dict[str, str] = {}
    for name, item in value.items():
        match _checked_unicode(name, field):
            case Failure() as failed:
                return failed
        match _map_value(item, name, field):
            case Failure() as failed:
                return failed
            case Success(text):
                result[name] = text
    return Success(result)


def _map_value(item: object, name: str, field: str) -> Result[str, ProviderError]:
    if isinstance(item, bool):
        return Success("true" if item else "false")
    if isinstance(item, int | float):
        return Success(str(item))
    return as_text(item, f"{field}[{describe_value(name)}]")


def _checked_unicode(value: str, field: str) -> Result[str, ProviderError]:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return invalid(field, "is not valid Unicode text")
    return Success(value)


def as_text(
    value: object, field: str, limit: int = bounds.MAX_STRING_LENGTH
) -> Result[str, ProviderError]:
    if value is None:
        return Success("")
    if not isinstance(value, str):
        return invalid(field, f"expected a string, got {describe_value(value)}")
    match _checked_unicode(value, field):
        case Failure() as failed:
            return failed
    if len(value) > limit:
        return invalid(field, f"must be at most {limit} characters")
    return Success(value)


def as_int(value: object, field: str, low: int, high: int) -> Result[int, ProviderError]:
    if value is None:
        number = 0
    elif isinstance(value, bool) or not isinstance(value, int | float):
        return invalid(field, f"expected an integer, got {describe_value(value)}")
    elif isinstance(value, float):
        if not value.is_integer():
            return invalid(field, f"expected an integer, got {describe_value(value)}")
        number = int(value)
    else:
        number = value
    if not low <= number <= high:
        return invalid(field, f"must be between {low} and {high}, got {describe_value(number)}")
    return Success(number)


def as_list(value: object, field: str, most: int) -> Result[list[object], ProviderError]:
    if value is None:
        return Success([])
    if not isinstance(value, list):
        return invalid(field, f"expected a list, got {describe_value(value)}")
    if len(value) > most:
        return invalid(field, f"at most {most} entries are supported, got {len(value)}")
    return Success(value)


def as_document(value: object, field: str) -> Result[Document | None, ProviderError]:
    if value is None:
        return Success(None)
    if not isinstance(value, dict):
        return invalid(field, f"expected an object, got {describe_value(value)}")
    return Success(Document(value, field))


def load(text: str, field: str) -> Result[Document, ProviderError]:
    """Decode one *_json field; "" and "null" are an empty object, like Go's zero value."""
    if len(text) > bounds.MAX_JSON_PAYLOAD_BYTES:
        return invalid(field, f"must be at most {bounds.MAX_JSON_PAYLOAD_BYTES} bytes")
    if not text.strip():
        return Success(Document({}, field))
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        return invalid(field, f"is not valid JSON ({_short(error)})")
    return _object_at(value, field)


def load_list(text: str, field: str, most: int) -> Result[tuple[Document, ...], ProviderError]:
    """A *_json field holding a list: "" and null are empty, like Go's nil slice."""
    wrapper = f'{{"items": {text}}}' if text.strip() else "{}"
    if len(text) > bounds.MAX_JSON_PAYLOAD_BYTES:
        return invalid(field, f"must be at most {bounds.MAX_JSON_PAYLOAD_BYTES} bytes")
    try:
        value = json.loads(wrapper)
    except (ValueError, RecursionError) as error:
        return invalid(field, f"is not valid JSON ({_short(error)})")
    return Result.do(
        docs
        for items in as_list(value.get("items"), field, most)
        for docs in each_at(items, field, _object_at)
    )


def _object_at(
    value: object, path: str, empty_path: str | None = None
) -> Result[Document, ProviderError]:
    """The object at `path`; null is an empty one, at `empty_path` when given."""
    return Result.do(
        doc if doc is not None else Document({}, path if empty_path is None else empty_path)
        for doc in as_document(value, path)
    )


def _short(error: Exception) -> str:
    return describe_value(str(error), 80).strip("'\"")


# --- value checks against the domain's bounds ------------------------------------------------


def checked_name(value: str, field: str) -> Result[str, ProviderError]:
    problem = bounds.name_problem(value)
    if problem is not None:
        return invalid(field, problem)
    return Success(value)


def checked_cpu(value: int, field: str) -> Result[int, ProviderError]:
    if not bounds.MIN_CPU <= value <= bounds.MAX_CPU:
        return invalid(field, f"must be between {bounds.MIN_CPU} and {bounds.MAX_CPU}")
    return Success(value)


def checked_memory(value: int, field: str) -> Result[int, ProviderError]:
    if not bounds.MIN_MEMORY_MIB <= value <= bounds.MAX_MEMORY_MIB:
        return invalid(
            field, f"must be between {bounds.MIN_MEMORY_MIB} and {bounds.MAX_MEMORY_MIB} MiB"
        )
    return Success(value)


def disk_gib(doc: Document, key: str, low: int) -> Result[int, ProviderError]:
    return doc.integer(key, low, bounds.MAX_DISK_GIB)


def checked_cloud_init(data: bytes, field: str) -> Result[bytes, ProviderError]:
    if len(data) > bounds.MAX_CLOUD_INIT_BYTES:
        return invalid(field, f"must be at most {bounds.MAX_CLOUD_INIT_BYTES} bytes")
    return Success(data)


def checked_ip(value: str, field: str, *, allow_prefix: bool = False) -> Result[str, ProviderError]:
    if not value:
        return Success("")
    try:
        if allow_prefix and "/" in value:
            ipaddress.ip_interface(value)
        else:
            ipaddress.ip_address(value)
    except ValueError:
        return invalid(field, f"{describe_value(value)} is not an IP address")
    return Success(value)
