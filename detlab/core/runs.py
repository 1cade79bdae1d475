"""The recorded data of one run as a comparison reads it: per (step, rank) digests, loss, time and drift
statistics, its tensor list, rank positions and collective calls. Plain data; no database."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from detlab.core import collective_calls
from detlab.core.shards import RankTensor


@dataclass(slots=True)
class StepData:
    digests: bytes | None  # DIGEST_BYTES per tensor in tensor-index order; None when not loaded
    loss: float | None
    step_time_s: float
    model_digest: str | None = None  # digest of `digests`: enough to tell equal from different
    # Drift statistics (detlab.core.sketch): the version when the step has them; stats and sketch once loaded.
    drift_version: str | None = None
    stats: bytes | None = None
    sketch: bytes | None = None
    # What the step recorded beside its tensors (wire.StepState as a dict: component -> name -> value); None: nothing.
    state: dict[str, dict[str, str]] | None = None
    restored: bool = False  # the restored state of a resumed recording (its gradients are not part of it)
    segment: int = 0  # the process of a resumed recording that made it (0: the first)

    def key(self) -> str | bytes | None:
        return self.model_digest if self.model_digest is not None else self.digests


@dataclass
class RunData:
    run_id: int
    workload: str
    world_size: int
    tensors: list[tuple[str, list[int], str]]  # (name, shape, dtype) by index
    records: dict[tuple[int, int], StepData] = field(default_factory=dict)  # (step, rank) -> data
    fp_versions: set[str] = field(default_factory=set)  # versions seen (empty: unknown); others never compare
    # What the run was meant to record (None: unknown, judged against the other run only) and how it ended.
    expected_steps: list[int] | None = None
    status: str | None = None
    # SDK recordings: each rank's own list, with DTensor placements and replicas (detlab.core.shards). Empty:
    # every rank recorded `tensors`, and nothing is known of replicas.
    rank_tensors: dict[int, list[RankTensor]] = field(default_factory=dict)
    # rank -> its logical position ({"dp": 0, "tp": 1}); empty: not recorded (ranks meet by number).
    positions: dict[int, dict[str, int]] = field(default_factory=dict)
    rank_note: str | None = None  # set when its ranks were renumbered to meet another run's (line_up)
    # Per (step, rank): the collective calls it recorded (detlab.core.collective_calls); empty: none recorded.
    calls: collective_calls.RunCalls = field(default_factory=dict)
    comm_logs: list[dict[str, Any]] | None = None  # its ranks' parsed NCCL/RCCL logs; None: none recorded
    # rank -> the preflight findings on its process (wire.PreflightFinding as dicts); a rank absent: not checked.
    preflight: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    # tensor name -> its component (parameters, buffers, optimizer, gradients); a name not in it: by its name.
    components: dict[str, str] = field(default_factory=dict)
    # A resumed recording: per (step, rank) of each restore, the record of that step made before it (the saved
    # state the restore should give back). `records` holds the restored record there, and after it the records of
    # the process that continued.
    saved: dict[tuple[int, int], StepData] = field(default_factory=dict)
    # steps() and ranks() are asked once per step of a comparison: cached while `records` keeps its size.
    _cache: dict[str, tuple[int, list[int]]] = field(default_factory=dict, repr=False, compare=False)

    def _keys(self, part: int) -> list[int]:
        name = "steps" if part == 0 else "ranks"
        size, found = self._cache.get(name, (-1, []))
        if size != len(self.records):
            found = sorted({key[part] for key in self.records})
            self._cache[name] = (len(self.records), found)
        return found

    def steps(self) -> list[int]:
        return self._keys(0)

    def ranks(self) -> list[int]:
        return self._keys(1)

    def at(self, step: int, ranks: list[int]) -> list[StepData]:
        return [d for r in ranks if (d := self.records.get((step, r))) is not None]


def component_of(run: RunData, name: str) -> str:
    """Which part of the training state a recorded tensor is (recordings from before components were: by name)."""
    return run.components.get(name) or ("gradients" if name.endswith(".grad") else "parameters")


def resumed(segments: dict[tuple[int, int, int], StepData]) -> tuple[dict[tuple[int, int], StepData],
                                                                      dict[tuple[int, int], StepData]]:
    """A recording's records by (step, rank, segment) as the comparison reads them: per rank, each later segment
    takes over from its first step on (the earlier segment's records from there on are a timeline that the restore
    abandoned), its restored record standing at the restored step. Returns (records, saved): `saved` holds, at each
    restored step, the record the earlier segment made of it."""
    starts: dict[tuple[int, int], int] = {}  # (rank, segment) -> its first step
    for step, rank, segment in segments:
        starts[(rank, segment)] = min(step, starts.get((rank, segment), step))
    records: dict[tuple[int, int], StepData] = {}
    saved: dict[tuple[int, int], StepData] = {}
    for (step, rank, segment), data in sorted(segments.items(), key=lambda kv: kv[0][2]):
        later = [s for (r, s), first in starts.items() if r == rank and s > segment and first <= step]
        if later:
            if data.restored is False and any(starts[(rank, s)] == step and segments[(step, rank, s)].restored
                                              for s in later):
                saved[(step, rank)] = data
            continue
        records[(step, rank)] = data
    return records, saved


def mean_loss(run: RunData, step: int) -> float | None:
    # Ranks hold equal slices of a fixed global batch, so the mean of rank losses is the global loss.
    losses = [loss for r in run.ranks() if (step, r) in run.records
              and (loss := run.records[(step, r)].loss) is not None]
    return math.fsum(losses) / len(losses) if losses else None  # statistics.fmean, without its overhead


def recorded_steps(steps: int, interval: int) -> list[int]:
    """The steps a train run fingerprints: 0 (the initial weights), every `interval`-th, and the last."""
    return [0, *(s for s in range(1, steps + 1) if s % interval == 0 or s == steps)]
