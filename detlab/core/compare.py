"""Comparison of recorded runs: verdicts, reproducibility rates, throughput and cost.

Pure functions over plain data (see RunData); no database. Semantics: ../shared ARCHITECTURE.md,
"Comparison semantics".
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from detlab.core import collective_calls, components, drift, positions, runs, shards
from detlab.core.results import RunComparison
from detlab.core.runs import RunData, StepData, mean_loss
from detlab.core.shards import DIGEST_BYTES


def _table(digests: bytes) -> np.ndarray:
    return np.frombuffer(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)


def _tensor_diff(a: list[StepData], b: list[StepData], per_rank: bool) -> set[int] | None:
    """Indices of tensors that differ (None when digests are not loaded). Per rank: a[i] vs b[i].
    Rank consensus: a tensor differs where the replicas of either run disagree or the runs do."""
    if any(d.digests is None for d in a + b):
        return None
    if per_rank:
        return {int(i) for x, y in zip(a, b, strict=True)
                for i in np.nonzero((_table(x.digests) != _table(y.digests)).any(axis=1))[0]}  # type: ignore[arg-type]
    sa = np.stack([_table(d.digests) for d in a])  # type: ignore[arg-type]
    sb = np.stack([_table(d.digests) for d in b])  # type: ignore[arg-type]
    split_a, split_b = (sa != sa[0]).any(axis=(0, 2)), (sb != sb[0]).any(axis=(0, 2))
    return {int(i) for i in np.nonzero(split_a | split_b | (sa[0] != sb[0]).any(axis=1))[0]}


def step_diff(a: RunData, b: RunData, step: int, ranks: list[int] | None) -> tuple[bool, set[int] | None, list[int]]:
    """At one step: (do the runs differ, which tensors if known, which ranks). `ranks` are the common
    ranks to compare one to one, or None for rank-consensus mode (different world sizes)."""
    if ranks is not None:
        bad = [(r, x, y) for r in ranks
               if (x := a.records.get((step, r))) is not None and (y := b.records.get((step, r))) is not None
               and components.records_differ(a, r, x, y)]
        if any(x.restored or y.restored for _, x, y in bad):  # beside a restored record, gradients are not compared
            found = [components.tensor_diff(a, r, x, y) for r, x, y in bad]
            tensors = None if any(f is None for f in found) else set().union(*found)  # type: ignore[arg-type]
        else:
            tensors = _tensor_diff([x for _, x, _ in bad], [y for _, _, y in bad], True)
        return bool(bad), tensors, [r for r, _, _ in bad]
    da, db = a.at(step, a.ranks()), b.at(step, b.ranks())
    keys_a, keys_b = {d.key() for d in da}, {d.key() for d in db}
    if len(keys_a) == 1 and keys_a == keys_b:
        return False, set(), []
    return True, _tensor_diff(da, db, False), []


def line_up(a: RunData, b: RunData) -> tuple[RunData, positions.Alignment]:
    """Run B with its ranks renumbered as run A's ranks at the same logical positions, where both runs recorded
    them (detlab.core.positions); B itself where ranks meet by number or cannot meet (the alignment's reason)."""
    alignment = positions.line_up((a.run_id, b.run_id), a.positions, b.positions, (a.world_size, b.world_size))
    mapping = alignment.b_to_a
    if mapping is None or all(r == ra for r, ra in mapping.items()):
        return b, alignment
    moved = RunData(run_id=b.run_id, workload=b.workload, world_size=b.world_size, tensors=b.tensors,
                    records={(step, mapping[r]): d for (step, r), d in b.records.items() if r in mapping},
                    fp_versions=b.fp_versions, expected_steps=b.expected_steps, status=b.status,
                    rank_tensors={mapping[r]: t for r, t in b.rank_tensors.items() if r in mapping},
                    positions={mapping[r]: p for r, p in b.positions.items()}, rank_note=alignment.note,
                    calls={(step, mapping[r]): c for (step, r), c in b.calls.items() if r in mapping},
                    comm_logs=b.comm_logs)
    return moved, alignment


def _incomparable(a: RunData, b: RunData) -> str | None:
    if a.workload != b.workload:
        return f"different workloads: {a.workload} vs {b.workload}"
    if not a.records or not b.records:
        missing = [str(r.run_id) for r in (a, b) if not r.records]
        return f"run(s) {', '.join(missing)} recorded no steps"
    if a.fp_versions != b.fp_versions or len(a.fp_versions) > 1:
        return f"fingerprint versions differ: {sorted(a.fp_versions)} vs {sorted(b.fp_versions)}"
    if a.rank_tensors and b.rank_tensors and (shards.sharded(a.rank_tensors) or shards.sharded(b.rank_tensors)):
        reason = shards.layout_difference(a.rank_tensors, b.rank_tensors, (a.world_size, b.world_size))
    else:
        reason = shards.list_difference(shards.plain(a.tensors), shards.plain(b.tensors))
    if reason:
        return reason
    if not set(a.steps()) & set(b.steps()):
        return "the runs share no recorded step"
    if a.world_size == b.world_size and not set(a.ranks()) & set(b.ranks()):
        return "the runs share no recorded rank"
    return None


def _ranges(values: list[int], limit: int = 4) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10' (the first `limit` ranges, then how many more)."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    text = ", ".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in spans[:limit])
    return text + (f" and {len(spans) - limit} more ranges" if len(spans) > limit else "")


def missing_data(a: RunData, b: RunData) -> list[str]:
    """What either run lacks of what it was meant to record (its expected steps, or else the other
    run's steps), ranks absent at recorded steps, and runs that did not succeed. Empty: complete."""
    out = []
    steps_a, steps_b = set(a.steps()), set(b.steps())
    for run, other_steps in ((a, steps_b), (b, steps_a)):
        if run.status is not None and run.status != "succeeded":
            out.append(f"run {run.run_id} {run.status}")
        expected = set(run.expected_steps) if run.expected_steps is not None else other_steps | set(run.steps())
        lacking = sorted(expected - set(run.steps()))
        if lacking:
            out.append(f"run {run.run_id} lacks {len(lacking)} of {len(expected)} steps ({_ranges(lacking)})")
        per_step: dict[int, int] = {}
        for step, _rank in run.records:
            per_step[step] = per_step.get(step, 0) + 1
        short = sorted(step for step, n in per_step.items() if n < run.world_size)
        if short:
            present = sorted(r for (s, r) in run.records if s == short[0])
            out.append(f"run {run.run_id} lacks ranks at {len(short)} step(s) ({_ranges(short)}; step {short[0]} "
                       f"has ranks {present} of {run.world_size})")
    return out


def _loss_curve(run: RunData, steps: list[int]) -> list[list[float]]:
    return [[s, loss] for s in steps if (loss := mean_loss(run, s)) is not None]


INITIAL_STATES = "initial states differ — seed before building the model, or load the same weights"


def compare_runs(a: RunData, b: RunData) -> RunComparison:
    """Verdict between two runs: identical, diverged (where first), incomplete (no difference among
    the steps both recorded, but one lacks steps, ranks or did not finish: never `identical`) or
    incomparable (why). `missing` lists what is missing, whatever the verdict.

    Steps are told apart by their model digests; tensor-level detail is given for the steps whose
    packed digests are loaded (the caller loads the first divergent step and a sample of the rest).

    `replica_disagreements`, apart from the verdict: where, within either run, ranks that must hold
    bit-equal copies of a tensor first do not."""
    replicas = replica_disagreements(a) + replica_disagreements(b)
    found = preflight_notes(a, b)
    b, alignment = line_up(a, b)
    calls = compare_calls(a, b, alignment)
    reason = alignment.reason or _incomparable(a, b)
    if reason:
        return RunComparison.model_validate({
                "verdict": "incomparable", "reason": reason, "mode": None, "run_a": a.run_id, "run_b": b.run_id,
                "first_divergent_step": None, "first_divergent_tensors": [], "ranks": [],
                "steps_differing": 0, "steps_compared": 0, "per_step": [], "loss": {"a": [], "b": []},
                "missing": [], "replica_disagreements": replicas, "collectives": calls,
                "drift": {"available": False, "reason": f"incomparable runs: {reason}"}, "preflight": found})
    names = [t[0] for t in a.tensors]
    steps = sorted(set(a.steps()) & set(b.steps()))
    per_rank = a.world_size == b.world_size
    common = sorted(set(a.ranks()) & set(b.ranks())) if per_rank else None
    notes = [] if per_rank else [f"compared on rank-consensus parameters (world sizes {a.world_size} vs "
                                 f"{b.world_size}); ranks are not matched one to one"]
    notes += [b.rank_note] if b.rank_note else []
    per_step: list[dict[str, Any]] = []
    first_step, first_tensors, first_ranks, differing_steps, unknown = None, [], [], 0, 0
    first_count: int | None = None
    for step in steps:
        differs, tensors, ranks = step_diff(a, b, step, common)
        count = None if tensors is None else len(tensors)
        per_step.append({"step": step, "tensors_differing": count if differs else 0})
        if not differs:
            continue
        differing_steps += 1
        unknown += tensors is None
        if first_step is None:
            first_step, first_ranks, first_count = step, ranks, count
            if common and a.rank_tensors and tensors is not None:  # each rank's own list
                first_tensors = _names(a, b, step, ranks)
                if any(a.records[(step, r)].restored or b.records[(step, r)].restored for r in ranks):
                    first_tensors = [n for n in first_tensors if runs.component_of(a, n) != "gradients"]
            else:
                first_tensors = [names[i] for i in sorted(tensors or ())]
    if unknown:
        notes.append(f"tensor counts shown for {differing_steps - unknown} of {differing_steps} differing steps "
                     "(the first included)")
    lone_ranks = set(a.ranks()) ^ set(b.ranks()) if per_rank else set()
    if lone_ranks:
        notes.append(f"rank(s) {sorted(lone_ranks)} recorded in one run only and were not compared")
    lone_steps = set(a.steps()) ^ set(b.steps())
    if lone_steps:
        notes.append(f"{len(lone_steps)} recorded step(s) exist in one run only and were not compared")
    missing = missing_data(a, b)
    drifted = drift.compare(a, b, per_rank, first_step)
    first_component = (components.first_component(a, b, first_step, first_ranks, first_tensors)
                       if first_step is not None else None)
    resume = components.resume_check(b) or components.resume_check(a)
    if steps and first_step == steps[0] and first_count == len(names):
        # Not a drift that grows "by step 0": the runs started from other states (an unseeded model).
        cause = (f"{INITIAL_STATES} (every tensor differs at step {first_step}, the first recorded)")
        if drifted.get("available"):
            drifted["verdict"] = cause
        else:
            notes.append(cause)
    return RunComparison.model_validate({
        "verdict": "diverged" if first_step is not None else "incomplete" if missing else "identical",
        "reason": "; ".join(notes) or None,
        "mode": "per-rank" if per_rank else "rank-consensus",
        "run_a": a.run_id,
        "run_b": b.run_id,
        "first_divergent_step": first_step,
        "first_divergent_tensors": first_tensors,
        "ranks": first_ranks,
        "steps_differing": differing_steps,
        "steps_compared": len(steps),
        "per_step": per_step,
        "loss": {"a": _loss_curve(a, steps), "b": _loss_curve(b, steps)},
        "missing": missing,
        "replica_disagreements": replicas,
        "drift": drifted,
        "collectives": calls,
        "preflight": found,
        "first_divergent_component": first_component,
        "resume": resume,
    })


def preflight_notes(a: RunData, b: RunData) -> list[dict[str, Any]]:
    """What the preflight table found in each run's processes (recorded with its env records), one row per run and
    finding with the ranks it was found on: a run that parts may simply have run a known-broken setting."""
    rows: list[dict[str, Any]] = []
    for side, run in (("a", a), ("b", b)):
        by_key: dict[tuple[str, str], dict[str, Any]] = {}
        for rank in sorted(run.preflight):
            for finding in run.preflight[rank]:
                row = by_key.setdefault((finding["rule"], finding["matched"]), {"run": side, "ranks": [], **finding})
                row["ranks"].append(rank)
        rows += by_key.values()
    return rows


def compare_calls(a: RunData, b: RunData, alignment: positions.Alignment) -> dict[str, Any] | None:
    """The runs' collective calls compared (B already lined up with A): the first call whose output differs and
    why (detlab.core.collective_calls). None when neither run recorded its collectives."""
    if not a.calls and not b.calls:
        return None
    if alignment.b_to_a is not None:
        alignment = positions.Alignment(note=alignment.note)  # B's calls are renumbered with its records
    version = next(iter(a.fp_versions), "fp")
    return collective_calls.compare(a.calls, b.calls, alignment=alignment, world_sizes=(a.world_size, b.world_size),
                                    positions=a.positions, logs=(a.comm_logs, b.comm_logs), fp_version=version)


def _names(a: RunData, b: RunData, step: int, ranks: list[int]) -> list[str]:
    """The differing tensors at `step` on `ranks`, each rank's digests read with its own list (sharded models)."""
    return shards.differing_names(a.rank_tensors, [(r, a.records[(step, r)].digests or b"",
                                                    b.records[(step, r)].digests or b"") for r in ranks])


def replica_disagreements(run: RunData) -> list[dict[str, Any]]:
    """Within one run: the first step where ranks that must hold bit-equal copies of a tensor (DDP's parameters,
    a DTensor's Replicate() dimensions) do not, one row per tensor (detlab.core.shards). [] when they all agree
    or nothing is known of replicas."""
    if not run.rank_tensors:
        return []
    return shards.replica_disagreements(run.run_id, run.rank_tensors,
                                        {key: data.digests for key, data in run.records.items()},
                                        next(iter(run.fp_versions), "fp"))


def differing_steps(a: RunData, b: RunData) -> list[int]:
    """Steps at which two comparable runs differ, from model digests alone."""
    b = line_up(a, b)[0]
    common = sorted(set(a.ranks()) & set(b.ranks())) if a.world_size == b.world_size else None
    return [s for s in sorted(set(a.steps()) & set(b.steps())) if step_diff(a, b, s, common)[0]]


def reproducibility(repeats: list[RunData]) -> dict[str, Any]:
    """k of n: repeats identical to the first recorded one, over the repeats comparable with it
    (identical or diverged). Incomplete and incomparable repeats are counted apart, never as
    identical; a repeat that recorded nothing says nothing. Rate None with nothing comparable."""
    recorded = [r for r in repeats if r.records]
    results = [compare_runs(recorded[0], other) for other in recorded[1:]]
    verdicts = [r.verdict for r in results]
    same = verdicts.count("identical")
    comparable = same + verdicts.count("diverged")
    parted = [r.first_divergent_step for r in results if r.verdict == "diverged" and r.first_divergent_step is not None]
    return {"repeats": len(repeats), "recorded": len(recorded), "comparable": comparable,
            "identical_to_first": same, "incomplete": verdicts.count("incomplete"),
            "incomparable": verdicts.count("incomparable"), "rate": same / comparable if comparable else None,
            "first_divergent_step": min(parted) if parted else None}


def step_times(run: RunData, warmup: int) -> list[float]:
    """Per recorded step after warm-up: the slowest rank's time (a step waits for every rank)."""
    by_step: dict[int, float] = {}
    for (step, _rank), data in run.records.items():
        if step > warmup:
            by_step[step] = max(by_step.get(step, 0.0), data.step_time_s)
    return [by_step[s] for s in sorted(by_step) if by_step[s] > 0]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def throughput(runs: list[RunData], global_batch: int, warmup: int = 2) -> dict[str, Any]:
    """samples/s from per-step times pooled over the runs: median and interquartile spread."""
    times = [t for run in runs for t in step_times(run, warmup)]
    if not times:
        return {"samples_per_s": None, "spread": None, "step_time_ms_median": None, "runs": len(runs)}
    rates = [global_batch / t for t in times]
    return {"samples_per_s": statistics.median(rates),
            "spread": [_quantile(rates, 0.25), _quantile(rates, 0.75)],
            "step_time_ms_median": statistics.median(times) * 1e3, "runs": len(runs)}


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_MAX_STEPS = 5000  # per side; longer runs are thinned evenly (a wider, never narrower, interval)
BOOTSTRAP_MIN_STEPS = 5  # per side; fewer timed steps give a point estimate and no interval


def cost_estimate(baseline: list[RunData], runs: list[RunData], global_batch: int, warmup: int = 2,
                  *, seed: int = 0) -> dict[str, Any]:
    """Cost of `runs` against `baseline` (1 - median samples/s / baseline's) with a bootstrap 95 %
    interval over post-warm-up steps, resampled within each run. `within_noise` when the interval
    spans 0: the configs' throughputs are not told apart by these measurements."""
    sides = []
    for group in (baseline, runs):
        per_run = [np.asarray(t, dtype=np.float64) for r in group if (t := step_times(r, warmup))]
        per_run = [t[np.linspace(0, len(t) - 1, BOOTSTRAP_MAX_STEPS // len(per_run)).astype(int)]
                   if len(t) > BOOTSTRAP_MAX_STEPS // len(per_run) else t for t in per_run]
        sides.append(per_run)
    if not sides[0] or not sides[1]:
        return {"cost": None, "interval": None, "within_noise": None, "resamples": 0}
    point = cost(throughput(runs, global_batch, warmup)["samples_per_s"],
                 throughput(baseline, global_batch, warmup)["samples_per_s"])
    if min(sum(len(t) for t in side) for side in sides) < BOOTSTRAP_MIN_STEPS:
        # Resampling one or two steps gives an interval of zero width: a precision never measured.
        return {"cost": point, "interval": None, "within_noise": None, "resamples": 0}
    rng = np.random.default_rng(seed)

    def medians(per_run: list[np.ndarray]) -> np.ndarray:
        draws = [t[rng.integers(0, len(t), size=(BOOTSTRAP_RESAMPLES, len(t)))] for t in per_run]
        return np.median(global_batch / np.concatenate(draws, axis=1), axis=1)

    costs = 1.0 - medians(sides[1]) / medians(sides[0])
    lo, hi = (float(x) for x in np.quantile(costs, [0.025, 0.975]))
    return {"cost": point, "interval": [lo, hi], "within_noise": lo <= 0.0 <= hi, "resamples": BOOTSTRAP_RESAMPLES}


def cost_text(estimate: dict[str, Any] | None) -> str:
    """How a cost reads everywhere (page, figure, CLI): 'baseline', 'within noise (-2.1% to +3.4%)',
    '19.0% slower (95% CI 15.2% to 22.8%)'; 'not measured' without timed steps."""
    if estimate is None:
        return "baseline"
    point, interval = estimate.get("cost"), estimate.get("interval")
    if point is None:
        return "not measured"
    if interval is None:
        return f"{abs(point):.1%} {'faster' if point < 0 else 'slower'} (too few timed steps for an interval)"
    lo, hi = interval
    if estimate.get("within_noise"):
        return f"within noise ({lo:+.1%} to {hi:+.1%})"
    if point < 0:
        return f"{-point:.1%} faster (95% CI {-hi:.1%} to {-lo:.1%})"
    return f"{point:.1%} slower (95% CI {lo:.1%} to {hi:.1%})"


def cost(thr: float | None, baseline: float | None) -> float | None:
    """1 - throughput / baseline throughput (0.2 = the config is 20 % slower)."""
    if thr is None or not baseline:
        return None
    return 1.0 - thr / baseline
