"""A JSON payload read the way Go's decoder reads it into a struct, and the value checks.

The manager marshals Go structs (keys match case-insensitively, unknown keys are ignored,
`null` is accepted for every list and object, a missing key is the zero value). A bad value
raises `ExpectedError` naming the field by its wire path (`image_json.URL`,
`networks_json[1].NetworkName`); `parser` turns a raising parser into a Result-returning one,
the only exit for bad input.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Mapping
from functools import wraps
from typing import ParamSpec, TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.domain import bounds
from pyrigaud.domain.bounds import describe_value
from pyrigaud.domain.errors import ExpectedError, ProviderError

_P = ParamSpec("_P")
_T = TypeVar("_T")

INT32_MAX = 2**31 - 1


def invalid(field: str, problem: str) -> ExpectedError:
    return ExpectedError(ProviderError.invalid_spec(field, problem))


def parser(function: Callable[_P, _T]) -> Callable[_P, Result[_T, ProviderError]]:
    """Make a raising parser a Result-returning one (the package's only exit for bad input)."""

    @wraps(function)
    def parse(*args: _P.args, **kwargs: _P.kwargs) -> Result[_T, ProviderError]:
        try:
            return Success(function(*args, **kwargs))
        except ExpectedError as error:
            return Failure(error.error)

    return parse


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

    def text(self, key: str, limit: int = bounds.MAX_STRING_LENGTH) -> str:
        return as_text(self.raw(key), self.field(key), limit)

    def integer(self, key: str, low: int = -INT32_MAX - 1, high: int = INT32_MAX) -> int:
        return as_int(self.raw(key), self.field(key), low, high)

    def optional_integer(self, key: str, low: int, high: int) -> int | None:
        value = self.raw(key)
        return None if value is None else as_int(value, self.field(key), low, high)

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise invalid(self.field(key), f"expected true or false, got {describe_value(value)}")
        return value

    def obj(self, key: str) -> Document | None:
        return as_document(self.raw(key), self.field(key))

    def objects(self, key: str, most: int) -> list[Document]:
        items = as_list(self.raw(key), self.field(key), most)
        docs = [
            as_document(item, f"{self.field(key)}[{index}]") for index, item in enumerate(items)
        ]
        return [doc if doc is not None else Document({}, "") for doc in docs]

    def strings(self, key: str, most: int, limit: int = bounds.MAX_STRING_LENGTH) -> list[str]:
        field = self.field(key)
        items = as_list(self.raw(key), field, most)
        return [as_text(item, f"{field}[{index}]", limit) for index, item in enumerate(items)]

    def string_map(self, key: str) -> dict[str, str]:
        return _string_map(self.raw(key), self.field(key))

    def as_string_map(self, field: str) -> dict[str, str]:
        """This whole object (keys case-folded) as string values, errors naming `field`."""
        return _string_map(self._data, field)


def _string_map(value: object, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(field, f"expected an object, got {describe_value(value)}")
    result: dict[str, str] = {}
    for name, item in value.items():
        _check_unicode(name, field)
        if isinstance(item, bool):
            result[name] = "true" if item else "false"
        elif isinstance(item, int | float):
            result[name] = str(item)
        else:
            result[name] = as_text(item, f"{field}[{describe_value(name)}]")
    return result


def _check_unicode(value: str, field: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(field, "is not valid Unicode text") from None


def as_text(value: object, field: str, limit: int = bounds.MAX_STRING_LENGTH) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid(field, f"expected a string, got {describe_value(value)}")
    _check_unicode(value, field)
    if len(value) > limit:
        raise invalid(field, f"must be at most {limit} characters")
    return value


def as_int(value: object, field: str, low: int, high: int) -> int:
    if value is None:
        number = 0
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(field, f"expected an integer, got {describe_value(value)}")
    elif isinstance(value, float):
        if not value.is_integer():
            raise invalid(field, f"expected an integer, got {describe_value(value)}")
        number = int(value)
    else:
        number = value
    if not low <= number <= high:
        raise invalid(field, f"must be between {low} and {high}, got {describe_value(number)}")
    return number


def as_list(value: object, field: str, most: int) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(field, f"expected a list, got {describe_value(value)}")
    if len(value) > most:
        raise invalid(field, f"at most {most} entries are supported, got {len(value)}")
    return value


def as_document(value: object, field: str) -> Document | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(field, f"expected an object, got {describe_value(value)}")
    return Document(value, field)


def load(text: str, field: str) -> Document:
    """Decode one *_json field; "" and "null" are an empty object, like Go's zero value."""
    if len(text) > bounds.MAX_JSON_PAYLOAD_BYTES:
        raise invalid(field, f"must be at most {bounds.MAX_JSON_PAYLOAD_BYTES} bytes")
    if not text.strip():
        return Document({}, field)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise invalid(field, f"is not valid JSON ({_short(error)})") from None
    doc = as_document(value, field)
    return doc if doc is not None else Document({}, field)


def load_list(text: str, field: str, most: int) -> list[Document]:
    """A *_json field holding a list: "" and null are empty, like Go's nil slice."""
    wrapper = f'{{"items": {text}}}' if text.strip() else "{}"
    if len(text) > bounds.MAX_JSON_PAYLOAD_BYTES:
        raise invalid(field, f"must be at most {bounds.MAX_JSON_PAYLOAD_BYTES} bytes")
    try:
        value = json.loads(wrapper)
    except (ValueError, RecursionError) as error:
        raise invalid(field, f"is not valid JSON ({_short(error)})") from None
    items = as_list(value.get("items"), field, most)
    docs = [as_document(item, f"{field}[{index}]") for index, item in enumerate(items)]
    return [
        doc if doc is not None else Document({}, f"{field}[{index}]")
        for index, doc in enumerate(docs)
    ]


def _short(error: Exception) -> str:
    return describe_value(str(error), 80).strip("'\"")


# --- value checks against the domain's bounds ------------------------------------------------


def checked_name(value: str, field: str) -> str:
    problem = bounds.name_problem(value)
    if problem is not None:
        raise invalid(field, problem)
    return value


def checked_cpu(value: int, field: str) -> int:
    if not bounds.MIN_CPU <= value <= bounds.MAX_CPU:
        raise invalid(field, f"must be between {bounds.MIN_CPU} and {bounds.MAX_CPU}")
    return value


def checked_memory(value: int, field: str) -> int:
    if not bounds.MIN_MEMORY_MIB <= value <= bounds.MAX_MEMORY_MIB:
        raise invalid(
            field, f"must be between {bounds.MIN_MEMORY_MIB} and {bounds.MAX_MEMORY_MIB} MiB"
        )
    return value


def disk_gib(doc: Document, key: str, low: int) -> int:
    return doc.integer(key, low, bounds.MAX_DISK_GIB)


def checked_cloud_init(data: bytes, field: str) -> bytes:
    if len(data) > bounds.MAX_CLOUD_INIT_BYTES:
        raise invalid(field, f"must be at most {bounds.MAX_CLOUD_INIT_BYTES} bytes")
    return data


def checked_ip(value: str, field: str, *, allow_prefix: bool = False) -> str:
    if not value:
        return ""
    try:
        if allow_prefix and "/" in value:
            ipaddress.ip_interface(value)
        else:
            ipaddress.ip_address(value)
    except ValueError:
        raise invalid(field, f"{describe_value(value)} is not an IP address") from None
    return value
