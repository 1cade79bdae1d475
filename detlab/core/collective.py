"""Collective results as numbers: nccl-tests' bandwidth formulas, per-cell summaries, config diffs, exports.

Pure Python (no torch): the backend imports it to summarise stored `trial` records.

What `bytes` means (the size a user asks for, `-b/-e` in nccl-tests, and the column `size`):
- all_reduce_sum / all_reduce_avg / broadcast: the per-rank buffer, input = output = S bytes;
  NCCL count = S / sizeof(dtype).
- all_gather: the gathered output S; each rank contributes S / world_size bytes;
  NCCL count (sendcount) = S / sizeof(dtype) / world_size.
- reduce_scatter: the per-rank input S; each rank receives S / world_size bytes;
  NCCL count (recvcount) = S / sizeof(dtype) / world_size.
As in nccl-tests, per-rank counts are rounded down, so `op_bytes` (= count × world_size × sizeof for
all_gather/reduce_scatter) can be a little below `bytes` when world_size does not divide the count;
bandwidths use `op_bytes`. algbw = op_bytes / time; busbw = algbw × factor, factor from nccl-tests'
doc/PERFORMANCE.md: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any, Literal, get_args

CollectiveOp = Literal["all_reduce_sum", "all_reduce_avg", "all_gather", "reduce_scatter", "broadcast"]
CollectiveDtype = Literal["float32", "bfloat16", "float16"]
OPS: tuple[str, ...] = get_args(CollectiveOp)
DTYPES: tuple[str, ...] = get_args(CollectiveDtype)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# op -> (nccl-tests collective name, redop column, root column)
NCCL_TESTS_NAMES = {
    "all_reduce_sum": ("AllReduce", "sum", -1),
    "all_reduce_avg": ("AllReduce", "avg", -1),
    "all_gather": ("AllGather", "none", -1),
    "reduce_scatter": ("ReduceScatter", "sum", -1),
    "broadcast": ("Broadcast", "none", 0),
}
NCCL_TESTS_TYPES = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}
# Ops whose output is written over the input buffer (nccl-tests' "in_place" column).
IN_PLACE_IMPLS = {"all_reduce", "all_reduce(sum)/world_size", "all_reduce+slice", "broadcast"}
SCATTERED = "reduce_scatter"  # the one op whose ranks hold different outputs by design


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw correction factor for `op` over `world_size` ranks."""
    n = world_size
    if op.startswith("all_reduce"):
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective op {op!r}; known: {', '.join(OPS)}")


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes/s): size / time, as nccl-tests prints it."""
    return nbytes / seconds / 1e9


def busbw(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw times nccl-tests' factor for the op (nbytes: the op's size S)."""
    return algbw(nbytes, seconds) * bus_factor(op, world_size)


def op_geometry(op: str, nbytes: int, dtype: str, world_size: int) -> dict[str, int]:
    """Element counts for one cell: NCCL `count`, per-rank input/output elements, `op_bytes` (size S)."""
    esize = DTYPE_BYTES[dtype]
    n = nbytes // esize
    if op in ("all_gather", "reduce_scatter"):
        c = n // world_size
        ins, outs = (c, c * world_size) if op == "all_gather" else (c * world_size, c)
        return {"count": c, "in_elems": ins, "out_elems": outs, "op_bytes": c * world_size * esize}
    bus_factor(op, world_size)  # rejects unknown ops
    return {"count": n, "in_elems": n, "out_elems": n, "op_bytes": n * esize}


def _order(key: tuple[str, str, int]) -> tuple[int, int, int]:
    op, dtype, nbytes = key
    return (OPS.index(op) if op in OPS else len(OPS), list(DTYPE_BYTES).index(dtype) if dtype in DTYPE_BYTES else 9,
            nbytes)


