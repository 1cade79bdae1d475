"""Where two runs' per-tensor digests differ, tensor × step, with the ranks that differ in each cell.

A compact, bounded companion of the comparison (detlab.core.compare): only differing cells are listed,
tensors and steps are capped, and the ranks of each cell point into a short list of distinct rank
sets (after a divergence most cells differ on the same ranks). Pure: plain data in, plain data out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detlab.core.runs import RunData
from detlab.core.shards import DIGEST_BYTES

MAX_TENSORS = 48
MAX_STEPS = 100


def _table(digests: bytes) -> np.ndarray:
    return np.frombuffer(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)


def _sample(values: list[int], limit: int) -> list[int]:
    """The first value and an even sample of the others, `limit` in all (the first is where it starts)."""
    if len(values) <= limit:
        return values
    stride = (len(values) - 1) / (limit - 1)
    return sorted({values[0], *(values[round(i * stride)] for i in range(limit))})


def _per_rank(a: RunData, b: RunData, step: int, ranks: list[int]) -> dict[int, set[int]] | None:
    """Tensor index -> the ranks at which it differs, at one step (None when digests are not loaded)."""
    out: dict[int, set[int]] = {}
    for rank in ranks:
        x, y = a.records.get((step, rank)), b.records.get((step, rank))
        if x is None or y is None or x.key() == y.key():
            continue
        if x.digests is None or y.digests is None:
            return None
        for i in np.nonzero((_table(x.digests) != _table(y.digests)).any(axis=1))[0]:
            out.setdefault(int(i), set()).add(rank)
    return out


def _consensus(a: RunData, b: RunData, step: int) -> dict[int, set[int]] | None:
    """Tensor index -> {} where the runs' replicas disagree or the runs do (ranks are not matched)."""
    da, db = a.at(step, a.ranks()), b.at(step, b.ranks())
    if not da or not db or any(d.digests is None for d in da + db):
        return None
    sa, sb = np.stack([_table(d.digests) for d in da]), np.stack([_table(d.digests) for d in db])  # type: ignore[arg-type]
    bad = (sa != sa[0]).any(axis=(0, 2)) | (sb != sb[0]).any(axis=(0, 2)) | (sa[0] != sb[0]).any(axis=1)
    return {int(i): set() for i in np.nonzero(bad)[0]}


def tensor_step_map(a: RunData, b: RunData, steps: list[int], *, steps_differing: int | None = None,
                    max_tensors: int = MAX_TENSORS, max_steps: int = MAX_STEPS) -> dict[str, Any] | None:
    """The differing (tensor, step) cells among `steps` (those whose packed digests are loaded).

    Returns None when no step among them differs. `cells` are [step, tensor index, rank set index]
    into `tensors` and `rank_sets`; in rank-consensus mode (different world sizes) rank sets are
    empty. Over the caps, the first differing step and an even sample of the others are kept, and
    the tensors that differ earliest (then most often); `truncated` says so."""
    per_rank = a.world_size == b.world_size
    common = sorted(set(a.ranks()) & set(b.ranks())) if per_rank else []
    found: dict[int, dict[int, set[int]]] = {}
    for step in sorted(steps):
        at_step = _per_rank(a, b, step, common) if per_rank else _consensus(a, b, step)
        if at_step:
            found[step] = at_step
    if not found:
        return None
    shown_steps = _sample(list(found), max_steps)
    first_seen: dict[int, tuple[int, int]] = {}  # tensor -> (first step it differs, -steps it differs at)
    for step in shown_steps:
        for tensor in found[step]:
            first, count = first_seen.get(tensor, (step, 0))
            first_seen[tensor] = (first, count - 1)
    ranked = sorted(first_seen, key=lambda t: (*first_seen[t], t))
    kept = sorted(ranked[:max_tensors])
    row = {t: i for i, t in enumerate(kept)}
    rank_sets: list[list[int]] = []
    set_index: dict[tuple[int, ...], int] = {}
    cells: list[list[int]] = []
    for step in shown_steps:
        for tensor, ranks in sorted(found[step].items()):
            if tensor not in row:
                continue
            key = tuple(sorted(ranks))
            if key not in set_index:
                set_index[key] = len(rank_sets)
                rank_sets.append(list(key))
            cells.append([step, row[tensor], set_index[key]])
    names = [t[0] for t in a.tensors]
    truncated = len(shown_steps) < len(found) or len(kept) < len(ranked)
    notes = []
    if len(shown_steps) < len(found):
        notes.append(f"{len(shown_steps)} of {len(found)} differing steps shown (the first and an even sample)")
    if len(kept) < len(ranked):
        notes.append(f"{len(kept)} of {len(ranked)} differing tensors shown (those that differ earliest)")
    if steps_differing is not None and steps_differing > len(found):
        notes.append(f"per-tensor digests compared at {len(found)} of {steps_differing} differing steps")
    return {
        "mode": "per-rank" if per_rank else "rank-consensus",
        "steps": shown_steps,
        "tensors": [names[t] if t < len(names) else f"#{t}" for t in kept],
        "rank_sets": rank_sets,
        "cells": cells,
        "steps_differing": steps_differing if steps_differing is not None else len(found),
        "tensors_differing": len(ranked),
        "truncated": truncated or (steps_differing is not None and steps_differing > len(found)),
        "note": "; ".join(notes) or None,
    }
