"""httpx, imported without moving Python's global `random`: its import draws from it, and a Recorder is often made
(so the SDK imported) right after a resumed script restored that generator's state from a checkpoint."""

import random

_users = random.getstate()
import httpx  # noqa: E402

random.setstate(_users)

__all__ = ["httpx"]
