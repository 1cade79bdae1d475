"""Where the one-pass kernel (detlab.tensors.onepass_triton) serves a recorded list, and its results in the
shapes the recorder reads: digests as a `Pending`, drift data as a function giving (stats, sketch) bytes.

It serves a list whose tensors all lie on one CUDA device where the fingerprint's Triton kernel passed its
self-check, are floating (float32, bfloat16, float16, float64), contiguous and aligned. Any other list, or
DETLAB_ONEPASS=0, takes the two passes (detlab.tensors.digests, detlab.tensors.drift): the same digests, and
the same stats and sketches up to float64 rounding.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from detlab.core import sketch
from detlab.tensors.digests import Pending
from detlab.tensors.named import ListKey

if TYPE_CHECKING:
    import torch

Sketched = Callable[[], "tuple[bytes, bytes] | None"]


@functools.cache
def _kernel() -> ModuleType | None:
    try:
        from detlab.tensors import onepass_triton
    except ImportError:  # no Triton: two passes
        return None
    return onepass_triton


class OnePassQueue:
    """The recorder's one-pass queue: `submit` gives (digests, drift) or None where the list is not served."""

    def __init__(self) -> None:
        self._runner: Any = None

    def submit(self, tensors: Sequence[torch.Tensor], key: ListKey | None = None) -> tuple[Pending, Sketched] | None:
        """`key`: the list's ListKey where the caller has it."""
        if not tensors or len(tensors) > sketch.MAX_TENSORS or os.environ.get("DETLAB_ONEPASS") == "0":
            return None
        if key is None:
            import torch

            if tensors[0].device.type != "cuda" or any(t.layout != torch.strided for t in tensors):
                return None
            key = ListKey(tensors)
        device = key.device
        if device is None or device.type != "cuda":
            return None
        from detlab.tensors import fingerprint as fp

        kernel = _kernel()
        if kernel is None or fp.implementation_name(device) != "triton":
            return None
        if self._runner is None:
            self._runner = kernel.OnePass()
        queued = self._runner.submit(tensors, key)  # pointers only: no detach per tensor
        if queued is None:  # a tensor the kernel does not read in place
            return None
        result = _once(queued)
        pending = Pending(len(tensors))
        pending.add(list(range(len(tensors))), lambda: result()[0])

        def drift() -> tuple[bytes, bytes] | None:
            values = result()[1]
            if not np.isfinite(values).all():
                return None
            return sketch.pack(values[:, : sketch.STATS]), sketch.pack(values[:, sketch.STATS :])

        return pending, drift


def _once(read: Callable[[], Any]) -> Callable[[], Any]:
    """`read` called once (it hands its buffers back when done), its value kept for every later call."""
    lock = threading.Lock()
    kept: list[Any] = []

    def get() -> Any:
        with lock:
            if not kept:
                kept.append(read())
            return kept[0]

    return get
