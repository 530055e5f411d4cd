"""The read-only key -> value set every credentials adapter returns; it never prints a value."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class SecretValues(Mapping[str, str]):
    """An immutable mapping whose repr/str name only the keys, so a logged set leaks nothing."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values: dict[str, str] = dict(values or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"SecretValues(keys={sorted(self._values)!r})"

    __str__ = __repr__
