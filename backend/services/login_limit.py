"""The brakes on password logins: wrong attempts per account and per client address within a sliding
window, and how many password hashes run at once (each argon2id check holds 64 MiB)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from detlab.core.settings import Settings

MAX_KEYS = 100_000  # accounts and addresses tracked at most; the oldest are forgotten first (memory stays bounded)


class Busy(RuntimeError):
    """Every hashing slot stayed taken for the whole wait."""


class LoginLimiter:
    """Counts wrong logins per account and per address (one process; a restart forgets them) and gates the
    password hashing. Thread-safe: the login route runs in the thread pool."""

    def __init__(self, *, per_account: int, per_address: int, window_s: float, hashes: int,
                 wait_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.wait_s = wait_s  # how long a login waits for a hashing slot before it is told to come back
        self.limits = {"account": per_account, "address": per_address}
        self.window_s, self.clock = window_s, clock
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()
        self._hashing = threading.BoundedSemaphore(hashes)

    @classmethod
    def from_settings(cls, settings: Settings) -> LoginLimiter:
        return cls(per_account=settings.login_failures_per_account, per_address=settings.login_failures_per_address,
                   window_s=settings.login_window_s, hashes=settings.login_concurrent_hashes)

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        times = self._failures.get(key, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def retry_after(self, *, account: str, address: str) -> float | None:
        """Seconds until a login for `account` from `address` is heard again, or None when it is heard now."""
        now = self.clock()
        waits = []
        with self._lock:
            for key in (("account", account), ("address", address)):
                times = self._recent(key, now)
                if len(times) >= self.limits[key[0]]:
                    waits.append(times[0] + self.window_s - now)
        return max(waits) if waits else None

    def failed(self, *, account: str, address: str) -> None:
        now = self.clock()
        with self._lock:
            for key in (("account", account), ("address", address)):
                times = self._recent(key, now)
                times.append(now)
                self._failures[key] = times
                self._failures.move_to_end(key)
            while len(self._failures) > MAX_KEYS:
                self._failures.popitem(last=False)

    def succeeded(self, *, account: str) -> None:
        """A correct password clears its account's count (not its address's: one address, many guesses)."""
        with self._lock:
            self._failures.pop(("account", account), None)

    @contextmanager
    def hashing(self) -> Iterator[None]:
        """Hold one of the hashing slots; Busy when none frees up within `wait_s`."""
        if not self._hashing.acquire(timeout=self.wait_s):
            raise Busy("too many logins at once")
        try:
            yield
        finally:
            self._hashing.release()