def _groups(trials: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in trials:
        if r.get("type", "trial") == "trial":
            groups[(r["op"], r["dtype"], int(r["bytes"]))].append(r)
    return {k: groups[k] for k in sorted(groups, key=_order)}


def _majority(values: list[Any]) -> Any:
    """Most common value; ties go to the one seen first (trial order)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def _per_rank(recs: list[dict[str, Any]], field: str) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = defaultdict(list)
    for r in sorted(recs, key=lambda r: (int(r["rank"]), int(r["trial"]))):
        out[int(r["rank"])].append(r.get(field))
    return dict(out)


def _max(values: list[Any]) -> float | None:
    finite = [float(v) for v in values if v is not None]
    return max(finite) if finite else None


def summarize(trials: list[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """One row per (op, dtype, bytes): reproducibility, rank consistency, timing, bandwidth, errors, prefix class.

    - `distinct_digests`: the most distinct output digests any one rank saw across trials (1 = reproducible).
    - `ranks_consistent`: all_reduce / all_gather / broadcast: in every trial every rank holds the same
      digest. reduce_scatter ranks hold different slices by design, so there it means each rank's digest
      is the same in every trial (`rank_check` says which check ran).
    - times: a trial's time is the slowest rank's (the collective is done when the last rank is); the
      row gives median/min/max over trials, algbw/busbw at the median and busbw at the max/min time.
    - `prefix_class`: within one (op, dtype), sizes whose leading elements (see detlab.worker.ranks.collective) have
      the same bits on every rank share a class; class 0 is the smallest size's.
    - `reproducible`: every rank reported, 1 distinct digest, ranks consistent.
    """
    rows = []
    for (op, dtype, nbytes), recs in _groups(trials).items():
        digests = _per_rank(recs, "digest")
        distinct = max(len(set(d)) for d in digests.values())
        if op == SCATTERED:
            consistent, check = distinct == 1, "per rank across trials (ranks differ by design)"
        else:
            by_trial: dict[int, set[str]] = defaultdict(set)
            for r in recs:
                by_trial[int(r["trial"])].add(r["digest"])
            consistent, check = all(len(s) == 1 for s in by_trial.values()), "equal across ranks"
        times: dict[int, float] = {}
        for r in recs:
            times[int(r["trial"])] = max(times.get(int(r["trial"]), 0.0), float(r["time_s"]))
        tvals = sorted(times.values())
        t_med = statistics.median(tvals)
        geo = op_geometry(op, nbytes, dtype, world_size)
        op_bytes = int(recs[0].get("op_bytes") or geo["op_bytes"])

        def bw(seconds: float, nb: int = op_bytes, o: str = op) -> float | None:
            return busbw(o, nb, seconds, world_size) if seconds > 0 else None

        complete = set(digests) == set(range(world_size))
        rows.append({
            "op": op, "dtype": dtype, "bytes": nbytes, "op_bytes": op_bytes, "count": geo["count"],
            "out_elems": geo["out_elems"], "world_size": world_size, "trials": len(times), "ranks": sorted(digests),
            "complete": complete, "digest": _majority(digests[min(digests)]), "distinct_digests": distinct,
            "ranks_consistent": consistent, "rank_check": check,
            "reproducible": complete and distinct == 1 and consistent,
            "time_s_median": t_med, "time_s_min": tvals[0], "time_s_max": tvals[-1],
            "algbw_gbs": algbw(op_bytes, t_med) if t_med > 0 else None, "busbw_gbs": bw(t_med),
            "busbw_gbs_min": bw(tvals[-1]), "busbw_gbs_max": bw(tvals[0]),
            "err_max_abs": _max([r.get("err_max_abs") for r in recs]),
            "err_max_ulp": _max([r.get("err_max_ulp") for r in recs]),
            "frac_diff": _max([r.get("frac_diff") for r in recs]),
            "impl": recs[0].get("impl"), "fp_version": recs[0].get("fp_version"),
            "_prefix": tuple(sorted((rank, _majority(p)) for rank, p in _per_rank(recs, "prefix_digest").items())),
        })
    classes: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:  # rows are in size order within (op, dtype)
        seen = classes[(row["op"], row["dtype"])]
        prefix = row.pop("_prefix")
        if prefix not in seen:
            seen.append(prefix)
        row["prefix_class"] = seen.index(prefix)
    for row in rows:
        row["prefix_classes"] = len(classes[(row["op"], row["dtype"])])
    return rows


def verdict(summary: list[dict[str, Any]]) -> tuple[bool, str]:
    """(all cells reproducible, one line saying so or naming the cells that are not)."""
    bad = [r for r in summary if not r["reproducible"]]
    if not summary:
        return False, "NO DATA: no trial records"
    if not bad:
        return True, (f"REPRODUCIBLE: all {len(summary)} (op, dtype, size) cells gave 1 distinct digest "
                      "and consistent ranks")
    names = ", ".join(f"{r['op']}/{r['dtype']}/{r['bytes']}B ({r['distinct_digests']} digests"
                      f"{'' if r['ranks_consistent'] else ', ranks differ'}"
                      f"{'' if r['complete'] else ', ranks missing'})" for r in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return False, f"NOT REPRODUCIBLE: {len(bad)} of {len(summary)} cells: {names}{more}"


def _world(trials: list[dict[str, Any]]) -> int:
    sizes = {int(r["world_size"]) for r in trials if r.get("world_size")}
    return max(sizes) if sizes else max((int(r["rank"]) for r in trials), default=-1) + 1


def _compare_across_worlds(row: dict[str, Any], a: list[dict[str, Any]], b: list[dict[str, Any]],
                           wa: int, wb: int) -> None:
    # Ranks of different world sizes are not counterparts; replicated outputs compare on their consensus.
    if row["op"] == SCATTERED:
        row["note"] = f"world sizes differ ({wa} vs {wb}): reduce_scatter slices are not comparable"
        return
    row["equal"] = _majority([r["digest"] for r in a]) == _majority([r["digest"] for r in b])
    row["prefix_equal"] = _majority([r.get("prefix_digest") for r in a]) == _majority(
        [r.get("prefix_digest") for r in b])
    row["note"] = (f"world sizes differ ({wa} vs {wb}): compared on the rank-consensus output; only broadcast "
                   "is expected to be equal: reductions and all_gather combine each rank's own inputs")


def compare_configs(a_trials: list[dict[str, Any]], b_trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (op, dtype, bytes): are config A's and B's outputs bitwise equal, rank by rank?

    Each rank's output is its majority digest over trials (ties: the earliest trial). `equal` is None when
    the cell ran in only one config. Digests cannot count differing elements, so `elements_differing` is
    exact only when it follows from the records: 0 when the digests match, or the other side's
    off-reference count when one side equals the correctly rounded float64 reference everywhere
    (frac_diff 0). `elements_differing_max` is an upper bound, the sum over ranks of (frac_a + frac_b) ×
    elements, from each side's distance to that reference; both are None where a side has no reference
    (output too large). Different world sizes: all_reduce/all_gather/broadcast compare the rank-consensus
    digest (broadcast should match, being rank 0's input at any world size; reductions and all_gather
    combine different ranks' inputs), and reduce_scatter is not compared (`equal` None); element counts are None.
    """
    ga, gb = _groups(a_trials), _groups(b_trials)
    wa, wb = _world(a_trials), _world(b_trials)
    out = []
    for key in sorted(set(ga) | set(gb), key=_order):
        op, dtype, nbytes = key
        row: dict[str, Any] = {"op": op, "dtype": dtype, "bytes": nbytes, "equal": None, "ranks_differing": [],
                               "prefix_equal": None, "elements_differing": None, "elements_differing_max": None,
                               "note": None}
        if key not in ga or key not in gb:
            row["note"] = f"only in config {'a' if key in ga else 'b'}"
            out.append(row)
            continue
        maj = {}
        for side, recs in (("a", ga[key]), ("b", gb[key])):
            digests = _per_rank(recs, "digest")
            best = {rank: _majority(d) for rank, d in digests.items()}
            frac = {int(r["rank"]): r.get("frac_diff") for r in recs if r["digest"] == best[int(r["rank"])]}
            prefix = {rank: _majority(p) for rank, p in _per_rank(recs, "prefix_digest").items()}
            maj[side] = (best, frac, prefix)
        (da, fa, pa), (db, fb, pb) = maj["a"], maj["b"]
        if wa != wb:
            _compare_across_worlds(row, ga[key], gb[key], wa, wb)
            out.append(row)
            continue
        ranks = sorted(set(da) & set(db))
        row["ranks_differing"] = [r for r in ranks if da[r] != db[r]]
        row["equal"] = set(da) == set(db) and not row["ranks_differing"]
        row["prefix_equal"] = all(pa.get(r) == pb.get(r) for r in ranks)
        n = op_geometry(op, nbytes, dtype, wa)["out_elems"]
        exact: int | None = 0
        bound: int | None = 0
        for r in row["ranks_differing"]:
            x, y = fa.get(r), fb.get(r)
            if x is None or y is None or bound is None:
                exact = bound = None
                break
            bound += min(n, round((x + y) * n))
            exact = exact + round(max(x, y) * n) if exact is not None and min(x, y) == 0 else None
        row["elements_differing"], row["elements_differing_max"] = exact, bound
        out.append(row)
    return out


def nccl_tests_json(summary: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """An export shaped like nccl-tests' `-J` JSON file (version 2), plus a `detlab` object per result.

    Follows nccl-tests' src/util.cu writer: top-level version, start_time, args, env, nccl_version,
    config {...}, results [{size, count, type, redop, root, out_of_place|in_place: {time (us), alg_bw,
    bus_bw (GB/s), nwrong}, actual_iterations, experiment_name}], out_of_bounds, average_bus_bandwidth,
    errors, end_time. Differences: one file covers several collectives (experiment_name says which);
    `time` is the median over trials (nccl-tests: the mean), with min/max in `*_per_iter`; `nwrong` is
    null because inputs here are rounding-sensitive by design (off-reference counts are in `detlab`).
    """
    results = []
    for r in summary:
        name, redop, root = NCCL_TESTS_NAMES[r["op"]]
        perf = {"time": r["time_s_median"] * 1e6, "alg_bw": r["algbw_gbs"], "bus_bw": r["busbw_gbs"], "nwrong": None}
        per_iter = {"min_us": r["time_s_min"] * 1e6, "max_us": r["time_s_max"] * 1e6,
                    "p50_us": r["time_s_median"] * 1e6}
        place = "in_place" if (r.get("impl") or "all_reduce") in IN_PLACE_IMPLS else "out_of_place"
        other = "out_of_place" if place == "in_place" else "in_place"
        results.append({
            "size": r["op_bytes"], "count": r["count"], "type": NCCL_TESTS_TYPES[r["dtype"]], "redop": redop,
            "root": f"{root:6d}", place: perf, f"{place}_per_iter": per_iter, other: None,
            "actual_iterations": r["trials"], "experiment_name": name,
            "detlab": {k: r[k] for k in ("op", "bytes", "digest", "distinct_digests", "ranks_consistent",
                                         "rank_check", "reproducible", "prefix_class", "err_max_abs",
                                         "err_max_ulp", "frac_diff", "impl", "fp_version", "busbw_gbs_min",
                                         "busbw_gbs_max")},
        })
    bws = [r["busbw_gbs"] for r in summary if r["busbw_gbs"] is not None]
    ok, line = verdict(summary)
    sizes = [r["bytes"] for r in summary]
    return {
        "version": 2,
        "start_time": meta.get("start_time"),
        "args": list(meta.get("args", [])),
        "env": list(meta.get("env", [])),
        "nccl_version": meta.get("nccl_version"),
        "config": {
            "nthreads": 1, "ngpus": 1, "nranks": meta.get("world_size"),
            "minimum_bytes": meta.get("min_bytes", min(sizes, default=0)),
            "maximum_bytes": meta.get("max_bytes", max(sizes, default=0)),
            "step_factor": meta.get("step_factor"), "warmup_iters": meta.get("warmup"),
            "iterations": meta.get("trials"), "aggregated_iterations": 1, "validation": 0, "graph": 0,
            "blocking_collectives": "true", "per_iter_timing": "true", "parallel_init": "false",
            "devices": list(meta.get("devices", [])), "backend": meta.get("backend"),
        },
        "results": results,
        "out_of_bounds": {"count": 0, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": sum(bws) / len(bws) if bws else None, "okay": "unchecked"},
        "errors": [],
        "end_time": meta.get("end_time"),
        "detlab": {"reproducible": ok, "verdict": line},
    }


def _num(value: float | None, width: int, fmt: str = ".2f") -> str:
    return f"{'N/A':>{width}}" if value is None else f"{value:>{width}{fmt}}"


def format_table(summary: list[dict[str, Any]]) -> str:
    """nccl-tests-style table (one block per op) with digest columns, ending in a verdict line."""
    head = (f"# {'size':>10}  {'count':>10}  {'type':>8}  {'redop':>6}  {'root':>4}  {'time':>9}  {'algbw':>7}  "
            f"{'busbw':>7}  {'#offref':>7}  {'maxulp':>7}  {'digest':<20}  {'#dig':>4}  {'ranks':>5}  {'pfx':>3}")
    units = (f"# {'(B)':>10}  {'(elems)':>10}  {'':>8}  {'':>6}  {'':>4}  {'(us)':>9}  {'(GB/s)':>7}  "
             f"{'(GB/s)':>7}  {'':>7}  {'':>7}  {'':<20}  {'':>4}  {'':>5}  {'':>3}")
    lines: list[str] = []
    current = None
    for r in summary:
        if r["op"] != current:
            current = r["op"]
            lines += ["#", f"# {current} over {r['world_size']} ranks ({r.get('impl') or current})", head, units]
        name, redop, root = NCCL_TESTS_NAMES[r["op"]]
        offref = None if r["frac_diff"] is None else round(r["frac_diff"] * r["out_elems"])
        digest = str(r["digest"])
        lines.append(
            f"  {r['op_bytes']:>10}  {r['count']:>10}  {NCCL_TESTS_TYPES[r['dtype']]:>8}  {redop:>6}  {root:>4}  "
            f"{_num(r['time_s_median'] * 1e6, 9)}  {_num(r['algbw_gbs'], 7)}  {_num(r['busbw_gbs'], 7)}  "
            f"{'N/A' if offref is None else offref:>7}  {_num(r['err_max_ulp'], 7)}  "
            f"{digest[:20]:<20}  {r['distinct_digests']:>4}  {'ok' if r['ranks_consistent'] else 'DIFF':>5}  "
            f"{r['prefix_class']:>3}")
    ok, line = verdict(summary)
    lines += ["#", "# #offref: elements not equal to the correctly rounded float64 reference (worst rank and trial);",
              "# #dig: distinct digests over trials; pfx: leading-elements class across sizes (0 = smallest size's)",
              f"# verdict: {line}"]
    return "\n".join(lines) + "\n"
