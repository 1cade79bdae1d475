"""detlab: where two training runs that should be bit-identical part, and what reproducibility costs.

`import detlab` is light: `detlab.Recorder` (docs/sdk.md) loads the SDK, and torch, when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detlab.sdk.recorder import Recorder

__all__ = ["Recorder"]


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        from detlab.sdk.recorder import Recorder

        return Recorder
    raise AttributeError(f"module 'detlab' has no attribute {name!r}")
