"""`detlab.audit(step)`: the op audit of `detlab audit`, on the user's own step function, in this process.

The step runs once under the audit engine (detlab.tensors.audit, the one the CLI's rank runs); every aten op it
called is then checked: PyTorch's alert, and re-runs of its first calls on copies of their inputs, each run from
the random state the call saw (generators passed as arguments and the default CPU and CUDA ones), so a draw is
the same draw each time and never counts as nondeterminism. The result is the dict `detlab audit --json` prints.

Under a worker's op-audit job of a registered script (DETLAB_KIND=op-audit, DETLAB_RUN_DIR), the job decides:
its re-runs and calls per op (DETLAB_DIAGNOSIS) replace the arguments, its config's torch flags
(DETLAB_TORCH_FLAGS) are in effect while the step runs, and the rank's records (its stack, then one per op) are
written to DETLAB_RUN_DIR/rank<RANK>.jsonl for the worker to send, as the built-in workloads' audit rank writes them.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from detlab.core import diagnosis
from detlab.core.configs import TorchFlags
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
    job = _worker_job()
    if job is not None:
        spec = DiagnosisSpec.model_validate_json(job["DETLAB_DIAGNOSIS"])
        if flags_json := job.get("DETLAB_TORCH_FLAGS"):
            from detlab.tensors.stack import apply_torch_flags

            apply_torch_flags(TorchFlags.model_validate_json(flags_json))
    where = torch.device(device) if device is not None else None
    if where is not None and where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("detlab.audit: device cuda but no CUDA GPU is visible; pass device='cpu'")
    if where is not None and where.type not in ("cpu", "cuda"):
        raise ValueError(f"detlab.audit: device must be 'cpu' or a CUDA device, not {device!r}")
    folder = Path(job["DETLAB_RUN_DIR"]) if job is not None else None
    with torch.cuda.device(where) if where is not None and where.type == "cuda" else nullcontext(), \
            _Spool(folder) as spool:
        rows = []
        for record in audit_step(fn, spec.reruns, spec.calls_per_op):
            if where is None:  # the step has run: where it ran is known
                used_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
                where = torch.device("cuda", torch.cuda.current_device()) if used_cuda else torch.device("cpu")
            spool.write(record, where)
            rows.append(record.model_dump())
        if where is None:  # a step that ran no op
            where = torch.device("cpu")
    flags = effective_torch_flags()
    return diagnosis.audit_report(
        rows, claims_determinism=flags.deterministic_algorithms, workload=getattr(fn, "__qualname__", None),
        device=_device_name(where), threads=flags.num_threads, torch_flags=flags.model_dump())



def _worker_job() -> dict[str, str] | None:
    """The worker's op-audit job this process is a rank of (its DETLAB_* variables), or None."""
    if os.environ.get("DETLAB_KIND") != "op-audit" or not os.environ.get("DETLAB_RUN_DIR"):
        return None
    if not os.environ.get("DETLAB_DIAGNOSIS"):
        raise RuntimeError("detlab.audit: DETLAB_KIND=op-audit without DETLAB_DIAGNOSIS: not a worker's run")
    return {k: v for k, v in os.environ.items() if k.startswith("DETLAB_")}


class _Spool:
    """Under a worker's job, the rank's records as detlab.worker.ranks.diagnose writes them: its stack, then one
    per op as each is checked (the worker's hang timeout runs between records); elsewhere nothing."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.file: Any = None

    def __enter__(self) -> _Spool:
        if self.folder is not None:
            self.rank = int(os.environ.get("RANK", "0"))
            # O_EXCL: a second detlab.audit (or a Recorder) in the same run never mixes into these records
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            self.file = os.fdopen(os.open(self.folder / f"rank{self.rank}.jsonl", flags, 0o600), "w")
        return self

    def write(self, record: Any, device: Any) -> None:
        if self.file is None:
            return
        if self.file.tell() == 0:
            from detlab.tensors.stack import env_record

            self.file.write(env_record(self.rank, device, "none").model_dump_json() + "\n")
        self.file.write(record.model_dump_json() + "\n")
        self.file.flush()

    def __exit__(self, *_exc: object) -> None:
        if self.file is not None:
            self.file.close()
