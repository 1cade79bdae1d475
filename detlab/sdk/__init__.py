"""The SDK: record a training loop's per-step, per-tensor, per-rank fingerprints from the user's own script.

`Recorder` (needs torch, imported when one is made) writes a record directory; `load_run` (no torch) reads
one into the comparison's RunData. docs/sdk.md shows both in use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from detlab.sdk.store import RecordsError, load_run

if TYPE_CHECKING:
    from detlab.sdk.audit import audit
    from detlab.sdk.invariance import batch_invariance
    from detlab.sdk.recorder import Recorder

__all__ = ["Recorder", "audit", "batch_invariance", "RecordsError", "load_run"]


def __getattr__(name: str) -> Any:
    if name == "batch_invariance":
        from detlab.sdk.invariance import batch_invariance

        return batch_invariance
    if name == "audit":
        from detlab.sdk.audit import audit

        return audit
    if name == "Recorder":
        from detlab.sdk.recorder import Recorder

        return Recorder
    raise AttributeError(f"module 'detlab.sdk' has no attribute {name!r}")
