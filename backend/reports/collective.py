"""Results of `collective` and `sweep` jobs: per config × (op, dtype, size) reproducibility and
bandwidth, cross-config bitwise equality, effective-config flags from NCCL logs, and an export."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import CollectiveTrial, CommLog, Job, Run
from detlab.core import collective as stats
from detlab.core import commlog

TRIAL_FIELDS = ("op", "dtype", "bytes", "trial", "rank", "digest", "prefix_digest", "time_s", "err_max_abs",
                "err_max_ulp", "frac_diff", "impl")
Key = tuple[str, str, int]


def load_trials(*, session: Session, runs: list[Run]) -> dict[int, list[dict[str, Any]]]:
    """Trial records by run id, as the plain dicts collective_stats takes."""
    out: dict[int, list[dict[str, Any]]] = {r.id: [] for r in runs}
    world = {r.id: r.world_size for r in runs}
    rows = session.execute(select(CollectiveTrial.run_id, *(getattr(CollectiveTrial, f) for f in TRIAL_FIELDS))
                           .where(CollectiveTrial.run_id.in_(list(out))))
    for run_id, *values in rows:
        out[run_id].append({**dict(zip(TRIAL_FIELDS, values, strict=True)), "world_size": world[run_id]})
    return out


def _pooled(per_run: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    # Fresh processes are one more equivalence class: pool their trials as if one long run.
    return [{**t, "trial": i * 1_000_000 + t["trial"]} for i, trials in enumerate(per_run) for t in trials]


def _outputs(trials: list[dict[str, Any]]) -> dict[Key, dict[int, str]]:
    """Per (op, dtype, bytes): each rank's most frequent output digest."""
    seen: dict[Key, dict[int, Counter[str]]] = {}
    for t in trials:
        seen.setdefault((t["op"], t["dtype"], t["bytes"]), {}).setdefault(t["rank"], Counter())[t["digest"]] += 1
    return {k: {r: c.most_common(1)[0][0] for r, c in ranks.items()} for k, ranks in seen.items()}


def _across_nodes(per_run: list[list[dict[str, Any]]], nodes: list[str | None]) -> dict[Key, int]:
    """Per (op, dtype, size): how many distinct outputs the nodes hold (each node's runs pooled)."""
    by_node: dict[str | None, list[list[dict[str, Any]]]] = {}
    for trials, node in zip(per_run, nodes, strict=True):
        by_node.setdefault(node, []).append(trials)
    outputs = [_outputs(_pooled(group)) for group in by_node.values()]
    keys = {k for o in outputs for k in o}
    return {k: len({tuple(sorted(o[k].items())) for o in outputs if k in o}) for k in keys}


def cell_rows(index: int, per_run: list[list[dict[str, Any]]], world_size: int,
              nodes: list[str | None]) -> list[dict[str, Any]]:
    """One row per (op, dtype, size) of a config, with its equivalence classes: trials in one process,
    fresh processes (runs), nodes, and message sizes (prefix_class)."""
    runs = [stats.summarize(t, world_size) for t in per_run if t]
    across_nodes = _across_nodes(per_run, nodes) if len(set(nodes)) > 1 else {}
    in_process: dict[Key, int] = {}
    for summary in runs:
        for r in summary:
            key = (r["op"], r["dtype"], r["bytes"])
            in_process[key] = max(in_process.get(key, 0), r["distinct_digests"])
    rows = []
    for r in stats.summarize(_pooled(per_run), world_size):
        rows.append({
            "config_index": index, "op": r["op"], "dtype": r["dtype"], "bytes": r["bytes"], "trials": r["trials"],
            "runs": len(runs), "distinct_in_process": in_process.get((r["op"], r["dtype"], r["bytes"])),
            "distinct_across_runs": r["distinct_digests"], "nodes": len(set(nodes)),
            "distinct_across_nodes": across_nodes.get((r["op"], r["dtype"], r["bytes"])),
            "rank_consistent": r["ranks_consistent"],
            "reproducible": r["reproducible"], "time_us": r["time_s_median"] * 1e6, "algbw_gbps": r["algbw_gbs"],
            "busbw_gbps": r["busbw_gbs"], "busbw_spread": [r["busbw_gbs_min"], r["busbw_gbs_max"]],
            "err_max_abs": r["err_max_abs"], "err_max_ulp": r["err_max_ulp"], "frac_diff": r["frac_diff"],
            "prefix_class": r["prefix_class"], "impl": r["impl"], "summary": r,
        })
    return rows


