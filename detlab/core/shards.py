"""Tensors that differ by rank (sharded models) and tensors that must not (replicas), over plain data.

A sharded run (FSDP2, tensor parallel: DTensors) records on each rank its own list: the local shards, each
with its placement. Two runs compare rank by rank, shard by shard, and only when every rank's list and
placements match. Within one run, the ranks that hold a replica of a tensor (a DDP model's parameters, a
DTensor's Replicate() mesh dimensions) must hold bit-equal copies at every step: where they do not, the
replicas disagree, whatever the other run did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DIGEST_BYTES = 16
# The digest a record holds for a tensor of its list that the state lacked when it was recorded (a resumed run's
# optimizer state that was not restored; gradients before any backward): no tensor's fingerprint is all zeros.
ABSENT = bytes(DIGEST_BYTES)
# Disagreeing tensors reported per run (those of its first disagreeing step): the rest are counted.
MAX_REPORTED = 20


@dataclass(frozen=True, slots=True)
class RankTensor:
    """One recorded tensor as one rank holds it."""

    name: str
    shape: list[int]  # the local shard's, for a DTensor
    dtype: str
    placement: str = ""  # a DTensor's layout in words; "" for a plain tensor
    # The lowest rank of those that must hold a bit-equal copy (None: none need); not part of the layout.
    replica_of: int | None = field(default=None, compare=False)


def plain(tensors: list[tuple[str, list[int], str]]) -> list[RankTensor]:
    """A (name, shape, dtype) list as RankTensors without placements."""
    return [RankTensor(n, s, d) for n, s, d in tensors]


def list_difference(a: list[RankTensor], b: list[RankTensor]) -> str | None:
    """How two tensor lists differ, in words (None: they do not): names in one only, placements, shapes."""
    if a == b:
        return None
    names_a, names_b = {t.name: t for t in a}, {t.name: t for t in b}
    only = sorted(names_a.keys() ^ names_b.keys())
    both = names_a.keys() & names_b.keys()
    # A different sharding changes local shapes too: it is named as what it is.
    placed = sorted(n for n in both if names_a[n].placement != names_b[n].placement)
    changed = sorted(n for n in both if n not in placed
                     and (names_a[n].shape, names_a[n].dtype) != (names_b[n].shape, names_b[n].dtype))
    parts = []
    if only:
        parts.append(f"tensors present in one run only: {only[:10]}")
    if placed:
        first = placed[0]
        parts.append(f"tensors sharded differently: {placed[:10]} ({first}: "
                     f"{names_a[first].placement or 'not sharded'} vs {names_b[first].placement or 'not sharded'})")
    if changed:
        parts.append(f"tensors with different shape or dtype: {changed[:10]}")
    return "; ".join(parts) or "tensor order differs"


def sharded(tensors: Mapping[int, list[RankTensor]]) -> bool:
    """Whether a run's ranks hold different tensor lists, or any DTensor."""
    lists = list(tensors.values())
    return any(v != lists[0] for v in lists[1:]) or any(t.placement for v in lists for t in v)


def layout_difference(a: Mapping[int, list[RankTensor]], b: Mapping[int, list[RankTensor]],
                      world_sizes: tuple[int, int]) -> str | None:
    """Why two sharded runs do not compare shard by shard (None: they do, on the ranks both recorded)."""
    if world_sizes[0] != world_sizes[1]:
        return (f"sharded tensors compare shard by shard, at one world size: {world_sizes[0]} vs {world_sizes[1]} "
                "ranks")
    for rank in sorted(a.keys() & b.keys()):
        reason = list_difference(a[rank], b[rank])
        if reason:
            return f"rank {rank}: {reason}"
    return None


def differing_names(a: Mapping[int, list[RankTensor]], tables: list[tuple[int, bytes, bytes]]) -> list[str]:
    """Names of the tensors whose digests differ in (rank, digests of A, digests of B), each rank read with its
    own list; in list order, rank by rank, each name once."""
    found: dict[str, None] = {}
    for rank, x, y in tables:
        diff = (_table(x) != _table(y)).any(axis=1)
        for i in np.nonzero(diff)[0]:
            found.setdefault(a[rank][int(i)].name, None)
    return list(found)


def _table(digests: bytes) -> np.ndarray:
    return np.frombuffer(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)


def replica_groups(tensors: Mapping[int, list[RankTensor]]) -> list[tuple[tuple[int, ...], list[str], np.ndarray]]:
    """Replicated tensors, bucketed for a vectorised check: (ranks, names, index per rank and name) for the
    tensors those ranks all hold as replicas of one another (same name, same lowest replica rank)."""
    members: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for rank in sorted(tensors):
        for i, t in enumerate(tensors[rank]):
            if t.replica_of is not None:
                members.setdefault((t.name, t.replica_of), []).append((rank, i))
    buckets: dict[tuple[int, ...], tuple[list[str], list[list[int]]]] = {}
    for (name, _), held in members.items():
        if len(held) < 2:
            continue
        names, indices = buckets.setdefault(tuple(r for r, _ in held), ([], []))
        names.append(name)
        indices.append([i for _, i in held])
    return [(ranks, names, np.asarray(indices, dtype=np.int64).T) for ranks, (names, indices) in buckets.items()]


def replica_disagreements(run_id: int, tensors: Mapping[int, list[RankTensor]],
                          digests: Mapping[tuple[int, int], bytes | None], fp_version: str) -> list[dict[str, Any]]:
    """Where one run's replicas first disagree: at its first step where ranks that must hold bit-equal copies
    of a tensor do not, one row per such tensor, `{"run", "step", "tensor", "ranks": {rank: digest}}` (the
    first MAX_REPORTED). Steps whose digests are not loaded are skipped; [] when every replica agrees."""
    groups = replica_groups(tensors)
    if not groups:
        return []
    for step in sorted({s for s, _ in digests}):
        rows: list[dict[str, Any]] = []
        for ranks, names, index in groups:
            present = [(j, r, d) for j, r in enumerate(ranks) if (d := digests.get((step, r))) is not None]
            if len(present) < 2:
                continue
            held = np.stack([_table(d)[index[j]] for j, _, d in present])  # ranks x names x DIGEST_BYTES
            for k in np.nonzero((held != held[0]).any(axis=(0, 2)))[0]:
                rows.append({"run": run_id, "step": step, "tensor": names[k],
                             "ranks": {r: f"{fp_version}:{held[n, k].tobytes().hex()}"
                                       for n, (_, r, _) in enumerate(present)}})
        if rows:
            return rows[:MAX_REPORTED]
    return []


def replicated_count(tensors: Mapping[int, list[RankTensor]]) -> int:
    """How many tensors the replica check covers (held as replicas by two ranks or more)."""
    return sum(len(names) for _, names, _ in replica_groups(tensors))
