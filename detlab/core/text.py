"""Storable text: strings every database and JSON encoder here can keep.

PostgreSQL refuses NUL (U+0000) in text columns and no UTF-8 encoder takes a lone surrogate
(U+D800-U+DFFF, which Python's `json.loads` lets through from a `\\ud800` escape). A string with
either is refused at the edge, with a 422 naming the field, rather than at the insert with a 500.
Pure: no server, no database.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_error(value: str) -> str | None:
    """Why `value` cannot be stored, or None when it can."""
    if value.isascii() and "\x00" not in value:  # no surrogate is ASCII; both tests run in C, no regex scan
        return None
    found = UNSTORABLE.search(value)
    if found is None:
        return None
    char = found.group()
    what = "a NUL character (\\u0000)" if char == "\x00" else f"a lone surrogate (\\u{ord(char):04x})"
    return f"contains {what} at position {found.start()}; send valid UTF-8 text without NUL"


def escaped(value: str) -> str:
    """`value` with NUL and lone surrogates written as \\uXXXX escapes: safe to echo in an error message."""
    return UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", value)


def _storable(value: str) -> str:
    problem = text_error(value)
    if problem:
        raise ValueError(problem)
    return value


StorableText = Annotated[str, AfterValidator(_storable)]


def _first_unstorable(value: Any) -> str | None:
    # Iterative: a body nested as deep as the JSON parser allows must not exhaust the stack here.
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if problem := text_error(item):
                return f"{path} {problem}" if path else problem
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                where = f"{path}.{escaped(str(key))}" if path else escaped(str(key))
                if isinstance(key, str) and (problem := text_error(key)):
                    return f"key {where} {problem}"
                stack.append((where, child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}.{i}" if path else str(i), child) for i, child in reversed(list(enumerate(item))))
    return None


def storable(value: Any) -> Any:
    """A field validator for any JSON-like value: every string in it, keys included, must be storable.

    Models use it for all their fields at once, `_text = field_validator("*")(storable)`; nested models
    check their own fields, so they are not walked again."""
    problem = _first_unstorable(value)
    if problem:
        raise ValueError(problem)
    return value
