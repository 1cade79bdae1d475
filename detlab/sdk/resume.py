"""What a recording holds of one rank when a new process continues it (Recorder(resume=True)): its manifest, its
tensor list, its last recorded step and the segment the new process writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from detlab.core.shards import ABSENT
from detlab.core.wire import StepRecord, TensorsRecord
from detlab.sdk import store

__all__ = ["ABSENT", "Resumed", "read_resumed"]


@dataclass(frozen=True)
class Resumed:
    manifest: store.Manifest
    tensors: list[tuple[str, list[int], str]]
    last_step: int
    segment: int  # the one the new process writes: one past the file's highest


def read_resumed(out: Path, rank: int) -> Resumed:
    """This rank's part of the recording in `out`, to continue it; a clear error where there is none to continue.
    A last line cut short (the process died writing it) is cut off, so that appending keeps the file whole."""
    path = store.rank_path(out, rank)
    if not (out / store.MANIFEST).exists() or not path.exists():
        raise FileNotFoundError(f"resume=True: {out} holds no recording of rank {rank} to continue; record the first "
                                "run there without resume=True (or give the directory it recorded to)")
    manifest = store.read_manifest(out)
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
    tensors: TensorsRecord | None = None
    last, segment = None, 0
    for rec in store.read_records(path):
        if isinstance(rec, TensorsRecord):
            tensors = rec
        elif isinstance(rec, StepRecord):
            last, segment = max(rec.step, last if last is not None else -1), max(segment, rec.segment)
    if tensors is None or last is None:
        raise ValueError(f"resume=True: {path} holds no recorded step to continue from; record the first run to "
                         "its first step before resuming it")
    return Resumed(manifest=manifest, tensors=[(t.name, list(t.shape), t.dtype) for t in tensors.tensors],
                   last_step=last, segment=segment + 1)