def equality(outputs: list[dict[Key, dict[int, str]]], worlds: list[int]) -> list[dict[str, Any]]:
    """Per (op, dtype, size): config × config, are outputs bitwise equal (None: not comparable)."""
    keys = sorted({k for o in outputs for k in o}, key=lambda k: (k[0], k[1], k[2]))
    out = []
    for key in keys:
        matrix: list[list[bool | None]] = []
        for i, a in enumerate(outputs):
            row: list[bool | None] = []
            for j, b in enumerate(outputs):
                if key not in a or key not in b or (worlds[i] != worlds[j] and key[0] == stats.SCATTERED):
                    row.append(None)
                elif worlds[i] == worlds[j]:
                    row.append(a[key] == b[key])
                else:  # replicated outputs at different world sizes: compare the rank consensus
                    row.append(Counter(a[key].values()).most_common(1)[0][0]
                               == Counter(b[key].values()).most_common(1)[0][0])
            matrix.append(row)
        out.append({"op": key[0], "dtype": key[1], "bytes": key[2], "equal": matrix})
    return out


def build(*, session: Session, job: Job) -> dict[str, Any] | None:
    cfgs = job.configs
    runs = sorted(job.runs, key=lambda r: (r.config_index, r.repeat))
    trials = load_trials(session=session, runs=runs)
    if not any(trials.values()):
        return None
    by_config: dict[int, list[Run]] = {}
    for run in runs:
        by_config.setdefault(run.config_index, []).append(run)
    worlds = [by_config[i][0].world_size if i in by_config else job.world_size for i in range(len(cfgs))]
    cells, outputs, exports = [], [], []
    params = job.params.get("collective") or {}
    for i, config in enumerate(cfgs):
        per_run = [trials[r.id] for r in by_config.get(i, [])]
        rows = cell_rows(i, per_run, worlds[i], [r.node for r in by_config.get(i, [])])
        exports.append({"config": config.name, "env": config.body["env"], **stats.nccl_tests_json(
            [r.pop("summary") for r in rows], {**params, "world_size": worlds[i], "env": sorted(config.body["env"])})})
        cells += rows
        outputs.append(_outputs(_pooled(per_run)))
    logs = list(session.scalars(select(CommLog).where(CommLog.run_id.in_([r.id for r in runs]))
                                .order_by(CommLog.run_id, CommLog.rank)))
    parsed_by_run: dict[int, list[dict[str, Any]]] = {}
    for log in logs:
        parsed_by_run.setdefault(log.run_id, []).append(log.parsed)
    effective = [{"config_index": run.config_index, "run_id": run.id, **flag}
                 for run in runs if run.id in parsed_by_run
                 for flag in commlog.check_effective(run.config.body["env"], parsed_by_run[run.id])]
    run_index = {r.id: r.config_index for r in runs}
    return {
        "world_size": job.world_size,
        "configs": [{"index": i, "name": c.name, "env": c.body["env"]} for i, c in enumerate(cfgs)],
        "cells": cells,
        "equality": equality(outputs, worlds),
        "effective": effective,
        "logs": [{"run_id": log.run_id, "config_index": run_index[log.run_id], "rank": log.rank,
                  "truncated": log.truncated, **{k: log.parsed.get(k) for k in (
                      "library", "version", "nchannels", "transports", "network", "choices", "init_complete")}}
                 for log in logs],
        "note": None if logs else "no NCCL/RCCL logs: the runs used gloo (CPU), so NCCL settings are not verified",
        "export": {"configs": exports},
    }


def verdict(result: dict[str, Any]) -> str | None:
    """The result in one word for the jobs list: reproducible when every cell gave one digest; None without cells."""
    cells = result.get("cells") or []
    return None if not cells else "reproducible" if all(c.get("reproducible") for c in cells) else "not-reproducible"
