"""A record directory, as the SDK writes it and `detlab compare` reads it: no torch.

    DIR/run.json       the run's manifest (rank 0 writes it): name, tags, world size, fp version, status
    DIR/rank<r>.jsonl  one wire record (detlab.core.wire) per line, written by rank r: its `env` record,
                       its `tensors` record (index -> name, shape, dtype; the DTensors' placements and
                       which ranks hold replicas), then one `step` record per recorded step, appended and
                       flushed as they come

Each rank's list is its own: a sharded model's ranks hold different shards, compared rank by rank.

`load_run` turns a directory into the comparison's `RunData`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from detlab.core.collective_calls import RunCalls, StepCalls
from detlab.core.runs import RunData, StepData, resumed
from detlab.core.shards import DIGEST_BYTES, RankTensor
from detlab.core.wire import (
    DIAGNOSIS_RECORDS,
    MAX_WORLD_SIZE,
    RECORD,
    CallsRecord,
    EnvRecord,
    Placement,
    StepRecord,
    TensorsRecord,
    TrialRecord,
    explain,
)

MANIFEST = "run.json"
RANK_FILE = re.compile(r"^rank(0|[1-9][0-9]*)\.jsonl$")
# What the comparison calls the workload of every SDK run: their tensor lists are what must match.
WORKLOAD = "sdk"


class RecordsError(ValueError):
    """A record directory that cannot be read; the message names the path and what to do."""


class Manifest(BaseModel):
    """run.json: what the run is and whether it closed."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["detlab-records/1"] = "detlab-records/1"
    # The recording's id (run.json of recordings made before ids were written lacks it): a server stores the
    # recording under it, so streaming it and uploading it (twice, even) land on one run.
    id: str | None = Field(default=None, min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    name: str | None = Field(default=None, max_length=255)
    tags: list[str] = Field(default_factory=list, max_length=64)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    fp_version: str
    every: int = Field(ge=1)
    # running: started, not closed (still going, or crashed); failed: closed by an exception
    status: Literal["running", "finished", "failed"] = "running"
    started: datetime
    finished: datetime | None = None


def rank_path(out: Path, rank: int) -> Path:
    """Where rank `rank` writes its records."""
    return out / f"rank{rank}.jsonl"


def now() -> datetime:
    """The manifest's clock: UTC."""
    return datetime.now(UTC)


def write_manifest(out: Path, manifest: Manifest) -> None:
    """Replace run.json atomically (a reader never sees half a manifest)."""
    tmp = out / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n")
    tmp.replace(out / MANIFEST)


def read_manifest(out: Path) -> Manifest:
    """run.json of a record directory; RecordsError when it is missing or not a manifest."""
    path = out / MANIFEST
    if not out.is_dir():
        what = "not a directory" if out.exists() else "no such directory"
        raise RecordsError(f"{out}: {what}; give a directory that detlab.Recorder(out=...) wrote")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordsError(f"{out}: not a detlab record directory (no {MANIFEST}); give a directory that "
                           "detlab.Recorder(out=...) wrote") from None
    except OSError as exc:
        raise RecordsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        raise RecordsError(f"{path}: not a detlab run manifest: {explain(exc)}") from None


def rank_files(out: Path) -> dict[int, Path]:
    """rank -> its record file, for the rank files present."""
    try:
        return {int(m.group(1)): p for p in out.iterdir() if (m := RANK_FILE.match(p.name))}
    except OSError as exc:
        raise RecordsError(f"{out}: cannot list: {exc.strerror or exc}") from None


Line = EnvRecord | TensorsRecord | StepRecord | TrialRecord | CallsRecord


def read_records(path: Path) -> Iterator[Line]:
    """The records of one rank file. A last line cut short (the rank died while writing it) is skipped;
    any other bad line is an error naming the file and line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RecordsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = RECORD.validate_json(line)
        except ValidationError as exc:
            if number == len(lines):  # no newline after it: a torn write
                return
            raise RecordsError(f"{path}:{number}: not a detlab record: {explain(exc)}") from None
        if isinstance(record, DIAGNOSIS_RECORDS):
            raise RecordsError(f"{path}:{number}: a diagnosis result ({record.type}), not a training run's record")
        yield record


def placement_text(placement: Placement) -> str:
    """A DTensor's layout in one line, as the comparison shows it: `Shard(dim=0) on mesh [2] at [1], offset
    [8, 0] of [15, 8]`."""
    text = f"{', '.join(placement.placements)} on mesh {placement.mesh_shape} at {placement.coordinate}"
    if placement.offset is not None:
        text += f", offset {placement.offset}"
    return f"{text} of {placement.global_shape}"


def rank_tensors(rec: TensorsRecord) -> list[RankTensor]:
    """One rank's tensors record as the comparison reads it: name, local shape, dtype, placement, replicas."""
    layouts = {layout.index: layout for layout in rec.layouts}
    out = []
    for t in rec.tensors:
        layout = layouts.get(t.index)
        placement = layout.placement if layout is not None else None
        out.append(RankTensor(t.name, list(t.shape), t.dtype, placement_text(placement) if placement else "",
                              layout.replica_of if layout is not None else None))
    return out


def load_run(out: Path, run_id: int = 1) -> RunData:
    """A record directory as the comparison's RunData (run `run_id` in the verdict's messages)."""
    manifest = read_manifest(out)
    files = rank_files(out)
    outside = sorted(r for r in files if r >= manifest.world_size)
    if outside:
        raise RecordsError(f"{out}: rank file(s) {outside} lie outside the run's world size "
                           f"{manifest.world_size}; the directory mixes recordings: record into a fresh one")
    tensors: dict[int, list[RankTensor]] = {}
    components: dict[str, str] = {}
    records: dict[tuple[int, int, int], StepData] = {}  # (step, rank, segment): a resumed recording has several
    versions: set[str] = set()
    positions: dict[int, dict[str, int]] = {}
    preflight: dict[int, list[dict[str, Any]]] = {}
    calls: RunCalls = {}
    for rank, path in sorted(files.items()):
        for rec in read_records(path):
            if isinstance(rec, EnvRecord):
                if rec.position is not None:
                    positions[rank] = rec.position
                if rec.preflight is not None:
                    preflight[rank] = [f.model_dump() for f in rec.preflight]
            elif isinstance(rec, CallsRecord):
                calls[(rec.step, rank)] = step_calls(rec)
            elif isinstance(rec, TensorsRecord):
                tensors[rank] = rank_tensors(rec)
                components.update({t.name: t.component for t in rec.tensors if t.component})
            elif isinstance(rec, StepRecord):
                if rec.rank != rank:
                    raise RecordsError(f"{path}: holds a step record of rank {rec.rank}; each rank writes its own file")
                if (rec.step, rank, rec.segment) in records:
                    raise RecordsError(f"{path}: step {rec.step} is recorded twice; the directory mixes "
                                       "recordings: record into a fresh one")
                drift = rec.drift
                records[(rec.step, rank, rec.segment)] = StepData(
                    digests=bytes.fromhex(rec.digests), loss=rec.loss, step_time_s=rec.step_time_s,
                    model_digest=rec.model_digest, drift_version=drift.version if drift else None,
                    stats=bytes.fromhex(drift.stats) if drift else None,
                    sketch=bytes.fromhex(drift.sketch) if drift else None,
                    state=rec.state.model_dump(exclude_none=True) if rec.state else None, restored=rec.restored)
                versions.add(rec.fp_version)
    for (step, rank, _), data in records.items():
        if rank not in tensors:
            raise RecordsError(f"{rank_path(out, rank)}: has step records but no tensors record")
        if data.digests is not None and len(data.digests) != DIGEST_BYTES * len(tensors[rank]):
            raise RecordsError(f"{rank_path(out, rank)}: step {step} holds {len(data.digests) // DIGEST_BYTES} "
                               f"digests for {len(tensors[rank])} tensors; the file is damaged or mixes recordings: "
                               "record into a fresh one")
    status = {"finished": "succeeded", "failed": "failed (closed by an exception)",
              "running": "did not close (crashed, still running, or rec.close() was not called)"}[manifest.status]
    current, saved = resumed(records)
    return RunData(run_id=run_id, workload=WORKLOAD, world_size=manifest.world_size,
                   tensors=[(t.name, t.shape, t.dtype) for t in tensors[min(tensors)]] if tensors else [],
                   records=current, fp_versions=versions or {manifest.fp_version}, status=status, rank_tensors=tensors,
                   positions=positions, calls=calls, preflight=preflight, components=components, saved=saved)


def step_calls(rec: CallsRecord) -> StepCalls:
    """A `calls` record as the comparison reads it (detlab.core.collective_calls)."""
    return StepCalls(calls=[(c.op, c.dtype, c.count, c.group_size) for c in rec.calls],
                     inputs=bytes.fromhex(rec.inputs), outputs=bytes.fromhex(rec.outputs), unread=frozenset(rec.unread))
