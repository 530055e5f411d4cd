"""Domain values -> provider.v1 messages: what the manager reads back."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from pyrigaud.domain.models import VMDescription
from pyrigaud.domain.power import PowerState
from pyrigaud.entrypoints.grpc.translate import describe_response, flat_json


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"name": "web-1", "cpu": "2", "a": ""},
        {"quote": 'say "hi"', "slash": "C:\\vm\\disk", "lines": "one\ntwo\t\x00\x1f"},
        {"ünï": "çødé ☃ 𝄞", "emoji": "\U0001f600"},
    ],
)
def test_flat_json_is_the_text_json_dumps_gives(values: dict[str, str]) -> None:
    text = flat_json(values)
    assert text == json.dumps(values, sort_keys=True)
    assert json.loads(text) == values


def test_flat_json_writes_any_mapping_not_only_a_dict() -> None:
    values = MappingProxyType({"b": "2", "a": "1"})
    assert flat_json(values) == '{"a": "1", "b": "2"}'


def test_describe_answers_a_flat_object_of_strings_sorted_by_key() -> None:
    description = VMDescription(
        power_state=PowerState.ON, ips=("192.0.2.7",), raw={"state": "running", "id": "x"}
    )
    response = describe_response(description)
    assert response.exists
    assert response.power_state == "On"
    assert list(response.ips) == ["192.0.2.7"]
    assert response.provider_raw_json == '{"id": "x", "state": "running"}'
    assert not describe_response(None).exists
