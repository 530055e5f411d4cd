"""A value derived from a source is remembered per key while the source stays the same."""

from __future__ import annotations

from pyrigaud.domain.remembered import Remembered


class Counted:
    def __init__(self) -> None:
        self.calls: list[object] = []

    def __call__(self, source: object) -> str:
        self.calls.append(source)
        return f"derived from {source!r}"


def test_the_same_source_is_derived_once_per_key() -> None:
    derive = Counted()
    remembered = Remembered(derive)
    source = ("view", ("192.0.2.1",))
    assert remembered("vm-1", source) == remembered("vm-1", source)
    remembered("vm-2", source)
    assert derive.calls == [source, source]


def test_a_changed_source_is_derived_again_and_an_equal_one_is_not() -> None:
    derive = Counted()
    remembered = Remembered(derive)
    remembered("vm-1", {"state": "running"})
    remembered("vm-1", {"state": "running"})  # another object, equal: its value still holds
    assert remembered("vm-1", {"state": "shut off"}) == "derived from {'state': 'shut off'}"
    assert derive.calls == [{"state": "running"}, {"state": "shut off"}]


def test_past_its_bound_everything_is_forgotten_at_once() -> None:
    derive = Counted()
    remembered = Remembered(derive, max_keys=2)
    for key in ("a", "b", "c"):  # "c" finds two held: both forgotten, "c" kept
        remembered(key, 1)
    remembered("c", 1)
    remembered("a", 1)
    assert len(derive.calls) == 4
