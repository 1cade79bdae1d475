"""Which part of the training state differs first: at a step where two runs part, the first component in causal
order (the batch a step reads, the random state, the loss, the gradients, the parameters they update, the
optimizer's state, the buffers), with the entries within it; and, for a resumed recording, whether the restored
state matched the state saved at that step.

Pure functions over plain data (detlab.core.runs); no database, no torch."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detlab.core.runs import RunData, StepData, component_of
from detlab.core.shards import DIGEST_BYTES

# Causal order within a step: what a step reads, then what it computes, then what it updates.
ORDER = ("batch", "rng", "loss", "gradients", "parameters", "optimizer", "buffers")
STATE_PARTS = ("batch", "rng", "optimizer")  # recorded beside the tensors (wire.StepState)
SHOWN = 20  # entries named per component


def state_diff(x: StepData, y: StepData) -> dict[str, list[str]]:
    """Per component recorded beside the tensors by both: the entries (recorded by both) whose values differ."""
    out: dict[str, list[str]] = {}
    sx, sy = x.state or {}, y.state or {}
    for part in STATE_PARTS:
        ex, ey = sx.get(part), sy.get(part)
        if ex is None or ey is None:
            continue
        if differing := sorted(k for k in ex.keys() & ey.keys() if ex[k] != ey[k]):
            out[part] = differing
    return out


def names_of(run: RunData, rank: int) -> list[str]:
    """The names of a rank's tensors in its digests' order."""
    own = run.rank_tensors.get(rank)
    return [t.name for t in own] if own else [t[0] for t in run.tensors]


def tensor_diff(run: RunData, rank: int, x: StepData, y: StepData) -> set[int] | None:
    """The indices of the tensors whose digests differ (None when not loaded). Beside a restored record the
    gradients are not compared: a restored state holds none (no backward ran since the restore)."""
    if x.digests is None or y.digests is None:
        return None
    if len(x.digests) != len(y.digests):
        return set(range(len(names_of(run, rank))))
    tx = np.frombuffer(x.digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    ty = np.frombuffer(y.digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    found = {int(i) for i in np.nonzero((tx != ty).any(axis=1))[0]}
    if x.restored or y.restored:
        names = names_of(run, rank)
        found = {i for i in found if i >= len(names) or component_of(run, names[i]) != "gradients"}
    return found


def records_differ(run: RunData, rank: int, x: StepData, y: StepData) -> bool:
    """Whether two records of one rank differ: their tensors (by model digest, or digest by digest beside a
    restored record) or what they recorded beside them."""
    if state_diff(x, y):
        return True
    if x.key() == y.key():
        return False
    found = tensor_diff(run, rank, x, y) if x.restored or y.restored else None
    return found is None or bool(found)


def _loss_differs(x: StepData, y: StepData) -> bool:
    if x.loss is None or y.loss is None:
        return False
    return not (x.loss == y.loss or (math.isnan(x.loss) and math.isnan(y.loss)))


def differing(run: RunData, pairs: list[tuple[int, StepData, StepData]]) -> dict[str, set[str]]:
    """Component -> the differing entries, over (rank, record of one run, record of the other)."""
    found: dict[str, set[str]] = {}
    for rank, x, y in pairs:
        for part, names in state_diff(x, y).items():
            found.setdefault(part, set()).update(names)
        if _loss_differs(x, y):
            found.setdefault("loss", set()).add("loss")
        names = names_of(run, rank)
        for i in sorted(tensor_diff(run, rank, x, y) or ()):
            name = names[i] if i < len(names) else f"tensor {i}"
            found.setdefault(component_of(run, name), set()).add(name)
    return found


def summary(found: dict[str, set[str]], compared: list[str] | None = None) -> dict[str, Any] | None:
    """The first differing component in causal order, its entries, the others that differ, and a line of text
    (`optimizer: fc1.weight.exp_avg, param_groups[0].lr`); None when nothing differs."""
    parts = [p for p in ORDER if found.get(p)]
    if not parts:
        return None
    first = sorted(found[parts[0]])
    shown = ", ".join(first[:SHOWN]) + (f" and {len(first) - SHOWN} more" if len(first) > SHOWN else "")
    text = parts[0] if parts[0] == "loss" else f"{parts[0]}: {shown}"
    return {"component": parts[0], "tensors": first[:200], "components": parts, "text": text,
            "compared": compared or []}


def first_component(a: RunData, b: RunData, step: int, ranks: list[int] | None,
                    tensors: list[str]) -> dict[str, Any] | None:
    """At the first divergent step: the first component that differs. Per rank (`ranks`: those that differ) from
    both runs' records; in rank-consensus mode from the differing tensors alone (their batches and random states
    differ by construction when the world sizes do)."""
    if ranks:
        pairs = [(r, a.records[(step, r)], b.records[(step, r)]) for r in ranks
                 if (step, r) in a.records and (step, r) in b.records]
        compared = [p for p in STATE_PARTS if pairs and all((x.state or {}).get(p) is not None
                                                             and (y.state or {}).get(p) is not None
                                                             for _, x, y in pairs)]
        return summary(differing(a, pairs), compared)
    found: dict[str, set[str]] = {}
    for name in tensors:
        found.setdefault(component_of(a, name), set()).add(name)
    return summary(found)


def resume_check(run: RunData) -> dict[str, Any] | None:
    """A resumed recording: at its first restore, whether the restored state equals the state saved at that step
    (`exact`; None when the first process did not record that step), and which components differ. None when the
    run was not resumed from a recorded step."""
    restores = sorted(key for key, data in run.records.items() if data.restored)
    if not restores:
        return None
    steps = sorted({step for step, _ in restores})
    checks = []
    for step in steps:
        pairs = [(r, run.saved[(s, r)], run.records[(s, r)]) for s, r in restores
                 if s == step and (s, r) in run.saved]
        found = differing(run, pairs)
        found.pop("loss", None)  # a restored record holds no loss
        found.pop("batch", None)
        checks.append((step, bool(pairs), summary(found), sorted(r for s, r in restores if s == step)))
    step, known, first, ranks = next((c for c in checks if c[2] is not None), checks[0])
    return {"run": run.run_id, "step": step, "exact": None if not known else first is None,
            "components": first["components"] if first else [], "tensors": first["tensors"][:SHOWN] if first else [],
            "text": first["text"] if first else None, "restores": len(steps), "ranks": ranks}
