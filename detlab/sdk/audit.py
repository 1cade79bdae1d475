"""`detlab.audit(step)`: the op audit of `detlab audit`, on the user's own step function, in this process.

The step runs once under the audit engine (detlab.tensors.audit, the one the CLI's rank runs); every aten op it
called is then checked: PyTorch's alert, and re-runs of its first calls on copies of their inputs, each run from
the random state the call saw (generators passed as arguments and the default CPU and CUDA ones), so a draw is
the same draw each time and never counts as nondeterminism. The result is the dict `detlab audit --json` prints.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from pydantic import ValidationError

from detlab.core import diagnosis
from detlab.core.wire import DiagnosisSpec, explain


def _device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def audit(fn: Callable[[], Any], *, reruns: int = diagnosis.DEFAULT_RERUNS, device: Any = None,
          calls_per_op: int = diagnosis.DEFAULT_CALLS_PER_OP) -> dict[str, Any]:
    """Audit one call of `fn` (a training step taking no arguments: forward, backward, optimizer step).

    `fn` runs once (so a model it trains takes one step); then each op's first `calls_per_op` calls run `reruns`
    times more on copies of their inputs. `device`: the CUDA device `fn` runs on (made current while it runs) or
    "cpu"; None means the current CUDA device if `fn` used CUDA, else the CPU. Returns `{"ops": [{"op", "count",
    "nondeterministic", "evidence"}, ...], "ineffective", "workload" (fn's name), "device", "threads",
    "torch_flags"}`, as `detlab audit --json` prints. Raises ValueError for a bad argument.
    """
    import torch

    from detlab.tensors.audit import audit_step
    from detlab.tensors.stack import effective_torch_flags

    if not callable(fn):
        raise ValueError(f"detlab.audit: fn must be a callable taking no arguments (a training step), "
                         f"not {type(fn).__name__}")
    try:
        spec = DiagnosisSpec(reruns=reruns, calls_per_op=calls_per_op)
    except ValidationError as exc:
        raise ValueError(f"detlab.audit: {explain(exc, 'audit')}") from exc
    where = torch.device(device) if device is not None else None
    if where is not None and where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("detlab.audit: device cuda but no CUDA GPU is visible; pass device='cpu'")
    if where is not None and where.type not in ("cpu", "cuda"):
        raise ValueError(f"detlab.audit: device must be 'cpu' or a CUDA device, not {device!r}")
    with torch.cuda.device(where) if where is not None and where.type == "cuda" else nullcontext():
        rows = [r.model_dump() for r in audit_step(fn, spec.reruns, spec.calls_per_op)]
        if where is None:
            used_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            where = torch.device("cuda", torch.cuda.current_device()) if used_cuda else torch.device("cpu")
    flags = effective_torch_flags()
    return diagnosis.audit_report(
        rows, claims_determinism=flags.deterministic_algorithms, workload=getattr(fn, "__qualname__", None),
        device=_device_name(where), threads=flags.num_threads, torch_flags=flags.model_dump())

