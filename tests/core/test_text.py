"""Unit tests of detlab.core.text: what a database cannot store is found, named and escaped."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from detlab.core.text import StorableText, escaped, storable, text_error


@pytest.mark.parametrize("value, fragment", [("a\x00b", "NUL character (\\u0000) at position 1"),
                                             ("ab\ud800", "lone surrogate (\\ud800) at position 2"),
                                             ("\udfff", "lone surrogate (\\udfff) at position 0")])
def test_text_error_names_the_character_and_where(value: str, fragment: str) -> None:
    problem = text_error(value)
    assert problem is not None and fragment in problem


@pytest.mark.parametrize("value", ["", "plain", "ünïcödé ✓", "\U0001f600", "tab\tand\nnewline"])
def test_text_error_passes_storable_text(value: str) -> None:
    assert text_error(value) is None


def test_escaped_writes_what_cannot_be_stored_as_escapes() -> None:
    assert escaped("a\x00b\ud800c") == "a\\u0000b\\ud800c"


def test_storable_names_the_path_of_the_first_bad_string_in_a_tree() -> None:
    with pytest.raises(ValueError, match=r"^env\.NCCL_ALGO contains a NUL"):
        storable({"name": "x", "env": {"NCCL_ALGO": "Ring\x00"}})
    with pytest.raises(ValueError, match=r"^key 0\.a\\ud800 contains a lone surrogate"):
        storable([{"a\ud800": 1}])
    assert storable({"a": [1, 2.5, None, "ok"]}) == {"a": [1, 2.5, None, "ok"]}


def test_storable_walks_a_tree_as_deep_as_a_json_parser_allows() -> None:
    deep: list = ["x\x00"]
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match="NUL"):
        storable(deep)


class Body(BaseModel):
    name: StorableText
    meta: dict[str, str] = {}
    _text = field_validator("meta")(storable)


def test_a_model_refuses_unstorable_text_naming_the_field() -> None:
    with pytest.raises(ValidationError) as exc:
        Body(name="a\x00")
    assert exc.value.errors()[0]["loc"] == ("name",)
    with pytest.raises(ValidationError) as exc:
        Body(name="a", meta={"k": "\x00"})
    assert exc.value.errors()[0]["loc"] == ("meta",) and "k contains a NUL" in exc.value.errors()[0]["msg"]
