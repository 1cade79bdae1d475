"""detlab: where two training runs that should be bit-identical part, and what reproducibility costs.

`import detlab` is light: `detlab.Recorder`, `detlab.audit` and `detlab.batch_invariance` (docs/sdk.md) load the
SDK, and torch, when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detlab.sdk.audit import audit
    from detlab.sdk.invariance import batch_invariance
    from detlab.sdk.recorder import Recorder

__all__ = ["Recorder", "audit", "batch_invariance"]


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
    raise AttributeError(f"module 'detlab' has no attribute {name!r}")
