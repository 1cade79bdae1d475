"""Waiting on a condition instead of sleeping a fixed time: the tests' one polling loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float, what: str = "the condition", interval: float = 0.1,
               explain: Callable[[], str] | None = None) -> T:
    """`check()`'s first truthy answer, asked every `interval` s; past `timeout`, a TimeoutError naming `what`
    (with `explain()`'s text, e.g. the logs of the processes waited on)."""
    deadline = time.monotonic() + timeout
    while True:
        if found := check():
            return found
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not seen in {timeout} s" + (f"\n{explain()}" if explain else ""))
        time.sleep(interval)


def wait_steady(read: Callable[[], T], timeout: float, steady_s: float, what: str = "the value",
                explain: Callable[[], str] | None = None) -> T:
    """`read()`'s value once it has not changed for `steady_s` s (a process that stopped writing)."""
    value, since = read(), time.monotonic()

    def unchanged() -> bool:
        nonlocal value, since
        now = read()
        if now != value:
            value, since = now, time.monotonic()
        return time.monotonic() - since >= steady_s

    wait_until(unchanged, timeout, f"{what} steady for {steady_s} s", interval=min(0.1, steady_s / 5), explain=explain)
    return value
