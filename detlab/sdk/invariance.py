"""`detlab.batch_invariance(model, forward, samples)`: the model check of `detlab batch-invariance`, on the user's
own model, in this process.

Sample 0's output of every module call, alone and as the first row of batches of each size, compared bit for bit
(detlab.tensors.batch_invariance, the engine the CLI's rank runs); the first module whose output differs names
where invariance breaks. The result is the dict `detlab batch-invariance --json` prints (its op cells empty).

Under a worker's batch-invariance job of a registered script (DETLAB_KIND=batch-invariance, DETLAB_RUN_DIR), the
job decides: its op cells run too, with its batch sizes, and its config's torch flags and seed are in effect; the
rank's records (its stack, then one per cell and batch size) are written to DETLAB_RUN_DIR/rank<RANK>.jsonl for
the worker to send, as the built-in workloads' rank writes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from detlab.core import diagnosis
from detlab.core.configs import TorchFlags
from detlab.core.wire import DiagnosisSpec


class _Given:
    """The model check's view of the user's samples and forward (detlab.tensors.batch_invariance.Workload)."""

    def __init__(self, name: str, samples: tuple[Any, ...], forward: Callable[[Any, tuple[Any, ...]], Any]) -> None:
        self.name, self.samples, self.forward = name, samples, forward

    def batch(self, step: int, seed: int, device: Any) -> tuple[Any, ...]:
        return tuple(t.to(device) for t in self.samples)

    def loss(self, model: Any, batch: tuple[Any, ...]) -> Any:
        return self.forward(model, batch)


def batch_invariance(model: Any, forward: Callable[[Any, tuple[Any, ...]], Any], samples: Any, *,
                     batch_sizes: Sequence[int] = diagnosis.DEFAULT_BATCH_SIZES) -> dict[str, Any]:
    """Check `model` for batch invariance: `forward(model, batch)` runs it on `batch`, a tuple of tensors whose first
    dimension is samples (the first b rows of `samples`, a tensor or a tuple of them, for each size b).

    `samples` must hold at least max(batch_sizes) rows. The model is put in eval mode. Returns `{"results": [],
    "summary": [], "device", "tf32", "model": {"workload", "batch_sizes", "invariant", "first_module",
    "first_break"}}`, as `detlab batch-invariance --json` prints. Raises ValueError for a bad argument.
    """
    import torch

    from detlab.tensors.batch_invariance import model_invariance, op_invariance

    if not isinstance(model, torch.nn.Module) or not callable(forward):
        raise ValueError("detlab.batch_invariance: pass a torch.nn.Module and forward(model, batch)")
    given = tuple(samples) if isinstance(samples, tuple | list) else (samples,)
    if not given or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in given):
        raise ValueError("detlab.batch_invariance: samples is a tensor or a tuple of tensors, samples first")
    job = _worker_job()
    spec = DiagnosisSpec.model_validate_json(job["DETLAB_DIAGNOSIS"]) if job else None
    sizes = sorted(set(spec.batch_sizes if spec else batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError("detlab.batch_invariance: batch sizes are whole numbers from 1")
    if min(t.shape[0] for t in given) < sizes[-1]:
        raise ValueError(f"detlab.batch_invariance: samples hold {min(t.shape[0] for t in given)} rows; the largest "
                         f"batch size is {sizes[-1]}: give at least that many")
    seed = int(job.get("DETLAB_SEED", "0")) if job else 0
    if job and (flags := job.get("DETLAB_TORCH_FLAGS")):
        from detlab.tensors.stack import apply_torch_flags

        apply_torch_flags(TorchFlags.model_validate_json(flags))
    param = next(model.parameters(), None)
    device = param.device if param is not None else given[0].device
    name = job["DETLAB_WORKLOAD"] if job else type(model).__name__
    workload = _Given(name, tuple(t[: sizes[-1]] for t in given), forward)
    cells, rows = [], []
    with _Spool(Path(job["DETLAB_RUN_DIR"]) if job else None, device) as spool:
        if spec is not None:  # the job's op cells, as the built-in rank measures them
            for cell in op_invariance(spec.ops, spec.dtypes, spec.batch_sizes, spec.features, device, seed):
                spool.write(cell)
                cells.append(cell.model_dump())
        for row in model_invariance(workload, model, sizes, device, seed):
            spool.write(row)
            rows.append(row.model_dump())
    return {**diagnosis.invariance_json(cells), "device": _device_name(device),
            "tf32": bool(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32),
            "model": diagnosis.model_summary(rows)}


def _device_name(device: Any) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def _worker_job() -> dict[str, str] | None:
    """The worker's batch-invariance job this process is a rank of (its DETLAB_* variables), or None."""
    if os.environ.get("DETLAB_KIND") != "batch-invariance" or not os.environ.get("DETLAB_RUN_DIR"):
        return None
    if not os.environ.get("DETLAB_DIAGNOSIS"):
        raise RuntimeError("detlab.batch_invariance: DETLAB_KIND=batch-invariance without DETLAB_DIAGNOSIS")
    return {k: v for k, v in os.environ.items() if k.startswith("DETLAB_")}


class _Spool:
    """Under a worker's job, the rank's records: its stack first, then each as measured; elsewhere nothing."""

    def __init__(self, folder: Path | None, device: Any) -> None:
        self.folder, self.device = folder, device
        self.file: Any = None

    def __enter__(self) -> _Spool:
        if self.folder is not None:
            from detlab.tensors.stack import env_record

            rank = int(os.environ.get("RANK", "0"))
            # O_EXCL: a second call (or a Recorder) in the same run never mixes into these records
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            self.file = os.fdopen(os.open(self.folder / f"rank{rank}.jsonl", flags, 0o600), "w")
            self.write(env_record(rank, self.device, "none"))
        return self

    def write(self, record: Any) -> None:
        if self.file is not None:
            self.file.write(record.model_dump_json() + "\n")
            self.file.flush()

    def __exit__(self, *_exc: object) -> None:
        if self.file is not None:
            self.file.close()
